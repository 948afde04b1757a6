// Capture without boxing: the hottest operators get an unboxed ipu kernel
// that hands its arguments to capture borrowed. The boxed fallback copies each
// tensor argument into an IValue, and a copy that takes a tensor Python holds
// from one reference to two makes PyTorch take the GIL to incref its Python
// object (and again to decref it): ~1.2 k instructions per tensor argument, on
// a path of ~15 k per op.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/util/MaybeOwned.h>
#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include <optional>
#include <vector>

namespace poptorch::capture {

// An unboxed call's arguments as IValues, its tensors borrowed (+0
// references): valid while the call's arguments are, never assigned to, and
// released without a decref when this goes.
class BorrowedArguments {
 public:
  template <class... Args>
  explicit BorrowedArguments(const Args&... args) {
    (push(args), ...);
  }
  ~BorrowedArguments();
  BorrowedArguments(const BorrowedArguments&) = delete;
  BorrowedArguments& operator=(const BorrowedArguments&) = delete;

  c10::ArrayRef<c10::IValue> values() const { return values_; }

 private:
  void push(const at::Tensor& tensor);
  void push(const std::optional<at::Tensor>& tensor);
  template <class T>
  void push(const T& value) {
    values_.emplace_back(value);
    borrowed_.push_back(false);
  }

  // Inline, as no hot operator has more than eight arguments: no allocation per call.
  c10::SmallVector<c10::IValue, 8> values_;
  c10::SmallVector<bool, 8> borrowed_;
};

// Registers the unboxed capture kernels on the IPU key of `library` (aten).
void registerUnboxedKernels(torch::Library& library);

}  // namespace poptorch::capture
