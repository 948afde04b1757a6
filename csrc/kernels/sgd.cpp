// poptorch::sgd_momentum_: the SGD update of one parameter with momentum in a
// single pass over its elements, where the same rule written with ATen ops
// (poptorch/_update_rules.py) makes three passes (scale the buffer, add the
// gradient, step the parameter) plus small ops for the step counter and the
// coefficients. A training step's update is memory-bound: each pass streams
// the parameter-sized tensors through the cache again.
// poptorch::torch_sgd_momentum_: the same pass for torch.optim.SGD's rule (no
// step counter, lr and momentum constants), which the dynamo backend puts in
// place of the three ops dynamo traces (poptorch/_dynamo_sgd.py).
//
// The op has a CPU kernel (what a replayed graph runs, and the host step of
// poptorch.optim), a Meta kernel (so that capture records it as one node) and
// an ADInplaceOrView kernel (version counters of what it writes).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/library.h>

#include "kernels/float_vectors.h"

namespace poptorch::kernels {
namespace {

void checkScalar(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.numel() == 1 && t.scalar_type() == at::kFloat, "sgd_momentum_: ", name,
              " must be a float32 tensor of one element, got ", t.scalar_type(), " of shape ",
              t.sizes());
}

void checkTensors(const char* op, const at::Tensor& param, const at::Tensor& buffer,
                  const at::Tensor& grad) {
  // The gradient may come in another layout (a temporary the runtime keeps
  // channels-last, see compiler::Executable::flexible_layout).
  for (const at::Tensor* t : {&param, &buffer, &grad}) {
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->sizes().equals(param.sizes()) &&
                    (t == &grad || t->is_contiguous()),
                op,
                ": the parameter, its momentum buffer and its gradient must be "
                "float32 tensors of one shape, the first two contiguous, got ",
                t->scalar_type(), " of shape ", t->sizes(), " and strides ", t->strides(),
                " for a parameter of shape ", param.sizes());
  }
}

void checkArguments(const at::Tensor& param, const at::Tensor& buffer, const at::Tensor& step,
                    const at::Tensor& grad, const at::Tensor& lr, const at::Tensor& momentum,
                    const std::optional<at::Tensor>& weight_decay) {
  checkTensors("sgd_momentum_", param, buffer, grad);
  checkScalar(step, "step");
  checkScalar(lr, "lr");
  checkScalar(momentum, "momentum");
  if (weight_decay) checkScalar(*weight_decay, "weight_decay");
}

float valueOf(const at::Tensor& scalar) { return *scalar.const_data_ptr<float>(); }

struct SgdCoefficients {
  float momentum;
  float weight_decay;  // 0 without decay
  float velocity_scaling;
  float neg_lr;
  float buffer_step;        // -lr / vs: what the buffer adds to p without Nesterov
  float nesterov_momentum;  // m / vs
  bool decay;
  bool nesterov;
};

// The rule of _update_rules._sgd without dampening, on elements [0, n):
//   g' = g + wd p;  buf = m buf + vs g';
//   p -= lr (g' + m / vs buf)  (Nesterov)  or  p -= lr / vs buf.
// Compiled twice, for AVX2 (as torch's own kernels are) and for any x86-64;
// the loader picks one for the machine.
__attribute__((target_clones("arch=x86-64-v3", "default"))) void sgdRange(
    const SgdCoefficients& c, int64_t n, float* __restrict p, float* __restrict b,
    const float* __restrict g) {
  const float m = c.momentum, wd = c.weight_decay, vs = c.velocity_scaling;
  // One loop per case, so that each vectorises without branches inside.
  if (c.nesterov) {
    for (int64_t i = 0; i < n; ++i) {
      const float gi = c.decay ? g[i] + wd * p[i] : g[i];
      const float bi = b[i] * m + vs * gi;
      b[i] = bi;
      p[i] += c.neg_lr * (gi + c.nesterov_momentum * bi);
    }
  } else if (c.decay) {
    for (int64_t i = 0; i < n; ++i) {
      const float bi = b[i] * m + vs * (g[i] + wd * p[i]);
      b[i] = bi;
      p[i] += c.buffer_step * bi;
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      const float bi = b[i] * m + vs * g[i];
      b[i] = bi;
      p[i] += c.buffer_step * bi;
    }
  }
}

