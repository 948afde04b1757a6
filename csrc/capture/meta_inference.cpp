#include "capture/meta_inference.h"

#include <ATen/Context.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <ATen/record_function.h>
#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>
#include <absl/hash/hash.h>
#include <absl/types/span.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/TensorImpl.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <functional>
#include <mutex>

#include "capture/cpu_alignment.h"
#include "capture/cpu_checks.h"
#include "capture/default_dtype.h"
#include "capture/float_class.h"
#include "common/ivalue_tensors.h"
#include "common/kernel_warnings.h"
#include "common/logging.h"

namespace poptorch::capture {
namespace {

// Numbers the distinct ipu storages of the arguments by first appearance. An
// op has a few: they are searched in order, and hashed only past kLinear (a
// long Tensor[] list), so that numbering allocates nothing on the hot path.
class StorageNumbering {
 public:
  int32_t indexOf(const c10::StorageImpl* storage) {
    if (!index_.empty()) {
      auto [it, inserted] = index_.try_emplace(storage, static_cast<int32_t>(index_.size()));
      return it->second;
    }
    for (size_t i = 0; i < seen_.size(); ++i) {
      if (seen_[i] == storage) return static_cast<int32_t>(i);
    }
    seen_.push_back(storage);
    if (seen_.size() > kLinear) {
      for (size_t i = 0; i < seen_.size(); ++i) index_.emplace(seen_[i], static_cast<int32_t>(i));
    }
    return static_cast<int32_t>(seen_.size() - 1);
  }

 private:
  static constexpr size_t kLinear = 8;
  c10::SmallVector<const c10::StorageImpl*, kLinear> seen_;
  absl::flat_hash_map<const c10::StorageImpl*, int32_t> index_;  // past kLinear
};

bool isHostScalar(const at::Tensor& t) { return t.defined() && t.is_cpu() && t.dim() == 0; }

// Meta twins of ipu tensors. Twins of views of one ipu storage share one meta
// storage, so Meta kernels see the same aliasing as the real ones. CPU scalars
// (0-dim host tensors, which mix with tensors of any device) stay on the host,
// or get meta twins of their own.
class MetaTwins {
 public:
  explicit MetaTwins(bool twin_host_scalars) : twin_host_scalars_(twin_host_scalars) {}

  c10::IValue convert(const c10::IValue& value) {
    // A factory's device: its meta twin makes meta tensors (as FakeTensor's
    // rule for constructors does), not ipu tensors while inferring shapes.
    if (value.isDevice() && value.toDevice().is_ipu()) return c10::Device(c10::kMeta);
    return mapTensors(value, [this](const at::Tensor& t) {
      return twin_host_scalars_ && isHostScalar(t) ? hostScalarTwin(t) : twin(t);
    });
  }

  // The argument storage a meta result views, or -1.
  int32_t storageOf(const at::Tensor& meta) const {
    if (!meta.defined()) return -1;
    auto it = index_of_meta_.find(meta.storage().unsafeGetStorageImpl());
    return it == index_of_meta_.end() ? -1 : it->second;
  }

 private:
  at::Tensor twin(const at::Tensor& t) {
    if (!t.defined() || !t.is_ipu()) return t;
    c10::StorageImpl* ipu = t.storage().unsafeGetStorageImpl();
    const int32_t index = numbering_.indexOf(ipu);
    if (static_cast<size_t>(index) == meta_storages_.size()) {
      meta_storages_.emplace_back(c10::Storage::use_byte_size_t(), ipu->nbytes(),
                                  c10::DataPtr(nullptr, c10::Device(c10::kMeta)),
                                  c10::GetAllocator(c10::kMeta), /*resizable=*/true);
      index_of_meta_.emplace(meta_storages_.back().unsafeGetStorageImpl(), index);
    }
    auto impl = c10::make_intrusive<c10::TensorImpl>(c10::Storage(meta_storages_[index]),
                                                     c10::DispatchKeySet(c10::DispatchKey::Meta),
                                                     t.dtype());
    impl->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
    impl->_set_conj(t.is_conj());
    impl->_set_neg(t.is_neg());
    return at::Tensor(std::move(impl));
  }

