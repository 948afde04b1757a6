#include "capture/cpu_checks.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/empty.h>
#include <ATen/record_function.h>
#include <absl/container/flat_hash_map.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/TensorImpl.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <optional>
#include <string>
#include <typeinfo>
#include <variant>
#include <vector>

#include "common/default_generator.h"
#include "common/ivalue_tensors.h"
#include "common/kernel_warnings.h"
#include "common/logging.h"

namespace poptorch::capture {
namespace {

// Above this many bytes of stand-ins and results, a check would cost a CPU
// run of that size (or fail for host memory where the ipu's own allocation
// would raise its out-of-memory error): the op's argument errors then surface
// when the graph runs.
constexpr size_t kMaxStandInBytes = size_t{16} << 20;

// The values the stand-ins hold: every element zero, then every element one.
// A check of the values that the real data passes almost always passes one of
// them too (a divisor non-zero, a pivot in [1, n]). Integer index arguments
// hold zero in both runs: it is in range of any dim that any index is in range
// of, where one is not (a dim of size 1), and an error the op raises whatever
// the values must come out of both runs alike to be raised at the call.
constexpr int kFillers[] = {0, 1};

// How much of an ipu storage the arguments view, and as what.
struct Extent {
  size_t bytes = 0;                                  // up to the end of its furthest view
  at::ScalarType dtype = at::ScalarType::Undefined;  // of its first view
  bool index = false;                                // viewed by an integer index argument
};
using Extents = absl::flat_hash_map<const c10::StorageImpl*, Extent>;

// CPU stand-ins of ipu tensors over filler values. Stand-ins of views of one
// ipu storage share one CPU storage, and a tensor passed twice gets one
// stand-in, so overlap checks see the real aliasing (the CPU refuses
// cat([t, t], out=t) for being the same tensor, even with no elements).
class StandIns {
 public:
  // The extents of the distinct ipu storages of `arguments`, or nullopt if
  // they are too large to run on, with the `result_bytes` the kernel makes.
  static std::optional<Extents> measure(const c10::FunctionSchema& schema,
                                        c10::ArrayRef<c10::IValue> arguments,
                                        size_t result_bytes) {
    Extents extents;
    size_t total = result_bytes;
    for (size_t i = 0; i < arguments.size(); ++i) {
      const bool index = isIndex(schema.arguments()[i]);
      forEachTensor(arguments[i], [&](const at::Tensor& t) {
        if (!t.defined() || !t.is_ipu()) return;
        Extent& extent = extents[t.storage().unsafeGetStorageImpl()];
        if (extent.dtype == at::ScalarType::Undefined) extent.dtype = t.scalar_type();
        // A bool mask keeps both fillers: all true is the one whose selection
        // fits the values put. So does a uint8 one, which index and index_put
        // take as a mask (PyTorch's deprecated form), not as indices.
        extent.index |= index && c10::isIntegralType(t.scalar_type(), /*includeBool=*/false) &&
                        t.scalar_type() != at::ScalarType::Byte;
        const size_t end = at::detail::computeStorageNbytes(t.sizes(), t.strides(), t.itemsize(),
                                                            t.storage_offset());
        total += std::max(end, extent.bytes) - extent.bytes;
        extent.bytes = std::max(end, extent.bytes);
      });
    }
    if (total > kMaxStandInBytes) return std::nullopt;
    return extents;
  }

  StandIns(const Extents& extents, int filler) {
    c10::Allocator* allocator = c10::GetCPUAllocator();
    for (const auto& [ipu, extent] : extents) {
      c10::Storage storage(c10::Storage::use_byte_size_t(), extent.bytes,
                           allocator->allocate(extent.bytes), allocator, /*resizable=*/true);
      if (extent.bytes > 0) std::memset(storage.mutable_data(), 0, extent.bytes);
      if (filler != 0 && !extent.index) {
        const int64_t elements =
            static_cast<int64_t>(extent.bytes / c10::elementSize(extent.dtype));
        tensorOn(storage, c10::scalarTypeToTypeMeta(extent.dtype), {elements}, {1}, 0)
            .fill_(filler);
      }
      storages_.emplace(ipu, std::move(storage));
    }
  }

