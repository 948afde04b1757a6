// Ipu tensors are strided. Sparse tensors, quantized tensors, and nested
// tensors of the strided layout (PyTorch's NestedTensorImpl takes CPU, CUDA,
// XPU, HPU and PrivateUse1 storages only), cannot live on the ipu: the ops
// that would make them are refused (poptorch.UnsupportedError) with an error
// that names the op and says what to do, rather than PyTorch's message about a
// missing SparseIPU or QuantizedIPU kernel, a device its constructors do not
// know, a failed INTERNAL ASSERT, or a quantized CPU tensor returned by
// `.to("ipu")`. Nested tensors of the jagged layout hold strided ipu tensors,
// and work.
#include <torch/library.h>

#include <string>
#include <unordered_set>

#include "capture/capture.h"
#include "common/user_errors.h"

namespace poptorch::capture {
namespace {

enum class Refused { kSparse, kNested };

[[noreturn]] void refuse(const std::string& op, Refused what) {
  if (what == Refused::kSparse) {
    raiseUserError(UserError::kUnsupported,
                   op + ": sparse tensors are not supported on the ipu (ipu tensors are "
                        "strided only); keep sparse tensors on the CPU, or move t.to_dense() "
                        "to the ipu");
  }
  raiseUserError(UserError::kUnsupported,
                 op + ": nested tensors of the strided layout are not supported on the ipu; "
                      "make them with layout=torch.jagged (torch.nested.nested_tensor(tensors, "
                      "layout=torch.jagged)), which holds ipu tensors");
}

// The ops that make strided nested tensors from dense ones. They reach the
// IPU key with ipu arguments (or a device="ipu" argument) and would run on
// the host, failing as they copy their result back.
bool makesStridedNested(const std::string& name) {
  static const std::unordered_set<std::string> kNames = {
      "aten::_nested_tensor_from_tensor_list",
      "aten::_nested_tensor_from_mask",
      "aten::_nested_from_padded",
      "aten::_nested_from_padded_and_nested_example",
      "aten::_nested_view_from_buffer",
      "aten::_nested_view_from_buffer_copy",
  };
  return kNames.count(name) > 0;
}

void sparseFallback(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack*) {
  refuse(opName(op), Refused::kSparse);
}

void quantizedFallback(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack*) {
  refuseQuantized(opName(op));
}

void nestedFallback(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack*) {
  refuse(opName(op), Refused::kNested);
}

}  // namespace

void refuseQuantized(const std::string& op) {
  raiseUserError(UserError::kUnsupported,
                 op + ": quantized tensors are not supported on the ipu; keep them and the "
                      "quantized ops on the CPU, or move q.dequantize() (or q.int_repr()) to "
                      "the ipu");
}

void checkResultIsStrided(const c10::OperatorHandle& op) {
  const std::string& name = op.operator_name().name;
  // to_sparse, to_sparse_csr, to_sparse_bsr...
  if (name.rfind("aten::_to_sparse", 0) == 0) refuse(opName(op), Refused::kSparse);
  if (makesStridedNested(name)) refuse(opName(op), Refused::kNested);
}

TORCH_LIBRARY_IMPL(_, SparseIPU, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&sparseFallback>());
}
TORCH_LIBRARY_IMPL(_, SparseCsrIPU, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&sparseFallback>());
}
TORCH_LIBRARY_IMPL(_, QuantizedIPU, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&quantizedFallback>());
}
// `.to("ipu")` of a quantized host tensor: _to_copy's BackendSelect kernel adds
// the target's backend to the tensor's keys, which makes QuantizedIPU. There
// PyTorch's generic kernel (registered for every key, so before the fallback)
// made the copy with the tensor's quantizer, on the CPU: the call returned a
// quantized CPU tensor without a word.
TORCH_LIBRARY_IMPL(aten, QuantizedIPU, m) {
  m.impl("_to_copy", torch::CppFunction::makeFromBoxedFunction<&quantizedFallback>());
}
TORCH_LIBRARY_IMPL(_, NestedTensorIPU, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&nestedFallback>());
}

// torch.nested.nested_tensor/as_nested_tensor's op has one generic kernel for
// every device, which makes the NestedTensorImpl of ipu tensors itself (and
// fails its assert); it never reaches the IPU key's fallback.
TORCH_LIBRARY_IMPL(aten, IPU, m) {
  m.impl("_nested_tensor_from_tensor_list",
         torch::CppFunction::makeFromBoxedFunction<&nestedFallback>());
}

}  // namespace poptorch::capture
