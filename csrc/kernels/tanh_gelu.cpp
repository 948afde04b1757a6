// poptorch::tanh_gelu and its out= overload: GELU's tanh approximation as
// GPT-2 writes it, a chain of eight float32 ops,
//
//   (self * half) * (tanh((self + alpha * (self ** exponent * kappa)) * beta)
//                    + one_alpha * one)
//
// in one pass over the tensor instead of eight (passes::fuseTanhGelu puts it in
// place of the chain; the scalars are the chain's own runtime arguments). Each
// op rounds to float32 as its CPU kernel does, in the same order, and tanh is
// poptorch::tanh's SLEEF tanhf (kernels/tanh.cpp), so a result equals the
// unfused program's bit for bit. This file is compiled without floating-point
// contraction: a multiply followed by an add must stay two roundings (the one
// fused multiply-add is tanh_backward's 1 - t * t, as the CPU's kernel has it).
//
// poptorch::tanh_gelu_backward: the gradient of the chain as autograd records
// it (eleven ops reading the chain's saved intermediates), in one pass over
// the gradient and self that recomputes the intermediates, so a training step
// saves none of them. Each op rounds as the CPU's does, in autograd's order.
//
// The fast paths take exponents 2 and 3 (products, as the CPU's pow kernel
// computes them) and alphas of 1; other values, dtypes and layouts, and
// machines without AVX2, run the chain's ATen ops.
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/add.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/pow.h>
#include <ATen/ops/tanh_backward.h>
#include <immintrin.h>
#include <torch/library.h>

#include "kernels/float_vectors.h"

extern "C" __m256 Sleef_tanhf8_u35avx2(__m256 x);

namespace poptorch::kernels {
namespace {

// The chain's scalars, as float32 (what each op's CPU kernel computes with),
// and the chain on eight floats.
struct Coefficients {
  float half, kappa, beta, one;
  bool cube;  // exponent 3, else 2

  // The chain's intermediates the backward reads: self * half, the tanh and
  // the tanh plus one.
  struct Intermediates {
    __m256 scaled, t, plus_one;
  };

  __attribute__((target("avx2,fma"))) Intermediates intermediates(__m256 x) const {
    const __m256 scaled = _mm256_mul_ps(x, _mm256_set1_ps(half));
    __m256 power = _mm256_mul_ps(x, x);
    if (cube) power = _mm256_mul_ps(power, x);
    const __m256 inner = _mm256_add_ps(x, _mm256_mul_ps(power, _mm256_set1_ps(kappa)));
    const __m256 t = Sleef_tanhf8_u35avx2(_mm256_mul_ps(inner, _mm256_set1_ps(beta)));
    return {scaled, t, _mm256_add_ps(t, _mm256_set1_ps(one))};
  }

  __attribute__((target("avx2,fma"))) __m256 operator()(__m256 x) const {
    const Intermediates i = intermediates(x);
    return _mm256_mul_ps(i.scaled, i.plus_one);
  }
};

// The backward's own scalars (autograd saved them beside the chain's, so they
// are read from its ops) and the backward on eight gradients and inputs.
struct BackwardCoefficients {
  Coefficients forward;
  float beta, kappa, power_factor, half;
  bool square;  // self ** 2 in the power's derivative, else self ** 1