  // Type promotion tells a wrapped Python number from a 0-dim tensor: the twin
  // keeps the flag.
  static at::Tensor hostScalarTwin(const at::Tensor& t) {
    at::Tensor twin = at::detail::empty_meta({}, t.options().device(c10::kMeta));
    twin.unsafeGetTensorImpl()->set_wrapped_number(t.unsafeGetTensorImpl()->is_wrapped_number());
    twin.unsafeGetTensorImpl()->_set_conj(t.is_conj());
    twin.unsafeGetTensorImpl()->_set_neg(t.is_neg());
    return twin;
  }

  bool twin_host_scalars_;
  StorageNumbering numbering_;
  std::vector<c10::Storage> meta_storages_;
  absl::flat_hash_map<const c10::StorageImpl*, int32_t> index_of_meta_;
};

// Everything a Meta kernel's answer can depend on, as integers: the op, the
// settings the CPU kernel's errors and warnings depend on, and for each
// argument its value or, for a tensor, its metadata and aliasing.
// With `Floats::kByClass`, a float counts only by its class (float_class.h),
// and by how it compares with the call's other floats and the class of their
// difference (see checkAsCpuKernelOnce).
// The key is written into an inline vector the caller owns: a signature is
// looked up at every captured op, and copied into a map's key only when new.
using SignatureKey = c10::SmallVector<int64_t, 48>;

class Signature {
 public:
  enum class Floats { kByValue, kByClass };

  Signature(const c10::OperatorHandle& op, SignatureKey& key, Floats floats = Floats::kByValue)
      : key_(key), floats_(floats) {
    key_.clear();
    key_.push_back(static_cast<int64_t>(reinterpret_cast<intptr_t>(&op.schema())));
    // Ops that promote integer inputs to floating point (true division, sqrt
    // of an int tensor) give a result of the default dtype.
    key_.push_back(static_cast<int64_t>(c10::typeMetaToScalarType(c10::get_default_dtype())));
    // What the CPU kernel raises and warns (its check) depends on these.
    const at::Context& context = at::globalContext();
    key_.push_back(int64_t{context.deterministicAlgorithms()} |
                   int64_t{context.deterministicAlgorithmsWarnOnly()} << 1 |
                   int64_t{c10::WarningUtils::get_warnAlways()} << 2);
  }

  // False when a value has a kind that is not worth keying on.
  bool add(const c10::IValue& v) {
    // Each kind pushes its own tag first, so that different kinds never collide.
    if (v.isTensor()) return push(1) && addTensor(v.toTensor());
    if (v.isTensorList() || v.isList()) {
      const auto& list = v.toListRef();
      push(2);
      push(static_cast<int64_t>(list.size()));
      for (const c10::IValue& element : list) {
        if (!add(element)) return false;
      }
      return true;
    }
    if (v.isNone()) return push(3);
    if (v.isGenerator()) return push(4);
    if (v.isBool()) return push(5) && push(v.toBool());
    if (v.isInt()) return push(6) && push(v.toInt());
    if (v.isDouble()) return push(7) && addDouble(v.toDouble());
    if (v.isString()) {
      return push(8) && push(static_cast<int64_t>(std::hash<std::string>{}(v.toStringRef())));
    }
    if (v.isDevice()) {
      return push(9) && push(static_cast<int64_t>(v.toDevice().type())) &&
             push(v.toDevice().index());
    }
    if (v.isComplexDouble()) {
      const auto c = v.toComplexDouble();
      return push(10) && push(std::bit_cast<int64_t>(c.real())) &&
             push(std::bit_cast<int64_t>(c.imag()));
    }
    return false;
  }

 private:
  bool push(int64_t x) {
    key_.push_back(x);
    return true;
  }

  bool addDouble(double x) {
    if (floats_ == Floats::kByValue) return push(std::bit_cast<int64_t>(x));
    push(signClass(x));
    push(rangeClass(x));
    for (double earlier : doubles_) {
      push((earlier < x) - (x < earlier));
      push(rangeClass(x - earlier));
    }
    doubles_.push_back(x);
    return true;
  }

