// The argument checks a CPU kernel makes when it is called, made at capture.
//
// Capture infers an op's results from its Meta kernel, but PyTorch's Meta
// kernels (mostly Python decompositions) skip many checks the CPU kernel makes
// before it reads any data: dtypes its dtype dispatch lacks, index_put's
// dtypes, index_select of a scalar, random_'s bounds, neg(out=) of another
// dtype, overlap of an out= tensor... The ipu runs the CPU kernels, so without
// these checks the error would surface only when the graph runs, at the next
// sync. Instead, the first call of each signature runs the CPU kernel itself
// on stand-ins: CPU tensors with the arguments' sizes, strides, dtypes and
// aliasing, whose elements are all zero, then all one. An error it raises for
// both does not depend on the data, so the CPU raises it at the call: so does
// the capture. What only the data decides (an index out of range, a singular
// matrix) stays with the run, which poisons what the failed graph computes.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

namespace poptorch::capture {

// Throws the error `op`'s CPU kernel raises for `arguments` whatever their
// values are, if it raises one. The caller runs it once per signature of the
// arguments (shapes, strides, dtypes, aliasing and non-tensor values).
void checkAsCpuKernel(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> arguments);

}  // namespace poptorch::capture