  bool holds(const c10::Storage& storage) const {
    return std::any_of(storages_.begin(), storages_.end(),
                       [&](const auto& entry) { return entry.second.is_alias_of(storage); });
  }

  c10::IValue convert(const c10::IValue& value) {
    return mapTensors(value, [this](const at::Tensor& t) {
      if (!t.defined() || !t.is_ipu()) return t;  // host scalars take part as they are
      auto [it, made] = made_.try_emplace(t.unsafeGetTensorImpl());
      if (made) it->second = standIn(t);
      return it->second;
    });
  }

 private:
  // The arguments PyTorch's schemas name as indices into another argument
  // (gather, scatter, index_*, take, put, embedding, index_put, max_unpool).
  static bool isIndex(const c10::Argument& argument) {
    return argument.name() == "index" || argument.name() == "indices";
  }

  static at::Tensor tensorOn(const c10::Storage& storage, caffe2::TypeMeta dtype,
                             c10::IntArrayRef sizes, c10::IntArrayRef strides, int64_t offset) {
    auto impl = c10::make_intrusive<c10::TensorImpl>(
        c10::Storage(storage), c10::DispatchKeySet(c10::DispatchKey::CPU), dtype);
    impl->set_sizes_and_strides(sizes, strides, offset);
    return at::Tensor(std::move(impl));
  }

  at::Tensor standIn(const at::Tensor& t) const {
    at::Tensor stand_in = tensorOn(storages_.at(t.storage().unsafeGetStorageImpl()), t.dtype(),
                                   t.sizes(), t.strides(), t.storage_offset());
    stand_in.unsafeGetTensorImpl()->_set_conj(t.is_conj());
    stand_in.unsafeGetTensorImpl()->_set_neg(t.is_neg());
    return stand_in;
  }

  absl::flat_hash_map<const c10::StorageImpl*, c10::Storage> storages_;
  absl::flat_hash_map<const c10::TensorImpl*, at::Tensor> made_;  // per ipu tensor
};

// The bytes of the results `expected` says the kernel makes (its fresh
// results, and the written arguments at their size after the op), at most
// one past the limit: sizes may be far beyond what a size_t sums.
size_t resultBytes(const MetaResult& expected) {
  size_t total = 0;
  auto add = [&total](const Layout& layout) {
    if (!layout.defined || total > kMaxStandInBytes) return;
    const size_t bytes = at::detail::computeStorageNbytes(
        layout.sizes, layout.strides, c10::elementSize(layout.dtype), layout.offset);
    total += std::min(bytes, kMaxStandInBytes + 1);
  };
  for (const ReturnInfo& info : expected.returns) {
    for (const Layout& layout : info.tensors) {
      if (layout.storage < 0) add(layout);  // views make no memory
    }
  }
  for (const std::vector<Layout>& written : expected.written) {
    for (const Layout& layout : written) add(layout);
  }
  return total;
}

bool isGenerator(const c10::Argument& argument) {
  c10::TypePtr type = argument.type();
  if (auto optional = type->cast<c10::OptionalType>()) type = optional->getElementType();
  return type->kind() == c10::TypeKind::GeneratorType;
}

// Errors that say something about the values, whatever the fillers gave: a
// factorisation that failed (PyTorch raises LinAlgError exactly for that), or
// memory the run would have had.
bool aboutTheData(const c10::Error& error) {
  return dynamic_cast<const c10::LinAlgError*>(&error) != nullptr ||
         dynamic_cast<const c10::OutOfMemoryError*>(&error) != nullptr;
}

// What a run on stand-ins raised, and the warnings it gave before.
struct Raised {
  std::exception_ptr error;
  const std::type_info* type;
  std::string message;
  bool about_the_data;
  std::vector<c10::Warning> warnings;