  bool addTensor(const at::Tensor& t) {
    if (!t.defined()) return push(-1);
    push(static_cast<int64_t>(t.device().type()));
    push(static_cast<int64_t>(t.scalar_type()));
    push((t.is_conj() ? 1 : 0) | (t.is_neg() ? 2 : 0) |
         (t.unsafeGetTensorImpl()->is_wrapped_number() ? 4 : 0));
    push(t.dim());
    key_.append(t.sizes().begin(), t.sizes().end());
    key_.append(t.strides().begin(), t.strides().end());
    push(t.storage_offset());
    if (t.is_ipu()) {
      const c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
      push(numbering_.indexOf(storage));
      push(static_cast<int64_t>(storage->nbytes()));
    }
    return true;
  }

  SignatureKey& key_;
  StorageNumbering numbering_;
  Floats floats_;
  c10::SmallVector<double, 4> doubles_;  // with kByClass: the floats so far
};

// Maps from signatures, which store their keys as vectors and are looked up
// by a SignatureKey without copying it.
struct SignatureHash {
  using is_transparent = void;
  size_t operator()(absl::Span<const int64_t> key) const {
    return absl::Hash<absl::Span<const int64_t>>{}(key);
  }
};
struct SignatureEq {
  using is_transparent = void;
  bool operator()(absl::Span<const int64_t> a, absl::Span<const int64_t> b) const { return a == b; }
};
template <class Value>
using SignatureMap = absl::flat_hash_map<std::vector<int64_t>, Value, SignatureHash, SignatureEq>;

using MetaCache = SignatureMap<std::shared_ptr<const MetaResult>>;
constexpr size_t kMaxCachedSignatures = 1 << 16;

// One cache per capturing thread: no lock on the hot path.
MetaCache& metaCache() {
  thread_local MetaCache cache;
  return cache;
}

// An op whose every return aliases an argument without writing it.
bool isViewOp(const c10::FunctionSchema& schema) {
  if (schema.returns().empty()) return false;
  for (const c10::Argument& r : schema.returns()) {
    if (!r.alias_info() || r.alias_info()->isWrite()) return false;
  }
  return true;
}

std::atomic<MustPropagate> must_propagate{nullptr};

// PyTorch 2.13 replaces the C++ Meta kernels of most ops with Python
// decompositions (torch/_meta_registrations.py, for FakeTensor), which skip
// checks the CPU kernel makes when it is called: overlap of in-place and
// output arguments, dtypes, broadcast shapes. For a structured op, those
// checks are its C++ meta function, which the CPU kernel runs first; the op's
// CompositeExplicitAutogradNonFunctional kernel (the structured kernel for
// devices without one of their own) runs the same function and then the op's
// out= variant: run that one on meta twins. Returns true if it did.
bool runStructuredMeta(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> arguments,
                       torch::jit::Stack* stack) {
  constexpr auto kStructured = c10::DispatchKey::CompositeExplicitAutogradNonFunctional;
  if (!op.hasKernelForDispatchKey(kStructured)) return false;
  // index_add's and index_reduce's meta functions check dtypes on meta tensors
  // with `source.select(dim, 0)`, which fails for an empty source that the CPU
  // kernel accepts (an empty index adds nothing): their Meta kernel answers.
  const std::string& name = op.schema().name();
  if ((name == "aten::index_add" || name == "aten::index_add_" || name == "aten::index_reduce" ||
       name == "aten::index_reduce_") &&
      arguments.size() > 3 && arguments[3].isTensor() && arguments[1].isInt()) {
    const at::Tensor& source = arguments[3].toTensor();
    if (source.dim() > 0 &&
        source.size(at::maybe_wrap_dim(arguments[1].toInt(), source.dim())) == 0) {
      return false;
    }
  }
  op.callBoxedForDispatchKey(kStructured, *stack);
  return true;
}

// Which ops are inferred on fake CPU tensors, and how (setFakeCpuInference).
class FakeCpuInference {
 public:
  static FakeCpuInference& get() {
    static FakeCpuInference inference;
    return inference;
  }