  __attribute__((target("avx2,fma"))) __m256 operator()(__m256 grad, __m256 x) const {
    const Coefficients::Intermediates i = forward.intermediates(x);
    const __m256 grad_plus_one = _mm256_mul_ps(grad, i.scaled);
    const __m256 grad_scaled = _mm256_mul_ps(grad, i.plus_one);
    // tanh_backward: grad * (1 - t * t), the CPU's kernel computing 1 - t * t
    // with one rounding (a fused multiply-add)
    const __m256 grad_u = _mm256_mul_ps(
        grad_plus_one, _mm256_fnmadd_ps(i.t, i.t, _mm256_set1_ps(1.0f)));
    const __m256 grad_inner = _mm256_mul_ps(grad_u, _mm256_set1_ps(beta));
    const __m256 grad_power = _mm256_mul_ps(grad_inner, _mm256_set1_ps(kappa));
    const __m256 power = square ? _mm256_mul_ps(x, x) : x;
    const __m256 grad_x_power =
        _mm256_mul_ps(grad_power, _mm256_mul_ps(power, _mm256_set1_ps(power_factor)));
    const __m256 sum = _mm256_add_ps(grad_inner, grad_x_power);
    return _mm256_add_ps(sum, _mm256_mul_ps(grad_scaled, _mm256_set1_ps(half)));
  }
};

// The chain, op by op, as the unfused program runs it (with poptorch::tanh,
// which passes::useOwnKernels puts in place of a float32 aten::tanh).
at::Tensor chain(const at::Tensor& self, const at::Tensor& half, const at::Scalar& exponent,
                 const at::Tensor& kappa, const at::Scalar& alpha, const at::Tensor& beta,
                 const at::Tensor& one, const at::Scalar& one_alpha) {
  const at::Tensor inner = at::add(self, at::mul(at::pow(self, exponent), kappa), alpha);
  static const auto tanh = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("poptorch::tanh", "")
                               .typed<at::Tensor(const at::Tensor&)>();
  return at::mul(at::mul(self, half), at::add(tanh.call(at::mul(inner, beta)), one, one_alpha));
}

bool isOne(const at::Scalar& s) { return !s.isComplex() && s.toDouble() == 1.0; }

// A float32 value of a host scalar tensor, as a CPU kernel reads it; false if
// it is not one.
bool floatOf(const at::Tensor& t, float& value) {
  if (t.dim() != 0 || !t.is_cpu() || t.is_complex()) return false;
  value = t.item().toFloat();
  return true;
}

// The fast path's coefficients, or false when the values or tensors need the chain.
bool fastPath(const at::Tensor& self, const at::Tensor& half, const at::Scalar& exponent,
              const at::Tensor& kappa, const at::Scalar& alpha, const at::Tensor& beta,
              const at::Tensor& one, const at::Scalar& one_alpha, Coefficients& c) {
  if (!float_vectors::hasAvx2() || self.scalar_type() != at::kFloat || !self.is_contiguous() ||
      exponent.isComplex() || !isOne(alpha) || !isOne(one_alpha)) {
    return false;
  }
  const double e = exponent.toDouble();
  if (e != 2.0 && e != 3.0) return false;
  c.cube = e == 3.0;
  return floatOf(half, c.half) && floatOf(kappa, c.kappa) && floatOf(beta, c.beta) &&
         floatOf(one, c.one);
}

void run(const at::Tensor& self, at::Tensor& out, const Coefficients& c) {
  float_vectors::map(self.const_data_ptr<float>(), out.mutable_data_ptr<float>(), self.numel(), c);
}

at::Tensor& tanhGeluOut(const at::Tensor& self, const at::Tensor& half, const at::Scalar& exponent,
                        const at::Tensor& kappa, const at::Scalar& alpha, const at::Tensor& beta,
                        const at::Tensor& one, const at::Scalar& one_alpha, at::Tensor& out) {
  Coefficients c{};
  if (fastPath(self, half, exponent, kappa, alpha, beta, one, one_alpha, c) &&
      out.scalar_type() == at::kFloat) {
    at::native::resize_output(out, self.sizes());
    if (out.is_contiguous() && float_vectors::sameOrDisjoint(self, out)) {
      run(self, out, c);
      return out;
    }
  }
  const at::Tensor result = chain(self, half, exponent, kappa, alpha, beta, one, one_alpha);
  at::native::resize_output(out, result.sizes());
  return out.copy_(result);
}

at::Tensor tanhGelu(const at::Tensor& self, const at::Tensor& half, const at::Scalar& exponent,
                    const at::Tensor& kappa, const at::Scalar& alpha, const at::Tensor& beta,
                    const at::Tensor& one, const at::Scalar& one_alpha) {
  Coefficients c{};
  if (!fastPath(self, half, exponent, kappa, alpha, beta, one, one_alpha, c)) {
    return chain(self, half, exponent, kappa, alpha, beta, one, one_alpha);
  }
  at::Tensor out = at::empty_like(self, at::MemoryFormat::Contiguous);
  run(self, out, c);
  return out;
}

at::Tensor tanhGeluMeta(const at::Tensor& self, const at::Tensor&, const at::Scalar&,
                        const at::Tensor&, const at::Scalar&, const at::Tensor&, const at::Tensor&,
                        const at::Scalar&) {
  return at::empty_like(self, at::MemoryFormat::Contiguous);
}

at::Tensor& tanhGeluOutMeta(const at::Tensor& self, const at::Tensor&, const at::Scalar&,
                            const at::Tensor&, const at::Scalar&, const at::Tensor&,
                            const at::Tensor&, const at::Scalar&, at::Tensor& out) {
  at::native::resize_output(out, self.sizes());
  return out;
}

// The backward, op by op, as autograd records it for the chain.
at::Tensor chainBackward(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& half,
                         const at::Scalar& exponent, const at::Tensor& kappa,
                         const at::Scalar& alpha, const at::Tensor& beta, const at::Tensor& one,
                         const at::Scalar& one_alpha, const at::Tensor& beta_grad,
                         const at::Tensor& kappa_grad, const at::Scalar& power_exponent,
                         const at::Tensor& power_factor, const at::Scalar& power_alpha,
                         const at::Tensor& half_grad, const at::Scalar& half_alpha) {
  static const auto tanh = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("poptorch::tanh", "")
                               .typed<at::Tensor(const at::Tensor&)>();
  const at::Tensor scaled = at::mul(self, half);
  const at::Tensor inner = at::add(self, at::mul(at::pow(self, exponent), kappa), alpha);
  const at::Tensor t = tanh.call(at::mul(inner, beta));
  const at::Tensor plus_one = at::add(t, one, one_alpha);
  const at::Tensor grad_plus_one = at::mul(grad, scaled);
  const at::Tensor grad_scaled = at::mul(grad, plus_one);
  at::Tensor result = at::mul(at::tanh_backward(grad_plus_one, t), beta_grad);
  const at::Tensor grad_power = at::mul(result, kappa_grad);
  result.add_(at::mul(grad_power, at::mul(at::pow(self, power_exponent), power_factor)),
              power_alpha);
  return result.add_(at::mul(grad_scaled, half_grad), half_alpha);
}

at::Tensor tanhGeluBackward(const at::Tensor& grad, const at::Tensor& self,
                            const at::Tensor& half, const at::Scalar& exponent,
                            const at::Tensor& kappa, const at::Scalar& alpha,
                            const at::Tensor& beta, const at::Tensor& one,
                            const at::Scalar& one_alpha, const at::Tensor& beta_grad,
                            const at::Tensor& kappa_grad, const at::Scalar& power_exponent,
                            const at::Tensor& power_factor, const at::Scalar& power_alpha,
                            const at::Tensor& half_grad, const at::Scalar& half_alpha) {
  BackwardCoefficients c{};
  const bool fast =
      fastPath(self, half, exponent, kappa, alpha, beta, one, one_alpha, c.forward) &&
      grad.scalar_type() == at::kFloat && grad.is_contiguous() && grad.sizes() == self.sizes() &&
      !power_exponent.isComplex() &&
      power_exponent.toDouble() == (c.forward.cube ? 2.0 : 1.0) && isOne(power_alpha) &&
      isOne(half_alpha) && floatOf(beta_grad, c.beta) && floatOf(kappa_grad, c.kappa) &&
      floatOf(power_factor, c.power_factor) && floatOf(half_grad, c.half);
  if (!fast) {
    return chainBackward(grad, self, half, exponent, kappa, alpha, beta, one, one_alpha,
                         beta_grad, kappa_grad, power_exponent, power_factor, power_alpha,
                         half_grad, half_alpha);
  }
  c.square = c.forward.cube;
  at::Tensor out = at::empty_like(self, at::MemoryFormat::Contiguous);
  float_vectors::map2(grad.const_data_ptr<float>(), self.const_data_ptr<float>(),
                      out.mutable_data_ptr<float>(), self.numel(), c);
  return out;
}

at::Tensor tanhGeluBackwardMeta(const at::Tensor&, const at::Tensor& self, const at::Tensor&,
                                const at::Scalar&, const at::Tensor&, const at::Scalar&,
                                const at::Tensor&, const at::Tensor&, const at::Scalar&,
                                const at::Tensor&, const at::Tensor&, const at::Scalar&,
                                const at::Tensor&, const at::Scalar&, const at::Tensor&,
                                const at::Scalar&) {
  return at::empty_like(self, at::MemoryFormat::Contiguous);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(poptorch, m) {
  m.def(
      "tanh_gelu(Tensor self, Tensor half, Scalar exponent, Tensor kappa, Scalar alpha, "
      "Tensor beta, Tensor one, Scalar one_alpha) -> Tensor");
  m.def(
      "tanh_gelu.out(Tensor self, Tensor half, Scalar exponent, Tensor kappa, Scalar alpha, "
      "Tensor beta, Tensor one, Scalar one_alpha, *, Tensor(a!) out) -> Tensor(a!)");
  m.def(
      "tanh_gelu_backward(Tensor grad, Tensor self, Tensor half, Scalar exponent, Tensor kappa, "
      "Scalar alpha, Tensor beta, Tensor one, Scalar one_alpha, Tensor beta_grad, "
      "Tensor kappa_grad, Scalar power_exponent, Tensor power_factor, Scalar power_alpha, "
      "Tensor half_grad, Scalar half_alpha) -> Tensor");
}

TORCH_LIBRARY_IMPL(poptorch, CPU, m) {
  m.impl("tanh_gelu", TORCH_FN(tanhGelu));
  m.impl("tanh_gelu.out", TORCH_FN(tanhGeluOut));
  m.impl("tanh_gelu_backward", TORCH_FN(tanhGeluBackward));
}

TORCH_LIBRARY_IMPL(poptorch, Meta, m) {
  m.impl("tanh_gelu", TORCH_FN(tanhGeluMeta));
  m.impl("tanh_gelu.out", TORCH_FN(tanhGeluOutMeta));
  m.impl("tanh_gelu_backward", TORCH_FN(tanhGeluBackwardMeta));
}

}  // namespace poptorch::kernels
