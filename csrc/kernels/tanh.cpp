// poptorch::tanh(self) and poptorch::tanh.out: tanh of a float32 tensor with
// SLEEF's vectorised tanhf (error bound 3.5 ulp; measured at most ~2 ulp),
// eight elements per AVX2 pass, split over threads as ATen splits unary ops.
//
// PyTorch's CPU tanh of a contiguous float32 tensor calls MKL's VML vsTanh,
// which on this machine's AMD CPU runs a generic code path: 3.4 ns an element
// on one thread, where the products, adds and multiplies around it take
// ~0.15 ns. GPT-2's GELU (tanh approximation, written as a chain of ops) spent
// a tenth of an inference step in it. SLEEF's 3.5-ulp tanhf (the library
// PyTorch itself uses for vectorised tanh) runs it in ~1.1 ns. Results are
// within float32's tolerance of the CPU's (torch.testing.assert_close), not
// bit-identical; passes::useOwnKernels puts this op in place of aten::tanh.
//
// Other dtypes, machines without AVX2 and layouts other than one dense block
// shared by input and output run PyTorch's own tanh.
#include <ATen/core/Tensor.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/tanh.h>
#include <immintrin.h>
#include <torch/library.h>

#include "kernels/float_vectors.h"

extern "C" __m256 Sleef_tanhf8_u35avx2(__m256 x);

namespace poptorch::kernels {
namespace {

using float_vectors::hasAvx2;

struct Tanh {
  __attribute__((target("avx2,fma"))) __m256 operator()(__m256 x) const {
    return Sleef_tanhf8_u35avx2(x);
  }
};

// True when `self` and `out` are float32 blocks of one layout that the fast
// path can treat as flat arrays.
bool fastPathApplies(const at::Tensor& self, const at::Tensor& out) {
  return hasAvx2() && self.scalar_type() == at::kFloat && out.scalar_type() == at::kFloat &&
         self.is_non_overlapping_and_dense() && out.sizes().equals(self.sizes()) &&
         out.strides().equals(self.strides()) && self.storage_offset() >= 0;
}

void fastTanh(const at::Tensor& self, at::Tensor& out) {
  float_vectors::map(self.const_data_ptr<float>(), out.mutable_data_ptr<float>(), self.numel(),
                     Tanh{});
}

at::Tensor& tanhOut(const at::Tensor& self, at::Tensor& out) {
  if (self.scalar_type() == at::kFloat && out.scalar_type() == at::kFloat && hasAvx2()) {
    at::native::resize_output(out, self.sizes());
    if (fastPathApplies(self, out) && float_vectors::sameOrDisjoint(self, out)) {
      fastTanh(self, out);
      return out;
    }
  }
  return at::tanh_out(out, self);
}

at::Tensor tanhFunctional(const at::Tensor& self) {
  if (self.scalar_type() != at::kFloat || !hasAvx2() || !self.is_non_overlapping_and_dense()) {
    return at::tanh(self);
  }
  at::Tensor out = at::empty_like(self);  // self's layout: one dense block, same strides
  if (!fastPathApplies(self, out)) return at::tanh(self);
  fastTanh(self, out);
  return out;
}

at::Tensor tanhMeta(const at::Tensor& self) { return at::empty_like(self); }

at::Tensor& tanhOutMeta(const at::Tensor& self, at::Tensor& out) {
  at::native::resize_output(out, self.sizes());
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(poptorch, m) {
  m.def("tanh(Tensor self) -> Tensor");
  m.def("tanh.out(Tensor self, *, Tensor(a!) out) -> Tensor(a!)");
}

TORCH_LIBRARY_IMPL(poptorch, CPU, m) {
  m.impl("tanh", TORCH_FN(tanhFunctional));
  m.impl("tanh.out", TORCH_FN(tanhOut));
}

TORCH_LIBRARY_IMPL(poptorch, Meta, m) {
  m.impl("tanh", TORCH_FN(tanhMeta));
  m.impl("tanh.out", TORCH_FN(tanhOutMeta));
}

}  // namespace poptorch::kernels
