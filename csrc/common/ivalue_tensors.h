// Visiting the tensors inside an operator argument or result.
#pragma once

#include <ATen/core/ivalue.h>

namespace poptorch {

// Calls fn(tensor) for `value` if it is a tensor, or for each element of a
// Tensor[] / Tensor?[] list (undefined tensors and Nones included, in order).
template <typename F>
void forEachTensor(const c10::IValue& value, F&& fn) {
  if (value.isTensor()) {
    fn(value.toTensor());
  } else if (value.isTensorList()) {
    for (const at::Tensor& t : value.toTensorList()) fn(t);
  } else if (value.isList()) {
    for (const c10::IValue& element : value.toListRef()) forEachTensor(element, fn);
  }
}

}  // namespace poptorch
