// torch.histc of integer tensors on the ipu, as CUDA computes it.
//
// The CPU's histc takes floating types only ("histogram_cpu" not implemented
// for 'Int'); CUDA's takes integers too. Hugging Face's mixture-of-experts
// layers (Mixtral, Qwen-MoE, ...) count the tokens routed to each expert with
// an int32 histc on every device but the CPU and MPS, so on the ipu they
// failed. Integers are counted here with CUDA's rule (SummaryOps.cu): bounds in
// int64, min == max takes the data's range, an empty range widens by one on
// each side, bin = (v - min) * bins / (max - min) with the last bin closed,
// values outside [min, max] dropped, the counts in the input's dtype. It is
// written with aten ops, which capture as any other (no value is read on the
// host); floating types keep the CPU's kernel.
#include <ATen/ATen.h>
#include <ATen/core/stack.h>
#include <torch/library.h>

#include "capture/capture.h"

namespace poptorch::capture {
namespace {

at::Tensor integerHistc(const at::Tensor& self, int64_t bins, const c10::Scalar& min,
                        const c10::Scalar& max) {
  // The CPU's words for what CUDA also refuses.
  TORCH_CHECK(bins > 0, "torch.histogram(): bins must be > 0, but got ", bins,
              " for dimension 0");
  const int64_t low_bound = min.toLong();
  const int64_t high_bound = max.toLong();
  TORCH_CHECK(low_bound <= high_bound, "torch.histc: max must be larger than min");
  const at::Tensor values = self.reshape({-1}).to(at::kLong);
  at::Tensor low = at::scalar_tensor(low_bound, values.options());
  at::Tensor high = at::scalar_tensor(high_bound, values.options());
  if (low_bound == high_bound && values.numel() > 0) {
    low = values.min();
    high = values.max();
  }
  const at::Tensor empty_range = low.eq(high).to(at::kLong);
  low = low - empty_range;
  high = high + empty_range;
  const at::Tensor inside = values.ge(low).logical_and(values.le(high));
  // (v - min) * bins / (max - min) truncates as CUDA's integer division does
  // (v >= min inside the range); v == max lands in the last bin.
  at::Tensor bin = ((values - low) * bins).div(high - low, "floor").clamp_max(bins - 1);
  // Values outside the range go to an extra bin, dropped at the end.
  bin = at::where(inside, bin, at::scalar_tensor(bins, values.options()));
  at::Tensor counts = at::zeros({bins + 1}, values.options());
  counts.scatter_add_(0, bin, at::ones_like(bin));
  return counts.narrow(0, 0, bins).to(self.scalar_type());
}

void histc(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const size_t first = stack->size() - 4;  // self, bins, min, max
  const at::Tensor self = (*stack)[first].toTensor();
  if (!c10::isIntegralType(self.scalar_type(), /*includeBool=*/false)) {
    ipuFallback(op, keys, stack);  // the CPU's kernel
    return;
  }
  at::Tensor result = integerHistc(self, (*stack)[first + 1].toInt(),
                                   (*stack)[first + 2].toScalar(), (*stack)[first + 3].toScalar());
  torch::jit::drop(*stack, 4);
  torch::jit::push(*stack, std::move(result));
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, IPU, m) {
  m.impl("histc", torch::CppFunction::makeFromBoxedFunction<&histc>());
}

}  // namespace poptorch::capture