  bool same(const Raised& other) const { return *type == *other.type && message == other.message; }
};

// The layout of a result the kernel made, with its storage's size where the
// kernel left more than the layout needs (Layout::storage_nbytes).
std::optional<Layout> denseLayout(const at::Tensor& t, const StandIns& stand_ins) {
  if (!t.defined() || !t.is_non_overlapping_and_dense()) return std::nullopt;
  Layout layout = layoutOf(t);
  const size_t needed = at::detail::computeStorageNbytes(t.sizes(), t.strides(), t.itemsize(),
                                                         t.storage_offset());
  if (!stand_ins.holds(t.storage()) && t.storage().nbytes() > needed) {
    layout.storage_nbytes = static_cast<int64_t>(t.storage().nbytes());
  }
  return layout;
}

// The layouts of a run's results (on `stack`) and of its written arguments.
CpuRun layoutsAfter(const torch::jit::Stack& stack, const std::vector<c10::IValue>& written,
                    const StandIns& stand_ins) {
  CpuRun layouts;
  for (const c10::IValue& value : stack) {
    std::vector<std::optional<Layout>>& tensors = layouts.returns.emplace_back();
    forEachTensor(value,
                  [&](const at::Tensor& t) { tensors.push_back(denseLayout(t, stand_ins)); });
  }
  layouts.written.resize(written.size());
  for (size_t i = 0; i < written.size(); ++i) {
    forEachTensor(written[i], [&](const at::Tensor& t) {
      layouts.written[i].push_back(t.defined() ? std::optional<Layout>(layoutOf(t)) : std::nullopt);
    });
  }
  return layouts;
}

// Runs the CPU kernel on stand-ins over `filler`: what it raised, or what it
// gave.
std::variant<Raised, CpuRun> runOnStandIns(const c10::OperatorHandle& op,
                                           c10::ArrayRef<c10::IValue> arguments,
                                           const Extents& extents, int filler) {
  const auto& schema = op.schema();
  bool draws_from_default = op.hasTag(at::Tag::nondeterministic_seeded);
  const WarningsRecorded recorded;
  try {
    // Filling may fail too (fill_ lacks a dtype): then no two runs agree.
    StandIns stand_ins(extents, filler);
    torch::jit::Stack stack;
    stack.reserve(arguments.size());
    // The written arguments' stand-ins, which the kernel may resize.
    std::vector<c10::IValue> written(arguments.size());
    for (size_t i = 0; i < arguments.size(); ++i) {
      if (isGenerator(schema.arguments()[i])) {
        // Random numbers come from a generator of its own: the user's stay as
        // they were.
        stack.emplace_back(at::make_generator<at::CPUGeneratorImpl>());
        draws_from_default = false;
      } else {
        stack.push_back(stand_ins.convert(arguments[i]));
        const c10::AliasInfo* alias = schema.arguments()[i].alias_info();
        if (alias && alias->isWrite()) written[i] = stack.back();
      }
    }
    std::optional<DefaultGeneratorBorrowed> default_generator;
    if (draws_from_default) default_generator.emplace();
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &stack);
    CpuRun run = layoutsAfter(stack, written, stand_ins);
    run.warnings = recorded.warnings();
    return run;
  } catch (const c10::Error& error) {
    return Raised{std::current_exception(), &typeid(error), error.msg(), aboutTheData(error),
                  recorded.warnings()};
  }
}

const std::vector<c10::Warning>& warningsOf(const std::variant<Raised, CpuRun>& run) {
  if (const auto* went_through = std::get_if<CpuRun>(&run)) return went_through->warnings;
  return std::get<Raised>(run).warnings;
}

// A kernel gives some warnings once per process (TORCH_WARN_ONCE, unless
// torch.set_warn_always): they are the ones a second run does not give
// again. Those are given now, at the call that checks; `run` keeps the
// others, which the CPU gives at every call.
CpuRun sortWarnings(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> arguments,
                    const Extents& extents, int filler, CpuRun run) {
  if (run.warnings.empty()) return run;
  const auto again = runOnStandIns(op, arguments, extents, filler);
  const std::vector<c10::Warning>& rerun = warningsOf(again);
  std::vector<c10::Warning> every_call;
  for (const c10::Warning& warning : run.warnings) {
    const bool recurs = std::any_of(rerun.begin(), rerun.end(), [&](const c10::Warning& other) {
      return sameWarning(warning, other);
    });
    if (recurs) {
      every_call.push_back(warning);
    } else {
      c10::warn(warning);
    }
  }
  run.warnings = std::move(every_call);
  return run;
}

// The warnings resizing the written arguments to their sizes after the op
// gives: PyTorch's resize_output() warns of an out= tensor with elements and
// another shape. Given by resizing a meta tensor of each, as the kernel would.
std::vector<c10::Warning> resizeWarnings(c10::ArrayRef<c10::IValue> arguments,
                                         const MetaResult& expected) {
  const WarningsRecorded recorded;
  for (size_t i = 0; i < arguments.size() && i < expected.written.size(); ++i) {
    size_t k = 0;
    forEachTensor(arguments[i], [&](const at::Tensor& t) {
      const size_t index = k++;
      if (!t.defined() || index >= expected.written[i].size()) return;
      const Layout& after = expected.written[i][index];
      if (!after.defined) return;
      at::Tensor twin = at::empty(t.sizes(), at::TensorOptions(t.scalar_type()).device(at::kMeta));
      at::native::resize_output(twin, after.sizes);
    });
  }
  return recorded.warnings();
}

// Ops whose CPU kernel is PyTorch's own: an op of another namespace may act
// beyond its arguments (a collective talks to other processes).
// Not the ops whose CPU kernel checks the values in a way neither filler
// passes: segment_reduce's lengths must sum to the data's size.
bool checkable(const c10::OperatorHandle& op) {
  const std::string& name = op.schema().name();
  return name.rfind("aten::", 0) == 0 && name != "aten::segment_reduce" &&
         name != "aten::_segment_reduce_backward" &&
         op.hasComputedKernelForDispatchKey(c10::DispatchKey::CPU);
}

// Calls `visit(cpu, meta, written)` for each fresh result and each written
// argument that both `run` and `result` describe: the layouts a CPU run may
// correct. Views keep the layout of what they view.
template <typename Run, typename Result, typename Visit>
void forEachCorrectable(Run& run, Result& result, Visit visit) {
  for (size_t r = 0; r < result.returns.size() && r < run.returns.size(); ++r) {
    auto& tensors = result.returns[r].tensors;
    if (tensors.size() != run.returns[r].size()) continue;
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (tensors[i].storage < 0) visit(run.returns[r][i], tensors[i], false);
    }
  }
  for (size_t a = 0; a < result.written.size() && a < run.written.size(); ++a) {
    if (result.written[a].size() != run.written[a].size()) continue;
    for (size_t i = 0; i < result.written[a].size(); ++i) {
      visit(run.written[a][i], result.written[a][i], true);
    }
  }
}

