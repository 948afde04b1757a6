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

// `value` with fn(tensor) in place of each tensor, also inside a Tensor[] or
// Tensor?[] list (Nones stay).
template <typename F>
c10::IValue mapTensors(const c10::IValue& value, F&& fn) {
  if (value.isTensor()) return fn(value.toTensor());
  if (value.isTensorList()) {
    c10::List<at::Tensor> list;
    for (const at::Tensor& t : value.toTensorList()) list.push_back(fn(t));
    return list;
  }
  if (value.isList()) {
    c10::impl::GenericList list(value.toList().elementType());
    for (const c10::IValue& element : value.toListRef()) list.push_back(mapTensors(element, fn));
    return list;
  }
  return value;
}

}  // namespace poptorch
