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
//
// The run that goes through also tells the layouts the CPU gives the results
// (capture gives the ipu's results the same sizes and strides) and the warnings the CPU
// gives at the call (capture gives them at each call; the kernel's run in the
// graph does not give them again).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>
#include <vector>

#include "capture/meta_inference.h"

namespace poptorch::capture {

// What a run on stand-ins gave. The layouts: per return, its tensors (nullopt
// for an undefined one, or one that is not dense), and per argument, the
// tensors it wrote (empty for the others) as the kernel left them. And the
// warnings the kernel gives at every call with such arguments (a resized
// non-empty out= tensor, a deprecated behaviour).
using Sizes = c10::SmallVector<int64_t, 5>;

struct CpuRun {
  std::vector<std::vector<std::optional<Layout>>> returns;
  std::vector<std::vector<std::optional<Layout>>> written;
  std::vector<c10::Warning> warnings;
  // Per fresh result and written tensor: the Meta kernel's sizes the CPU's
  // correct, confirmed by a run over the other filler (nullopt where they
  // agree or the values may decide). Empty when none differs.
  std::vector<std::optional<Sizes>> resized_from;
};

// Throws the error `op`'s CPU kernel raises for `arguments` whatever their
// values are, if it raises one (after the warnings it gives first). Returns
// what a run that went through gave, or nullopt if none did or none ran. The
// caller runs it once per signature of the arguments (shapes, strides,
// dtypes, aliasing and non-tensor values), at a call of the op: the warnings
// the kernel gives once per process (TORCH_WARN_ONCE) are given here, the
// others are returned, for the caller to give at every call. `expected` (the
// Meta kernel's answer) tells how much memory the results take: large
// arguments or results are not checked (nullopt).
std::optional<CpuRun> checkAsCpuKernel(const c10::OperatorHandle& op,
                                       c10::ArrayRef<c10::IValue> arguments,
                                       const MetaResult& expected);

// Gives the fresh results and the written arguments of `result` the sizes and
// strides (and a written argument its offset) the CPU kernel gave them, where
// the dtypes agree. PyTorch's Python Meta kernels make results with their own
// rule (torch._prims_common's empty_like), which differs from the CPU's for
// dims of size 1 and empty tensors, and so does their out= resizing; the CPU's
// strides decide whether a later view() works. A few size a result otherwise
// than the CPU kernel, which the ipu runs: those sizes are corrected where
// `cpu.resized_from` says so.
void adoptCpuLayouts(const CpuRun& cpu, MetaResult& result);

}  // namespace poptorch::capture