bool resizedOtherwise(const std::optional<Layout>& cpu, const Layout& meta) {
  return cpu && meta.defined && cpu->dtype == meta.dtype && cpu->sizes != meta.sizes;
}

// A size the CPU gives a result otherwise than the Meta kernel.
struct Resize {
  Sizes meta;
  Sizes cpu;
  bool operator==(const Resize& other) const { return meta == other.meta && cpu == other.cpu; }
};

// Per layout a CPU run may correct (in forEachCorrectable's order): how `run`
// resizes it, where its sizes differ from `expected`'s.
std::vector<std::optional<Resize>> resizes(const CpuRun& run, const MetaResult& expected) {
  std::vector<std::optional<Resize>> sizes;
  forEachCorrectable(run, expected, [&](const std::optional<Layout>& cpu, const Layout& meta, bool) {
    sizes.push_back(resizedOtherwise(cpu, meta) ? std::optional(Resize{meta.sizes, cpu->sizes})
                                                : std::nullopt);
  });
  return sizes;
}

// Where `run` sizes a result otherwise than the Meta kernel did (PyTorch's
// decomposition gives multilabel_margin_loss's unreduced loss of a 1-D input
// the shape [1], the CPU kernel []), the CPU's size is the one the ipu's run
// of that kernel gives: `run` notes the Meta kernel's sizes it corrects if a
// run over the other filler gives the same sizes (the values do not decide
// them).
void confirmResizes(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> arguments,
                    const Extents& extents, int other_filler, const MetaResult& expected,
                    CpuRun& run) {
  const auto sizes = resizes(run, expected);
  if (std::none_of(sizes.begin(), sizes.end(), [](const auto& s) { return s.has_value(); })) {
    return;
  }
  const auto other = runOnStandIns(op, arguments, extents, other_filler);
  const auto* confirmed = std::get_if<CpuRun>(&other);
  if (confirmed == nullptr || resizes(*confirmed, expected) != sizes) return;
  for (const std::optional<Resize>& resize : sizes) {
    run.resized_from.push_back(resize ? std::optional(resize->meta) : std::nullopt);
  }
}

}  // namespace

