// torch.autocast("ipu"): PyTorch's automatic mixed precision on the AutocastIPU key.
//
// PyTorch lists IPU among its autocast devices (torch.autocast("ipu", dtype=...) sets the
// dtype and enables the key) but registers no kernels for it. The op lists and cast policies
// are PyTorch's own (ATen/autocast_mode.h publishes them for backends to reuse, as CUDA and
// PrivateUse1 backends do), so ops on ipu tensors are cast exactly as on CUDA: matmuls and
// convolutions to the autocast dtype, reductions, losses and pointwise ops that lose precision
// to float32, and ops with several inputs to the widest. Casts happen above autograd, so the
// backward runs in the dtype the forward chose.
#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace poptorch::capture {
namespace {

// PyTorch's op lists spell the signatures of their redispatches unqualified.
using at::IntArrayRef;
using at::Scalar;
using at::ScalarType;
using at::Tensor;

at::Tensor binaryCrossEntropyBanned(const at::Tensor&, const at::Tensor&,
                                    const std::optional<at::Tensor>&, int64_t) {
  TORCH_CHECK(false,
              "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to "
              "autocast.\nMany models use a sigmoid layer right before the binary cross entropy "
              "layer.\nIn this case, combine the two layers using "
              "torch.nn.functional.binary_cross_entropy_with_logits\nor torch.nn.BCEWithLogitsLoss."
              "  binary_cross_entropy_with_logits and BCEWithLogits are\nsafe to autocast.");
}

// Ops without a policy run unchanged.
TORCH_LIBRARY_IMPL(_, AutocastIPU, m) { m.fallback(torch::CppFunction::makeFallthrough()); }

TORCH_LIBRARY_IMPL(aten, AutocastIPU, m) {
#define POPTORCH_AUTOCAST_IPU(...) KERNEL(c10::DeviceType::IPU, __VA_ARGS__)
#define POPTORCH_LOWER_PRECISION_FP(...) POPTORCH_AUTOCAST_IPU(__VA_ARGS__, lower_precision_fp)
#define POPTORCH_FP32(...) POPTORCH_AUTOCAST_IPU(__VA_ARGS__, fp32)
#define POPTORCH_FP32_SET_OPT_DTYPE(...) POPTORCH_AUTOCAST_IPU(__VA_ARGS__, fp32_set_opt_dtype)
#define POPTORCH_PROMOTE(...) POPTORCH_AUTOCAST_IPU(__VA_ARGS__, promote)
#define POPTORCH_FP32_APPEND_DTYPE(REDISPATCH_FUNC, REGISTER_NAME, REGISTER_SIGNATURE,        \
                                   REDISPATCH_SIGNATURE, POLICY)                              \
  KERNEL_DIFFERENT_REDISPATCH_SIGNATURE(c10::DeviceType::IPU, REDISPATCH_FUNC, REGISTER_NAME, \
                                        REGISTER_SIGNATURE, REDISPATCH_SIGNATURE, POLICY)

  AT_FORALL_LOWER_PRECISION_FP(POPTORCH_LOWER_PRECISION_FP)
  AT_FORALL_FP32(POPTORCH_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(POPTORCH_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(POPTORCH_FP32_APPEND_DTYPE)
  AT_FORALL_PROMOTE(POPTORCH_PROMOTE)

#undef POPTORCH_FP32_APPEND_DTYPE
#undef POPTORCH_PROMOTE
#undef POPTORCH_FP32_SET_OPT_DTYPE
#undef POPTORCH_FP32
#undef POPTORCH_LOWER_PRECISION_FP
#undef POPTORCH_AUTOCAST_IPU

  m.impl(TORCH_SELECTIVE_NAME("aten::binary_cross_entropy"), TORCH_FN(binaryCrossEntropyBanned));
}

}  // namespace
}  // namespace poptorch::capture
