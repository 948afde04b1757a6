#include "capture/meta_inference.h"

#include <ATen/core/Tensor.h>
#include <ATen/record_function.h>
#include <absl/container/flat_hash_map.h>
#include <absl/hash/hash.h>
#include <c10/core/TensorImpl.h>

#include <atomic>
#include <bit>
#include <functional>

#include "common/ivalue_tensors.h"
#include "common/logging.h"

namespace poptorch::capture {
namespace {

// Numbers the distinct ipu storages of the arguments by first appearance.
class StorageNumbering {
 public:
  int32_t indexOf(const c10::StorageImpl* storage) {
    auto [it, inserted] = index_.try_emplace(storage, static_cast<int32_t>(index_.size()));
    return it->second;
  }

 private:
  absl::flat_hash_map<const c10::StorageImpl*, int32_t> index_;
};

// Meta twins of ipu tensors. Twins of views of one ipu storage share one meta
// storage, so Meta kernels see the same aliasing as the real ones.
class MetaTwins {
 public:
  c10::IValue convert(const c10::IValue& value) {
    return mapTensors(value, [this](const at::Tensor& t) { return twin(t); });
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

  StorageNumbering numbering_;
  std::vector<c10::Storage> meta_storages_;
  absl::flat_hash_map<const c10::StorageImpl*, int32_t> index_of_meta_;
};

// Everything a Meta kernel's answer can depend on, as integers: the op, and
// for each argument its value or, for a tensor, its metadata and aliasing.
class Signature {
 public:
  explicit Signature(const c10::OperatorHandle& op) {
    key_.push_back(static_cast<int64_t>(reinterpret_cast<intptr_t>(&op.schema())));
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
    if (v.isDouble()) return push(7) && push(std::bit_cast<int64_t>(v.toDouble()));
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

  const std::vector<int64_t>& key() const { return key_; }

 private:
  bool push(int64_t x) {
    key_.push_back(x);
    return true;
  }

  bool addTensor(const at::Tensor& t) {
    if (!t.defined()) return push(-1);
    push(static_cast<int64_t>(t.device().type()));
    push(static_cast<int64_t>(t.scalar_type()));
    push((t.is_conj() ? 1 : 0) | (t.is_neg() ? 2 : 0) |
         (t.unsafeGetTensorImpl()->is_wrapped_number() ? 4 : 0));
    push(t.dim());
    for (int64_t s : t.sizes()) push(s);
    for (int64_t s : t.strides()) push(s);
    push(t.storage_offset());
    if (t.is_ipu()) {
      const c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
      push(numbering_.indexOf(storage));
      push(static_cast<int64_t>(storage->nbytes()));
    }
    return true;
  }

  std::vector<int64_t> key_;
  StorageNumbering numbering_;
};

using MetaCache = absl::flat_hash_map<std::vector<int64_t>, MetaResult>;
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

// Arguments on which a PyTorch Meta kernel disagrees with the CPU kernel,
// rewritten to ones that mean the same to the CPU. nansum (and nanmean, built
// on it) reduces over every dim for an empty dim list on the CPU, but its Meta
// kernel (meta_nansum in torch/_meta_registrations.py) reduces over none.
void alignWithCpuKernel(const c10::OperatorHandle& op, torch::jit::Stack& meta_args) {
  if (op.schema().name() == "aten::nansum" && meta_args.size() > 1 && meta_args[1].isIntList() &&
      meta_args[1].toIntList().empty()) {
    meta_args[1] = c10::IValue();
  }
}

// Results whose dtype a PyTorch Meta kernel gives as CUDA computes them, not as
// the CPU does. Batch norm's saved mean and inverse std are float32 for a
// float16/bfloat16 input on CUDA (and Meta), but the CPU keeps the input's dtype
// unless the parameters are float32 (its mixed-type kernel), and its backward
// refuses saved statistics of another dtype.
void alignResultsWithCpuKernel(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> arguments,
                               MetaResult* result) {
  const std::string& name = op.schema().name();
  if (name != "aten::native_batch_norm" && name != "aten::_native_batch_norm_legit" &&
      name != "aten::_native_batch_norm_legit_no_training") {
    return;
  }
  const at::ScalarType input = arguments[0].toTensor().scalar_type();
  if (input != at::kHalf && input != at::kBFloat16) return;
  for (const c10::IValue& parameter : arguments.slice(1)) {
    if (parameter.isTensor() && parameter.toTensor().defined() &&
        parameter.toTensor().scalar_type() == at::kFloat) {
      return;  // the mixed-type kernel: float32 statistics, as Meta says
    }
  }
  for (size_t i = 1; i < result->returns.size(); ++i) {
    for (Layout& layout : result->returns[i].tensors) layout.dtype = input;
  }
}

// PyTorch 2.13 replaces the C++ Meta kernels of most ops with Python
// decompositions (torch/_meta_registrations.py, for FakeTensor), which skip
// checks the CPU kernel makes when it is called: overlap of in-place and
// output arguments, dtypes, broadcast shapes. For a structured op, those
// checks are its C++ meta function, which the CPU kernel runs first; the op's
// CompositeExplicitAutogradNonFunctional kernel (the structured kernel for
// devices without one of their own) runs the same function and then the op's
// out= variant: run that one on meta twins. Returns true if it did.
bool runStructuredMeta(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  constexpr auto kStructured = c10::DispatchKey::CompositeExplicitAutogradNonFunctional;
  if (!op.hasKernelForDispatchKey(kStructured)) return false;
  op.callBoxedForDispatchKey(kStructured, *stack);
  return true;
}

std::optional<MetaResult> runMetaKernel(const c10::OperatorHandle& op,
                                        c10::ArrayRef<c10::IValue> arguments, bool* cacheable) {
  MetaTwins twins;
  torch::jit::Stack meta_args;
  meta_args.reserve(arguments.size());
  for (const c10::IValue& value : arguments) meta_args.push_back(twins.convert(value));
  alignWithCpuKernel(op, meta_args);
  torch::jit::Stack meta_stack = meta_args;
  try {
    // Shape inference is capture's business: it stays out of the user's profiles.
    at::DisableRecordFunctionGuard not_profiled;
    if (!runStructuredMeta(op, &meta_stack)) {
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
  alignResultsWithCpuKernel(op, arguments, &result);
  const auto& schema = op.schema();
  result.written.resize(arguments.size());
  for (size_t i = 0; i < arguments.size(); ++i) {
    const c10::AliasInfo* alias = schema.arguments()[i].alias_info();
    if (!alias || !alias->isWrite()) continue;
    forEachTensor(meta_args[i],
                  [&](const at::Tensor& t) { result.written[i].push_back(layoutOf(t, -1)); });
  }
  return result;
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
  return layout;
}

std::optional<MetaResult> inferMeta(const c10::OperatorHandle& op,
                                    c10::ArrayRef<c10::IValue> arguments) {
  Signature signature(op);
  bool cacheable = true;
  for (const c10::IValue& value : arguments) cacheable = cacheable && signature.add(value);
  MetaCache& cache = metaCache();
  if (cacheable) {
    auto it = cache.find(signature.key());
    if (it != cache.end()) return it->second;
  }
  std::optional<MetaResult> result = runMetaKernel(op, arguments, &cacheable);
  if (result && cacheable) {
    if (cache.size() >= kMaxCachedSignatures) cache.clear();
    cache.emplace(signature.key(), *result);
  }
  return result;
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

}  // namespace poptorch::capture
