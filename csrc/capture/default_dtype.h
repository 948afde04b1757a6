// Ops whose CPU kernel reads the default dtype when it runs: true division and
// the floating-point functions of integer tensors (`a / b`, `sqrt(a)`), and an
// integer tensor with a Python float (`a * 0.1`) compute in
// torch.get_default_dtype(). The captured node runs later, on another thread,
// when the process-wide default may have changed; setting it there would race
// with the user's thread. So the node is made independent of it: its integer
// inputs are cast to the default dtype of the call (as the kernel would cast
// them), and the kernel then computes in that dtype whatever the default is.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "capture/meta_inference.h"

namespace poptorch::capture {

// Infers the results of an op for some arguments (no cache, no CPU checks);
// none when its Meta kernel refuses them.
using MetaRunner = std::function<std::optional<MetaResult>(const c10::OperatorHandle& op,
                                                           c10::ArrayRef<c10::IValue> arguments)>;

// The casts that make a call of `op` with `arguments`, whose results are
// `result`, independent of the default dtype: none if it does not read it, or
// if no cast gives the same results (then it runs in the default dtype of its
// run: where(cond, 1.5, 2.5) has no integer input to cast). An in-place op
// cannot cast the tensor it writes: when that is the integer input
// (`a.lt_(0.5)`), the casts are those of its out-of-place twin, named in
// `out_of_place`.
DefaultDtypeCasts defaultDtypeCasts(const c10::OperatorHandle& op,
                                    c10::ArrayRef<c10::IValue> arguments, const MetaResult& result,
                                    const MetaRunner& infer);

// `arguments` with the casts applied (ipu tensors are cast by captured ops).
std::vector<c10::IValue> castArguments(c10::ArrayRef<c10::IValue> arguments,
                                       const DefaultDtypeCasts& casts);

// True if two inferences give results of the same dtypes and layouts.
bool sameResults(const MetaResult& a, const MetaResult& b);

}  // namespace poptorch::capture
