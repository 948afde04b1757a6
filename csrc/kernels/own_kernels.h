// The ops poptorch's own kernels (this directory) register as poptorch::<name>:
// one table that the rest of the engine reads, so that adding a kernel is one
// line here beside its file.
//
// Every one computes on its arguments only (ir::Node::hasHostEffects: the
// passes may drop, merge or reorder it as an aten op). Some stand in for an
// aten op with the same arguments and results (passes::useOwnKernels puts them
// in place of a float32 one); of those, some replace an aten op that has only a
// generic kernel, which capture must then record whole instead of running its
// decomposition (capture/kernels.cpp).
#pragma once

#include <string_view>

namespace poptorch::kernels {

struct OwnKernel {
  std::string_view name;        // poptorch::<name>, overload ""
  std::string_view stands_for;  // aten::<stands_for>, overload "", or "" for none
  bool aten_captured_whole;     // capture records aten::<stands_for> whole
};

inline constexpr OwnKernel kOwnKernels[] = {
    {"sgd_momentum_", "", false},
    {"torch_sgd_momentum_", "", false},
    {"bernoulli_", "", false},
    {"tanh", "tanh", false},
    {"tanh_gelu", "", false},
    {"tanh_gelu_backward", "", false},
    {"max_pool2d_with_indices", "max_pool2d_with_indices", false},
    {"max_pool2d_with_indices_backward", "max_pool2d_with_indices_backward", false},
    {"_safe_softmax", "_safe_softmax", true},
    {"convolution", "convolution", false},
    {"convolution_backward", "convolution_backward", false},
};

// Whether `qualified` ("poptorch::tanh") names one of the kernels above.
inline bool isOwnKernel(std::string_view qualified) {
  constexpr std::string_view kNamespace = "poptorch::";
  if (qualified.substr(0, kNamespace.size()) != kNamespace) return false;
  qualified.remove_prefix(kNamespace.size());
  for (const OwnKernel& kernel : kOwnKernels) {
    if (kernel.name == qualified) return true;
  }
  return false;
}

// Whether capture records aten::<name> (overload "") whole for a kernel above.
inline bool atenCapturedWhole(std::string_view qualified) {
  constexpr std::string_view kNamespace = "aten::";
  if (qualified.substr(0, kNamespace.size()) != kNamespace) return false;
  qualified.remove_prefix(kNamespace.size());
  for (const OwnKernel& kernel : kOwnKernels) {
    if (kernel.aten_captured_whole && kernel.stands_for == qualified) return true;
  }
  return false;
}

}  // namespace poptorch::kernels