  void set(const std::vector<std::string>& op_names, FakeCpuRunner runner) {
    std::lock_guard<std::mutex> lock(mutex_);
    ops_ = absl::flat_hash_set<std::string>(op_names.begin(), op_names.end());
    runner_ = std::move(runner);
  }

  // Runs `op` on fake CPU tensors if it is one of them: true if it did.
  // Throws what the op raised.
  bool run(const c10::OperatorHandle& op, torch::jit::Stack* arguments,
           torch::jit::Stack* returns) {
    // A Python number PyTorch wrapped as a tensor (x * 2.5 through a generic
    // kernel) reaches Python code as a number, where FakeTensor's dispatch
    // wants a tensor: those calls keep the Meta kernel, which takes numbers.
    for (const c10::IValue& value : *arguments) {
      if (value.isTensor() && value.toTensor().defined() &&
          value.toTensor().unsafeGetTensorImpl()->is_wrapped_number()) {
        return false;
      }
    }
    FakeCpuRunner runner;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const c10::OperatorName& name = op.operator_name();
      if (!runner_ ||
          !ops_.contains(name.overload_name.empty() ? name.name
                                                    : name.name + "." + name.overload_name)) {
        return false;
      }
      runner = runner_;
    }
    runner(op, arguments, returns);
    return true;
  }

 private:
  std::mutex mutex_;
  absl::flat_hash_set<std::string> ops_;
  FakeCpuRunner runner_;
};

// The CPU kernel's own checks and layouts (cpu_checks.h), too slow for every
// call: once per signature. A CPU kernel checks a float argument against 0 or
// 1 or another argument (a probability, a standard deviation, from < to), or
// against the range of a dtype it converts it to (fill_, uniform_'s to - from);
// otherwise its value changes from call to call (a learning rate, Adam's bias
// corrections), so it counts by its class, and a new learning rate is not
// checked again. Layouts never depend on a float's value.
const std::optional<CpuRun>& checkAsCpuKernelOnce(const c10::OperatorHandle& op,
                                                  c10::ArrayRef<c10::IValue> arguments,
                                                  const MetaResult& expected) {
  SignatureKey key;
  Signature signature(op, key, Signature::Floats::kByClass);
  for (const c10::IValue& value : arguments) signature.add(value);
  thread_local SignatureMap<std::optional<CpuRun>> checked;
  auto it = checked.find(absl::Span<const int64_t>(key));
  if (it != checked.end()) return it->second;
  // Throws what the CPU kernel raises.
  std::optional<CpuRun> run = checkAsCpuKernel(op, arguments, expected);
  if (checked.size() >= kMaxCachedSignatures) checked.clear();
  return checked.emplace(std::vector<int64_t>(key.begin(), key.end()), std::move(run))
      .first->second;
}

thread_local bool inferring_shapes = false;

// While it lives, this thread infers shapes: the Meta kernels' warnings, from
// C++ (TORCH_WARN) or Python, are dropped. The CPU kernel's are the user's.
class InferringShapes {
 public:
  InferringShapes() : before_(inferring_shapes) { inferring_shapes = true; }
  ~InferringShapes() { inferring_shapes = before_; }
  InferringShapes(const InferringShapes&) = delete;
  InferringShapes& operator=(const InferringShapes&) = delete;

