// Shape inference for captured ops: what the results of an op look like,
// from its Meta kernel, cached by the signature of its arguments. Many Meta
// kernels are Python decompositions; a training step repeats the same calls,
// so after the first step no Meta kernel runs at all.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/SmallVector.h>

#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace poptorch::capture {

// The layout of one tensor an op returns or leaves behind.
struct Layout {
  bool defined = true;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  c10::SmallVector<int64_t, 5> sizes;
  c10::SmallVector<int64_t, 5> strides;
  int64_t offset = 0;
  int32_t storage = -1;  // a view's storage: an index into argumentStorages()
  // A view of a conjugate (or negative) view keeps the bit, as on the CPU.
  bool conj = false;
  bool neg = false;
  // A fresh result's storage bytes where the CPU kernel leaves more than the
  // layout needs (it made the result the unreduced loss's size, then reduced
  // into it: mse_loss), so that the ipu's result has the CPU's storage size;
  // 0 for what the layout needs.
  int64_t storage_nbytes = 0;

  bool operator==(const Layout& other) const = default;
};

struct ReturnInfo {
  bool is_list = false;
  std::vector<Layout> tensors;
  c10::IValue other;  // a non-tensor return
};

// Arguments a call casts to the default dtype of the call, so that its kernel
// does not read the default when it runs (see default_dtype.h): a bit per
// argument index.
struct DefaultDtypeCasts {
  uint64_t arguments = 0;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  // Set for an in-place op whose written tensor is one of the casts
  // (`a.lt_(0.5)` of an integer `a`): its out-of-place twin computes on the
  // cast arguments, and its result is copied into the written tensor.
  std::optional<c10::OperatorHandle> out_of_place;

  bool any() const { return arguments != 0; }
};

struct MetaResult {
  std::vector<ReturnInfo> returns;           // one per schema return
  std::vector<std::vector<Layout>> written;  // per argument: its tensors after the op
  // The warnings the CPU kernel gives at every call with these arguments,
  // and whether the call gives the kernel's warnings (then its run does not).
  std::vector<c10::Warning> warnings;
  bool warnings_at_call = false;
  DefaultDtypeCasts default_dtype_casts;
  // The inference of the call with default_dtype_casts applied (whose
  // signature follows from this one's), taken at its first call: null when it
  // does not give the same results (the call is recorded uncast). The Meta
  // cache is per thread, so only its thread sets it.
  mutable std::optional<std::shared_ptr<const MetaResult>> cast_call;
};

// The layout of `t`; `storage` as in Layout.
Layout layoutOf(const at::Tensor& t, int32_t storage = -1);

// Runs `op` on fake CPU twins of the meta tensors on `arguments` (PyTorch's
// FakeTensor: meta tensors that carry a device), leaving its results on
// `returns` and the arguments as the op left them; throws what the op raised.
using FakeCpuRunner = std::function<void(const c10::OperatorHandle& op,
                                         torch::jit::Stack* arguments, torch::jit::Stack* returns)>;

// A few Meta kernels written in Python decide a result's shape or layout by
// the device, and on a meta tensor (no device) they answer for CUDA; the ipu
// runs the CPU's kernels. So the results of these ops (`op_names`,
// "aten::histc.out") are inferred with `runner` instead; every other op's Meta
// kernel runs on meta twins directly. Installed by the Python module.
void setFakeCpuInference(const std::vector<std::string>& op_names, FakeCpuRunner runner);

// Called once, before the first Meta kernel runs: PyTorch's Python Meta
// kernels import modules at their first run that take seconds (sympy), which
// the Python module imports so that a Ctrl-C waits for the import's end.
// What it throws reaches the caller of that first inference.
void setBeforeFirstInference(std::function<void()> prepare);

// The results `op` would give for `arguments` (shared with the cache), or null
// when its Meta kernel cannot tell (it raised, e.g. for a data-dependent
// shape). Errors that are no answer about shapes (a KeyboardInterrupt)
// propagate.
std::shared_ptr<const MetaResult> inferMeta(const c10::OperatorHandle& op,
                                            c10::ArrayRef<c10::IValue> arguments);

// Whether an error a Meta kernel raised must reach the caller instead of
// sending the op to the host. The Python bindings install one that says so for
// KeyboardInterrupt, SystemExit and MemoryError; without it, none must.
using MustPropagate = bool (*)(const std::exception& error);
void setMetaErrorFilter(MustPropagate must_propagate);

// The distinct ipu storages among `arguments`, in order of first appearance.
std::vector<c10::Storage> argumentStorages(c10::ArrayRef<c10::IValue> arguments);

// Number of signatures in this thread's cache (for tests and metrics).
size_t metaCacheSize();

// True while this thread runs a Meta kernel to infer shapes: the warnings of
// PyTorch's Python Meta kernels are not the user's then (poptorch/_meta_warnings.py).
bool inferringShapes();

}  // namespace poptorch::capture