std::optional<CpuRun> checkAsCpuKernel(const c10::OperatorHandle& op,
                                       c10::ArrayRef<c10::IValue> arguments,
                                       const MetaResult& expected) {
  if (!checkable(op)) return std::nullopt;
  const std::optional<Extents> extents =
      StandIns::measure(op.schema(), arguments, resultBytes(expected));
  if (!extents) {
    POPTORCH_LOG(kTrace) << op.operator_name()
                         << ": tensors too large to check as the CPU kernel at the call";
    return std::nullopt;
  }
  // The checks are capture's business: they stay out of the user's profiles.
  at::DisableRecordFunctionGuard not_profiled;
  auto first = runOnStandIns(op, arguments, *extents, kFillers[0]);
  if (auto* run = std::get_if<CpuRun>(&first)) {
    confirmResizes(op, arguments, *extents, kFillers[1], expected, *run);
    return sortWarnings(op, arguments, *extents, kFillers[0], std::move(*run));
  }
  const Raised& raised = std::get<Raised>(first);
  if (raised.about_the_data) {
    // The factorisation failed on the fillers, as it may on the user's values;
    // what the kernel warned before it got there it warns whatever the values
    // (torch.cholesky's deprecation, a resized out= tensor), so those are given
    // at the call too. The results keep the Meta kernel's layouts.
    CpuRun warned;
    warned.warnings = raised.warnings;
    warned = sortWarnings(op, arguments, *extents, kFillers[0], std::move(warned));
    // A kernel that resizes its out= tensor after the factorisation
    // (torch.cholesky's) did not get there: on values it succeeds on, the
    // resize warns at every call.
    for (const c10::Warning& warning : resizeWarnings(arguments, expected)) {
      const bool given = std::any_of(
          raised.warnings.begin(), raised.warnings.end(),
          [&](const c10::Warning& other) { return sameWarning(warning, other); });
      if (!given) warned.warnings.push_back(warning);
    }
    if (raised.warnings.empty() && warned.warnings.empty()) return std::nullopt;
    return warned;
  }
  auto second = runOnStandIns(op, arguments, *extents, kFillers[1]);
  if (auto* run = std::get_if<CpuRun>(&second)) {
    confirmResizes(op, arguments, *extents, kFillers[0], expected, *run);
    return sortWarnings(op, arguments, *extents, kFillers[1], std::move(*run));
  }
  if (raised.same(std::get<Raised>(second))) {
    for (const c10::Warning& warning : raised.warnings) c10::warn(warning);
    std::rethrow_exception(raised.error);
  }
  return std::nullopt;
}

void adoptCpuLayouts(const CpuRun& cpu, MetaResult& result) {
  size_t index = 0;
  forEachCorrectable(cpu, result, [&](const std::optional<Layout>& from, Layout& to, bool written) {
    const size_t at = index++;
    if (!from || !to.defined || from->dtype != to.dtype) return;
    if (from->sizes != to.sizes) {
      // The run was made for the first call of this signature, whose floats
      // may have sized the results otherwise (arange's end): only a size it
      // found the Meta kernel to get wrong for the same sizes is corrected.
      if (at >= cpu.resized_from.size() || cpu.resized_from[at] != to.sizes) return;
      to.sizes = from->sizes;
    }
    to.strides = from->strides;
    if (written) {
      to.offset = from->offset;
    } else {
      to.storage_nbytes = from->storage_nbytes;
    }
  });
}

}  // namespace poptorch::capture