 private:
  bool before_;
  WarningsDiscarded discarded_;
};

std::optional<MetaResult> runOnTwins(const c10::OperatorHandle& op,
                                     c10::ArrayRef<c10::IValue> arguments, bool twin_host_scalars,
                                     bool* cacheable) {
  MetaTwins twins(twin_host_scalars);
  torch::jit::Stack meta_args;
  meta_args.reserve(arguments.size());
  for (const c10::IValue& value : arguments) meta_args.push_back(twins.convert(value));
  alignWithCpuKernel(op, meta_args);
  // Neither runStructuredMeta nor FakeCpuInference touches the stack when it
  // declines the op.
  torch::jit::Stack meta_stack = meta_args;
  try {
    // Shape inference is capture's business: it stays out of the user's
    // profiles and warnings.
    at::DisableRecordFunctionGuard not_profiled;
    const InferringShapes inferring;
    // The CPU's own checks first (structured ops), then the CPU's layouts.
    if (!runStructuredMeta(op, arguments, &meta_stack) &&
        !FakeCpuInference::get().run(op, &meta_args, &meta_stack)) {
      op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &meta_stack);
    }
  } catch (const c10::NotImplementedError& error) {
    // No Meta kernel after all (PyTorch's Python fallback for ops without a
    // fake implementation): no answer about shapes, not the user's error.
    POPTORCH_LOG(kTrace) << op.operator_name() << ": no Meta kernel: " << error.what();
    return std::nullopt;
  } catch (const c10::Error&) {
    // C++ meta functions check arguments, never data: the CPU kernel would
    // raise the same error at the call, and so does the capture.
    throw;
  } catch (const std::exception& error) {
    // A view op's Meta kernel checks what its CPU kernel checks (metadata
    // only), and the host cannot run a view of ipu storage: its error is the
    // user's. Meta kernels written in Python raise Python errors, not
    // c10::Errors; those that are no answer about shapes reach the user too.
    const MustPropagate filter = must_propagate.load();
    if (isViewOp(op.schema()) || (filter != nullptr && filter(error))) throw;
    POPTORCH_LOG(kTrace) << op.operator_name() << ": Meta inference failed: " << error.what();
    return std::nullopt;
  }

  MetaResult result;
  for (const c10::IValue& value : meta_stack) {
    ReturnInfo info;
    if (value.isTensor()) {
      info.tensors.push_back(layoutOf(value.toTensor(), twins.storageOf(value.toTensor())));
    } else if (value.isTensorList()) {
      info.is_list = true;
      for (const at::Tensor& t : value.toTensorList())
        info.tensors.push_back(layoutOf(t, twins.storageOf(t)));
    } else {
      info.other = value;
      *cacheable = *cacheable && (value.isNone());  // other values may depend on data
    }
    result.returns.push_back(std::move(info));
  }
  const auto& schema = op.schema();
  result.written.resize(arguments.size());
  for (size_t i = 0; i < arguments.size(); ++i) {
    const c10::AliasInfo* alias = schema.arguments()[i].alias_info();
    if (!alias || !alias->isWrite()) continue;
    forEachTensor(meta_args[i],
                  [&](const at::Tensor& t) { result.written[i].push_back(layoutOf(t, -1)); });
    if (op.hasTag(at::Tag::pointwise) && schema.arguments()[i].is_out() &&
        arguments[i].isTensor()) {
      restrideResizedOut(arguments, arguments[i].toTensor(), result.written[i][0]);
    }
  }
  correctForCpu(op, arguments, result);
  return result;
}

// A Python Meta kernel may refuse a CPU scalar as it is (it copies one that
// comes first, `torch.tensor(2.) * x`, to the Meta device, which it may not):
// its meta twin answers then. It stays on the host otherwise, for the kernels
// that read its value. When the twin gets no answer either, the host does (the
// op falls back, and raises the CPU's own error if there is one).
std::optional<MetaResult> runMetaKernel(const c10::OperatorHandle& op,
                                        c10::ArrayRef<c10::IValue> arguments, bool* cacheable) {
  std::optional<MetaResult> result = runOnTwins(op, arguments, false, cacheable);
  const bool any_host_scalar = std::any_of(
      arguments.begin(), arguments.end(),
      [](const c10::IValue& value) { return value.isTensor() && isHostScalar(value.toTensor()); });
  if (result || !any_host_scalar) return result;
  try {
    return runOnTwins(op, arguments, true, cacheable);
  } catch (const std::exception& error) {
    POPTORCH_LOG(kTrace) << op.operator_name() << ": Meta inference failed: " << error.what();
    return std::nullopt;
  }
}

}  // namespace

