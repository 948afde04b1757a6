// Where PyTorch's Meta kernels (2.13) disagree with the CPU kernels the ipu
// runs: the arguments a Meta kernel is given, and the layouts it answers,
// aligned with what the CPU kernel does. Capture (meta_inference.cpp) infers
// an op's results from its Meta kernel, so each disagreement would be an ipu
// result of another shape, dtype or strides than the CPU's.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include "capture/meta_inference.h"

namespace poptorch::capture {

// Arguments on which a PyTorch Meta kernel disagrees with the CPU kernel,
// rewritten (in `meta_args`, the Meta kernel's) to ones that mean the same to
// the CPU.
void alignWithCpuKernel(const c10::OperatorHandle& op, torch::jit::Stack& meta_args);

// An out= tensor that a pointwise (TensorIterator) kernel resizes: gives its
// `layout` (the Meta kernel's) the strides the CPU gives it.
void restrideResizedOut(c10::ArrayRef<c10::IValue> arguments, const at::Tensor& out,
                        Layout& layout);

// Where the Meta kernel's answer for `op` disagrees with its CPU kernel even
// on fake CPU tensors: `result` takes the CPU's answer.
void correctForCpu(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> arguments,
                   MetaResult& result);

}  // namespace poptorch::capture