void sgdUpdate(const SgdCoefficients& c, const at::Tensor& param, const at::Tensor& buffer,
               const at::Tensor& grad) {
  float* p = param.mutable_data_ptr<float>();
  float* b = buffer.mutable_data_ptr<float>();
  const at::Tensor contiguous_grad = grad.contiguous();
  const float* g = contiguous_grad.const_data_ptr<float>();
  at::parallel_for(0, param.numel(), float_vectors::kGrain, [&](int64_t begin, int64_t end) {
    sgdRange(c, end - begin, p + begin, b + begin, g + begin);
  });
}

void sgdMomentumCpu(const at::Tensor& param, const at::Tensor& buffer, const at::Tensor& step,
                    const at::Tensor& grad, const at::Tensor& lr, const at::Tensor& momentum,
                    const std::optional<at::Tensor>& weight_decay, double velocity_scaling,
                    bool nesterov) {
  checkArguments(param, buffer, step, grad, lr, momentum, weight_decay);
  SgdCoefficients c;
  c.momentum = valueOf(momentum);
  c.decay = weight_decay.has_value();
  c.weight_decay = c.decay ? valueOf(*weight_decay) : 0.0f;
  c.velocity_scaling = static_cast<float>(velocity_scaling);
  c.neg_lr = -valueOf(lr);
  c.buffer_step = c.neg_lr / c.velocity_scaling;
  c.nesterov_momentum = c.momentum / c.velocity_scaling;
  c.nesterov = nesterov;
  sgdUpdate(c, param, buffer, grad);
  *step.mutable_data_ptr<float>() += 1.0f;
}

// torch.optim.SGD's update with momentum, without dampening or Nesterov, in one
// pass: buf = m buf + g; p -= lr buf (weight decay is in the gradient it gets). Its three ATen ops
// (buf.mul_, add_, p.add_) are what the dynamo backend puts this in place of
// (poptorch/_dynamo_sgd.py); lr and m are the constants dynamo traced them with.
void torchSgdMomentumCpu(const at::Tensor& param, const at::Tensor& buffer, const at::Tensor& grad,
                         double lr, double momentum) {
  checkTensors("torch_sgd_momentum_", param, buffer, grad);
  SgdCoefficients c{};
  c.momentum = static_cast<float>(momentum);
  c.velocity_scaling = 1.0f;
  c.neg_lr = static_cast<float>(-lr);
  c.buffer_step = c.neg_lr;
  sgdUpdate(c, param, buffer, grad);
}

void torchSgdMomentumMeta(const at::Tensor& param, const at::Tensor& buffer, const at::Tensor& grad,
                          double /*lr*/, double /*momentum*/) {
  checkTensors("torch_sgd_momentum_", param, buffer, grad);
}

// Capture needs only the checks: the op returns nothing and changes no shape.
void sgdMomentumMeta(const at::Tensor& param, const at::Tensor& buffer, const at::Tensor& step,
                     const at::Tensor& grad, const at::Tensor& lr, const at::Tensor& momentum,
                     const std::optional<at::Tensor>& weight_decay, double /*velocity_scaling*/,
                     bool /*nesterov*/) {
  checkArguments(param, buffer, step, grad, lr, momentum, weight_decay);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(poptorch, m) {
  m.def(
      "sgd_momentum_(Tensor(a!) param, Tensor(b!) momentum_buffer, Tensor(c!) step, "
      "Tensor grad, Tensor lr, Tensor momentum, Tensor? weight_decay, float velocity_scaling, "
      "bool nesterov) -> ()");
  m.def(
      "torch_sgd_momentum_(Tensor(a!) param, Tensor(b!) momentum_buffer, Tensor grad, float lr, "
      "float momentum) -> ()");
}

TORCH_LIBRARY_IMPL(poptorch, CPU, m) {
  m.impl("sgd_momentum_", TORCH_FN(sgdMomentumCpu));
  m.impl("torch_sgd_momentum_", TORCH_FN(torchSgdMomentumCpu));
}

TORCH_LIBRARY_IMPL(poptorch, Meta, m) {
  m.impl("sgd_momentum_", TORCH_FN(sgdMomentumMeta));
  m.impl("torch_sgd_momentum_", TORCH_FN(torchSgdMomentumMeta));
}

TORCH_LIBRARY_IMPL(poptorch, ADInplaceOrView, m) {
  m.impl("sgd_momentum_", torch::autograd::autogradNotImplementedInplaceOrViewFallback());
  m.impl("torch_sgd_momentum_", torch::autograd::autogradNotImplementedInplaceOrViewFallback());
}

}  // namespace poptorch::kernels