Layout layoutOf(const at::Tensor& t, int32_t storage) {
  Layout layout;
  layout.defined = t.defined();
  if (!layout.defined) return layout;
  layout.dtype = t.scalar_type();
  layout.sizes.assign(t.sizes().begin(), t.sizes().end());
  layout.strides.assign(t.strides().begin(), t.strides().end());
  layout.offset = t.storage_offset();
  layout.storage = storage;
  layout.conj = t.is_conj();
  layout.neg = t.is_neg();
  return layout;
}

void setFakeCpuInference(const std::vector<std::string>& op_names, FakeCpuRunner runner) {
  FakeCpuInference::get().set(op_names, std::move(runner));
}

namespace {

std::mutex before_first_inference_mutex;
std::function<void()> before_first_inference;
std::atomic<bool> inferred_before{false};

// Runs the setBeforeFirstInference() function the first time a Meta kernel is
// about to run.
void prepareFirstInference() {
  if (inferred_before.load(std::memory_order_acquire)) return;
  std::function<void()> prepare;
  {
    std::lock_guard<std::mutex> lock(before_first_inference_mutex);
    if (inferred_before.exchange(true)) return;
    prepare = std::move(before_first_inference);
  }
  if (prepare) prepare();
}

}  // namespace

void setBeforeFirstInference(std::function<void()> prepare) {
  std::lock_guard<std::mutex> lock(before_first_inference_mutex);
  before_first_inference = std::move(prepare);
}

std::shared_ptr<const MetaResult> inferMeta(const c10::OperatorHandle& op,
                                            c10::ArrayRef<c10::IValue> arguments) {
  SignatureKey lookup_key;
  Signature signature(op, lookup_key);
  bool cacheable = true;
  for (const c10::IValue& value : arguments) cacheable = cacheable && signature.add(value);
  MetaCache& cache = metaCache();
  if (cacheable) {
    auto it = cache.find(absl::Span<const int64_t>(lookup_key));
    if (it != cache.end()) return it->second;
  }
  // A miss: the Meta kernel (Python, perhaps) runs before the key is stored.
  std::vector<int64_t> key(lookup_key.begin(), lookup_key.end());
  prepareFirstInference();
  const bool keyed = cacheable;
  std::optional<MetaResult> result = runMetaKernel(op, arguments, &cacheable);
  if (!result) return nullptr;
  result->default_dtype_casts =
      defaultDtypeCasts(op, arguments, *result,
                        [](const c10::OperatorHandle& inferred,
                           c10::ArrayRef<c10::IValue> cast) -> std::optional<MetaResult> {
                          bool ignored = true;
                          try {
                            return runMetaKernel(inferred, cast, &ignored);
                          } catch (const c10::Error&) {
                            return std::nullopt;  // the op refuses the cast arguments
                          }
                        });
  // Without a Meta answer the op runs on the host, which makes the CPU
  // kernel's checks itself.
  if (keyed) {
    const std::optional<CpuRun>& cpu = checkAsCpuKernelOnce(op, arguments, *result);
    if (cpu) {
      adoptCpuLayouts(*cpu, *result);
      result->warnings = cpu->warnings;
      result->warnings_at_call = true;
    }
  }
  auto shared = std::make_shared<const MetaResult>(std::move(*result));
  if (cacheable) {
    if (cache.size() >= kMaxCachedSignatures) cache.clear();
    cache.emplace(std::move(key), shared);
  }
  return shared;
}

void setMetaErrorFilter(MustPropagate filter) { must_propagate = filter; }

std::vector<c10::Storage> argumentStorages(c10::ArrayRef<c10::IValue> arguments) {
  StorageNumbering numbering;
  std::vector<c10::Storage> storages;
  for (const c10::IValue& value : arguments) {
    forEachTensor(value, [&](const at::Tensor& t) {
      if (!t.defined() || !t.is_ipu()) return;
      if (static_cast<size_t>(numbering.indexOf(t.storage().unsafeGetStorageImpl())) ==
          storages.size()) {
        storages.push_back(t.storage());
      }
    });
  }
  return storages;
}

size_t metaCacheSize() { return metaCache().size(); }

bool inferringShapes() { return inferring_shapes; }

}  // namespace poptorch::capture
