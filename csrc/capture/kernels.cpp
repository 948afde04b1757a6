// Explicit ipu kernels for the operators a backend must provide itself
// (factories, views, resizing, copies across devices, reading a value), and
// the registration of the IPU dispatch keys.
#include <ATen/EmptyTensor.h>
#include <ATen/ExpandUtils.h>
#include <ATen/InferSize.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/native/Resize.h>
#include <ATen/native/ResizeCommon.h>
#include <ATen/native/TensorFactories.h>
#include <ATen/ops/_batch_norm_impl_index_native.h>
#include <ATen/ops/_fused_sdp_choice.h>
#include <ATen/ops/_fused_sdp_choice_ops.h>
#include <ATen/ops/_local_scalar_dense.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu.h>
#include <ATen/ops/_to_copy_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/copy_native.h>
#include <ATen/ops/empty_like_native.h>
#include <ATen/ops/is_set_to_native.h>
#include <ATen/ops/kaiser_window.h>
#include <ATen/ops/native_group_norm.h>
#include <ATen/ops/scaled_dot_product_attention_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/MemoryFormat.h>
#include <c10/util/strides.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/library.h>

#include "capture/capture.h"
#include "capture/pending_graph.h"
#include "capture/step_capture.h"
#include "capture/unboxed.h"
#include "common/metrics.h"
#include "common/storage_overlap.h"
#include "common/user_errors.h"
#include "device/ipu_device.h"
#include "device/ipu_tensor.h"
#include "kernels/own_kernels.h"
#include "profiling/profiler.h"
#include "runtime/executor.h"
#include "runtime/worker.h"

namespace poptorch::capture {
namespace {

int deviceIndexOf(std::optional<c10::Device> device) {
  if (!device || !device->has_index()) return device::currentIndex();
  TORCH_CHECK(device->is_ipu(), "expected an ipu device, got ", *device);
  device::checkIndex(device->index());
  return device->index();
}

c10::ScalarType dtypeOf(std::optional<c10::ScalarType> dtype) {
  return dtype.value_or(c10::get_default_dtype_as_scalartype());
}

void checkStrided(std::optional<c10::Layout> layout) {
  POPTORCH_CHECK_SUPPORTED(!layout || *layout == c10::kStrided, "ipu tensors are strided; layout ",
                           *layout, " is not supported");
}

// The strides of a new (or resized) tensor, with the checks the CPU's
// TensorImpl::empty_tensor_restride makes: get_channels_last_strides_2d also
// takes 3 dims (and _3d 4), where the CPU refuses every rank but 4 (and 5).
c10::DimVector stridesFor(c10::IntArrayRef sizes, c10::MemoryFormat format) {
  std::vector<int64_t> strides;
  switch (format) {
    case c10::MemoryFormat::Contiguous:
      return c10::contiguous_strides(sizes);
    case c10::MemoryFormat::ChannelsLast:
      TORCH_CHECK(sizes.size() == 4, "required rank 4 tensor to use channels_last format");
      strides = c10::get_channels_last_strides_2d(sizes);
      break;
    case c10::MemoryFormat::ChannelsLast3d:
      TORCH_CHECK(sizes.size() == 5, "required rank 5 tensor to use channels_last_3d format");
      strides = c10::get_channels_last_strides_3d(sizes);
      break;
    default:
      TORCH_CHECK(false, "unsupported memory format ", format);
  }
  return c10::DimVector(strides.begin(), strides.end());
}

// Under torch.use_deterministic_algorithms, new memory reads as NaN (or the
// largest integer), as on the CPU.
bool fillsNewMemory() {
  return at::globalContext().deterministicAlgorithms() &&
         at::globalContext().deterministicFillUninitializedMemory();
}

at::Tensor filledIfDeterministic(at::Tensor tensor) {
  if (fillsNewMemory()) at::native::fill_empty_deterministic_(tensor);
  return tensor;
}

// The CPU's allocator warns when it makes a complex32 tensor
// (at::detail::empty_generic: "ComplexHalf support is experimental", once per
// process unless torch.set_warn_always). The ipu's factories do not go
// through it, so they have it warn: an empty Meta tensor allocates nothing,
// and shares the CPU's once-per-process flag, which a Meta kernel run to infer
// shapes may have used already.
void warnIfComplexHalf(c10::ScalarType dtype) {
  if (dtype == c10::kComplexHalf) at::detail::empty_meta({0}, dtype);
}

at::Tensor empty(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                 std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                 std::optional<bool>, std::optional<c10::MemoryFormat> memory_format) {
  checkStrided(layout);
  at::detail::check_size_nonnegative(size);
  warnIfComplexHalf(dtypeOf(dtype));
  const auto format = memory_format.value_or(c10::MemoryFormat::Contiguous);
  return filledIfDeterministic(device::emptyIpuTensor(size, stridesFor(size, format),
                                                      dtypeOf(dtype), deviceIndexOf(device)));
}

at::Tensor emptyStrided(c10::IntArrayRef size, c10::IntArrayRef stride,
                        std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
                        std::optional<c10::Device> device, std::optional<bool>) {
  checkStrided(layout);
  at::detail::check_size_nonnegative(size);
  warnIfComplexHalf(dtypeOf(dtype));
  return filledIfDeterministic(
      device::emptyIpuTensor(size, stride, dtypeOf(dtype), deviceIndexOf(device)));
}

// PyTorch keeps a tensor's layout in `_to_copy` and `empty_like` (memory
// format "preserve") only on devices that "support as_strided", a list that
// leaves the IPU out (c10::Device::supports_as_strided): `.to("ipu")`,
// `.half()` of a transposed tensor or `clone()` of a strided slice would come
// back contiguous where the CPU keeps the layout, and a later `.view()` would
// succeed on one device and fail on the other. Ipu tensors are as strided as
// the CPU's, so these keep layouts as the CPU does: the same strides for a
// dense tensor, dense strides in the same order otherwise.
c10::DimVector layoutPreservingStrides(const at::Tensor& self) {
  if (self.is_non_overlapping_and_dense()) return c10::DimVector(self.strides());
  const std::vector<int64_t> dense = at::infer_dense_strides(self.sizes(), self.strides());
  return c10::DimVector(dense.begin(), dense.end());
}

std::optional<c10::DimVector> preservedStrides(const at::Tensor& self, c10::Device target,
                                               std::optional<c10::MemoryFormat> memory_format) {
  if (!target.is_ipu() || self.layout() != c10::kStrided || self.is_quantized() ||
      memory_format.value_or(c10::MemoryFormat::Preserve) != c10::MemoryFormat::Preserve) {
    return std::nullopt;
  }
  return layoutPreservingStrides(self);
}

at::Tensor toCopy(const at::Tensor& self, std::optional<c10::ScalarType> dtype,
                  std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                  std::optional<bool> pin_memory, bool non_blocking,
                  std::optional<c10::MemoryFormat> memory_format) {
  const auto strides = preservedStrides(self, device.value_or(self.device()), memory_format);
  if (!strides || (layout && *layout != c10::kStrided)) {
    return at::native::_to_copy(self, dtype, layout, device, pin_memory, non_blocking,
                                memory_format);
  }
  at::Tensor result = emptyStrided(self.sizes(), *strides, dtype.value_or(self.scalar_type()),
                                   layout, device.value_or(self.device()), pin_memory);
  result.copy_(self, non_blocking);
  return result;
}

at::Tensor emptyLike(const at::Tensor& self, std::optional<c10::ScalarType> dtype,
                     std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                     std::optional<bool> pin_memory,
                     std::optional<c10::MemoryFormat> memory_format) {
  const auto strides = preservedStrides(self, device.value_or(self.device()), memory_format);
  if (!strides || (layout && *layout != c10::kStrided)) {
    return at::native::empty_like(self, dtype, layout, device, pin_memory, memory_format);
  }
  return emptyStrided(self.sizes(), *strides, dtype.value_or(self.scalar_type()), layout,
                      device.value_or(self.device()), pin_memory);
}

// Grows `self`'s storage to hold `sizes` x `strides` at its offset.
void ensureCapacity(const at::Tensor& self, c10::IntArrayRef sizes, c10::IntArrayRef strides) {
  c10::StorageImpl* storage = self.storage().unsafeGetStorageImpl();
  const size_t nbytes =
      at::detail::computeStorageNbytes(sizes, strides, self.itemsize(), self.storage_offset());
  if (nbytes <= storage->nbytes()) return;
  auto lock = PendingGraph::get().lock();
  runtime::Worker::get().waitIdle();  // queued programs may still use the old bytes
  device::growStorage(*storage, nbytes);
  PendingGraph::get().noteResize(storage);
}

// As the CPU's resize_: a tensor that has the size asked for, and no memory
// format asked, keeps its strides (full(out=view) writes through the view).
const at::Tensor& resizeIpu(const at::Tensor& self, c10::IntArrayRef size,
                            std::optional<c10::MemoryFormat> memory_format) {
  at::detail::check_size_nonnegative(size);
  if (!memory_format && self.sizes().equals(size)) return self;
  const auto strides = stridesFor(size, memory_format.value_or(c10::MemoryFormat::Contiguous));
  const auto old_nbytes = static_cast<int64_t>(self.storage().nbytes());
  ensureCapacity(self, size, strides);
  self.unsafeGetTensorImpl()->set_sizes_and_strides(size, strides);
  if (fillsNewMemory()) at::native::fill_resize_deterministic_(self, old_nbytes);
  return self;
}

at::Tensor& setStorage(at::Tensor& self, c10::Storage source, int64_t offset, c10::IntArrayRef size,
                       c10::IntArrayRef stride) {
  TORCH_CHECK(source.device().is_ipu(), "set_: expected an ipu storage, got one on ",
              source.device());
  at::native::checkSetStorage(self, source, offset, size, stride);
  self.unsafeGetTensorImpl()->set_storage_keep_dtype(std::move(source));
  // No strides (`t.set_(storage, offset, size)`) means contiguous, as on the CPU.
  const c10::DimVector strides =
      stride.empty() ? c10::contiguous_strides(size) : c10::DimVector(stride);
  self.unsafeGetTensorImpl()->set_sizes_and_strides(size, strides, offset);
  return self;
}

at::Tensor& setStorageWhole(at::Tensor& self, c10::Storage source) {
  const int64_t numel = static_cast<int64_t>(source.nbytes() / self.itemsize());
  return setStorage(self, std::move(source), 0, {numel}, {1});
}

at::Tensor& setTensor(at::Tensor& self, const at::Tensor& source) {
  if (self.is_same(source)) return self;
  return setStorage(self, source.storage(), source.storage_offset(), source.sizes(),
                    source.strides());
}

at::Tensor& setEmpty(at::Tensor& self) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0,
                       device::allocateLazy(0, self.device().index()), device::allocator(),
                       /*resizable=*/true);
  return setStorage(self, std::move(storage), 0, {0}, {1});
}

const c10::OperatorHandle& copyOp() {
  static const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow("aten::copy_", "");
  return op;
}

// The CPU's copy_ refuses a destination with several elements at one place,
// or one sharing only part of its bytes with the source (its TensorIterator
// refuses a partial overlap; the same bytes in the same order, even of
// another dtype as in t.copy_(t.view(torch.int32)), are read and written
// element by element). Meta tensors have no memory to compare, so capture
// checks the ipu tensors' storages (PyTorch's check reads data pointers,
// which a lazy storage lacks).
void checkCopyOverlap(const at::Tensor& dst, const at::Tensor& src) {
  TORCH_CHECK(at::has_internal_overlap(dst) != at::MemOverlap::Yes,
              "unsupported operation: more than one element of the written-to tensor refers to "
              "a single memory location. Please clone() the tensor before performing the "
              "operation.");
  TORCH_CHECK(storageOverlap(dst, src) != at::MemOverlapStatus::Partial,
              "unsupported operation: some elements of the input tensor and the written-to "
              "tensor refer to a single memory location. Please clone() the tensor before "
              "performing the operation.");
}

// Records dst.copy_(src) for two ipu tensors.
void captureCopy(const at::Tensor& dst, const at::Tensor& src) {
  checkCopyOverlap(dst, src);
  {
    const BorrowedArguments arguments(dst, src, false);
    if (captureBorrowed(copyOp(), arguments.values(), /*allow_several_ipus=*/true)) return;
  }
  torch::jit::Stack stack{dst, src, false};
  const bool captured = captureOp(copyOp(), &stack, /*allow_several_ipus=*/true);
  TORCH_INTERNAL_ASSERT(captured, "copy_ between ipu tensors could not be captured");
}

void upload(const at::Tensor& cpu_src, const at::Tensor& ipu_dst) {
  {
    auto lock = PendingGraph::get().lock();
    c10::StorageImpl* storage = ipu_dst.storage().unsafeGetStorageImpl();
    // Nothing pending touches the destination: write it now.
    if (!PendingGraph::get().references(storage)) {
      runtime::Worker::get().waitIdle();  // queued programs may still read it
      device::materialize(*storage);
      const profiling::TransferSpan span(profiling::Kind::kToIpu, cpu_src.nbytes(),
                                         ipu_dst.device().index());
      runtime::hostAlias(ipu_dst).copy_(cpu_src);
      Metrics::get().bytesToIpu(static_cast<int64_t>(cpu_src.nbytes()));
      return;
    }
  }
  // Otherwise the copy takes its place in the graph, from a snapshot of the
  // host data (the caller may change it before the graph runs), converted to
  // the destination's dtype as copy_ converts it (`x.copy_(2.0)` copies from a
  // float64 scalar, which the ipu cannot hold).
  const at::Tensor source =
      cpu_src.scalar_type() == ipu_dst.scalar_type() ? cpu_src : cpu_src.to(ipu_dst.scalar_type());
  captureCopy(ipu_dst, device::uploadToIpu(source, ipu_dst.device().index()));
}

void download(const at::Tensor& ipu_src, const at::Tensor& cpu_dst) {
  auto lock = PendingGraph::get().lock();
  if (capturingStep()) {
    cpu_dst.copy_(readForHost(ipu_src));
    return;
  }
  PendingGraph::get().flush();
  device::materialize(*ipu_src.storage().unsafeGetStorageImpl());
  const profiling::TransferSpan span(profiling::Kind::kFromIpu, ipu_src.nbytes(),
                                     ipu_src.device().index());
  cpu_dst.copy_(runtime::hostAlias(ipu_src));
  Metrics::get().bytesFromIpu(static_cast<int64_t>(ipu_src.nbytes()));
}

// Whether dst.copy_(src) would copy each element onto itself: the CPU's copy_
// returns before any check then (even for a destination with several elements
// at one place), but redispatches another device's copy to _copy_from first.
bool isSameData(const at::Tensor& dst, const at::Tensor& src) {
  return dst.is_alias_of(src) && dst.storage_offset() == src.storage_offset() &&
         dst.strides().equals(src.strides()) && dst.sizes().equals(src.sizes()) &&
         dst.scalar_type() == src.scalar_type() && dst.is_conj() == src.is_conj() &&
         dst.is_neg() == src.is_neg();
}

at::Tensor copyFrom(const at::Tensor& self, const at::Tensor& dst, bool) {
  if (self.is_ipu() && dst.is_ipu()) {
    if (!isSameData(dst, self)) captureCopy(dst, self);
  } else if (dst.is_ipu()) {
    TORCH_CHECK(self.is_cpu(), "cannot copy from ", self.device(), " to ", dst.device());
    upload(self, dst);
  } else {
    TORCH_CHECK(dst.is_cpu(), "cannot copy from ", self.device(), " to ", dst.device());
    download(self, dst);
  }
  return dst;
}

// The host fallback's copy of a result into an out= tensor the host kernel
// resized or restrided: the out tensor takes the host result's layout, as it
// has on the CPU (linalg kernels resize their outputs column-major; geqrf
// restrides an empty out= tensor of the right size column-major). The host
// kernel ran on a copy of `dst` (PyTorch's `.cpu()`, which preserves layouts
// as layoutPreservingStrides does): strides it left as that copy had them
// were kept, so `dst` keeps its own (a strided view stays one, as on the CPU).
at::Tensor copyFromAndResize(const at::Tensor& self, const at::Tensor& dst) {
  const bool resized = !dst.sizes().equals(self.sizes());
  const bool restrided = !resized && !self.strides().equals(layoutPreservingStrides(dst));
  if ((resized || restrided) && at::has_internal_overlap(self) != at::MemOverlap::Yes) {
    ensureCapacity(dst, self.sizes(), self.strides());
    dst.unsafeGetTensorImpl()->set_sizes_and_strides(self.sizes(), self.strides());
  } else if (resized) {
    resizeIpu(dst, self.sizes(), std::nullopt);
  }
  return copyFrom(self, dst, false);
}

c10::Scalar localScalarDense(const at::Tensor& self) {
  auto lock = PendingGraph::get().lock();
  if (capturingStep()) return at::_local_scalar_dense(readForHost(self));
  PendingGraph::get().flush();
  device::materialize(*self.storage().unsafeGetStorageImpl());
  Metrics::get().bytesFromIpu(static_cast<int64_t>(self.itemsize()));
  return at::_local_scalar_dense(runtime::hostAlias(self));
}

// Which fused attention kernel suits these inputs. The ipu runs the CPU's
// kernels, so it answers as the CPU does (its choice reads only shapes,
// strides, dtypes and flags).
int64_t fusedSdpChoice(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                       const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                       std::optional<double> scale, bool enable_gqa) {
  return at::_ops::_fused_sdp_choice::redispatch(c10::DispatchKeySet(c10::DispatchKey::CPU), query,
                                                 key, value, attn_mask, dropout_p, is_causal, scale,
                                                 enable_gqa);
}

// PyTorch's scaled_dot_product_attention picks its fused kernel through a
// per-device table that has no ipu entry, so on the ipu it would always take
// the unfused math path (about 2.5x slower for a small encoder's attention).
// Where the CPU would run its flash kernel, so does the ipu; the math path
// stays for everything else (dropout, boolean masks, odd shapes, a mask that
// requires grad). The choice is asked of the CPU's kernel directly, as the
// CPU's attention calls its choice stub: through the dispatcher, a tensor
// subclass (composite compliance's wrappers) would answer for its unwrapped
// elements, which do not require grad, and the flash kernel has no mask gradient.
at::Tensor scaledDotProductAttention(const at::Tensor& query, const at::Tensor& key,
                                     const at::Tensor& value,
                                     const std::optional<at::Tensor>& attn_mask, double dropout_p,
                                     bool is_causal, std::optional<double> scale, bool enable_gqa) {
  constexpr int64_t kFlashAttention = 1;  // sdp::SDPBackend::flash_attention
  const bool boolean_mask = attn_mask && attn_mask->scalar_type() == at::kBool;
  if (!boolean_mask && !enable_gqa &&
      fusedSdpChoice(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa) ==
          kFlashAttention) {
    return std::get<0>(at::_scaled_dot_product_flash_attention_for_cpu(
        query, key, value, dropout_p, is_causal, attn_mask, scale));
  }
  return at::native::scaled_dot_product_attention(query, key, value, attn_mask, dropout_p,
                                                  is_causal, scale, enable_gqa);
}

// CUDA's record_stream keeps a tensor's memory from reuse until the work
// queued on another stream has run. An emulated IPU has one queue, and a
// pending graph holds the tensors it reads, so there is nothing to keep.
void recordStream(at::Tensor& /*self*/, c10::Stream stream) {
  TORCH_CHECK(stream.device_type() == c10::DeviceType::IPU,
              "record_stream: an ipu tensor takes a stream of the ipu (torch.ipu.Stream or "
              "torch.ipu.current_stream()), got a stream of ",
              stream.device());
}

// PyTorch's copy-on-write clone (torch._lazy_clone) shares a storage whose
// DataPtr's context is its data; an ipu storage's context is its lazily
// materialised block, which the generic kernel refused ("Expected storage !=
// nullptr"). The ipu's lazy clone is an eager one: the same values, in a
// storage of its own.
at::Tensor lazyClone(const at::Tensor& self) { return self.clone(); }

// `module.to(device)` keeps its Parameter objects (so tied weights stay tied
// and an optimiser made before the move keeps training the model) only when
// this says `param.data = moved` may swap the TensorImpl's contents; PyTorch's
// answer lists its dense in-tree devices but not the IPU, so modules moved to or
// from the ipu got new Parameters. An ipu tensor is a plain strided TensorImpl,
// so dense tensors of the CPU (or another dense device) and the ipu are as
// compatible as the CPU's and CUDA's are.
bool hasCompatibleShallowCopyType(const at::Tensor& self, const at::Tensor& from) {
  const auto is_dense = [](c10::DispatchKeySet keys) {
    constexpr auto kDenseBackends =
        c10::DispatchKeySet({c10::BackendComponent::CPUBit, c10::BackendComponent::CUDABit,
                             c10::BackendComponent::MPSBit, c10::BackendComponent::HIPBit,
                             c10::BackendComponent::XPUBit, c10::BackendComponent::HPUBit,
                             c10::BackendComponent::MTIABit, c10::BackendComponent::IPUBit});
    return keys.has(c10::DispatchKey::Dense) && keys.has_any(kDenseBackends);
  };
  return self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set()) ||
         (is_dense(self.key_set()) && is_dense(from.key_set()));
}

// group_norm's generic kernel keeps a channels-last input's layout only on the
// CPU (and PrivateUse1 devices); on others it makes the input contiguous
// first. The ipu runs the CPU's kernels, so it takes the CPU's branch. The
// arguments are checked by native_group_norm, as on the CPU.
at::Tensor groupNorm(const at::Tensor& input, int64_t num_groups,
                     const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                     double eps, bool /*cudnn_enabled*/) {
  auto contiguous = [](const std::optional<at::Tensor>& t) -> std::optional<at::Tensor> {
    if (!t || !t->defined()) return std::nullopt;
    return t->contiguous();
  };
  const int64_t hxw = c10::multiply_integers(input.sizes().slice(2));
  return std::get<0>(at::native_group_norm(input.contiguous(input.suggest_memory_format()),
                                           contiguous(weight), contiguous(bias), input.size(0),
                                           input.size(1), hxw, num_groups, eps));
}

// batch_norm's generic kernel makes the saved statistics of an empty batch in
// the host's accumulate type, float64 for float32 (on CUDA, float32), which an
// ipu tensor cannot hold: F.batch_norm of an empty batch raised a TypeError.
// Nothing reads those statistics (the backward of an empty batch sums its
// gradients), so the ipu makes them in the input's dtype; the output is the
// generic kernel's, input * weight[0] + bias[0]. An empty 1-d input has no
// feature dimension: the generic kernel reads a size past its one (the CPU's
// statistics come out with no elements), so the ipu's have none.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, int64_t> batchNormImplIndex(
    const at::Tensor& input, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& running_mean,
    const std::optional<at::Tensor>& running_var, bool training, double momentum, double eps,
    bool cudnn_enabled) {
  if (input.numel() != 0) {
    return at::native::_batch_norm_impl_index(input, weight, bias, running_mean, running_var,
                                              training, momentum, eps, cudnn_enabled);
  }
  at::Tensor out = input.clone();
  if (weight && weight->defined()) out = out.mul((*weight)[0]);
  if (bias && bias->defined()) out = out.add((*bias)[0]);
  const int64_t features = input.dim() >= 2 ? input.size(1) : 0;
  const at::Tensor statistics = at::empty({features}, input.options());
  return {out, statistics, statistics.clone(), at::empty({0}, input.options().dtype(at::kByte)), 0};
}

// PyTorch's ZeroTensor has no storage, so a graph cannot hold it as an input:
// the CPU kernel run for the ipu made one the next op read as a host tensor
// (autograd adding sgn's zero gradient to another failed). The ipu's is a
// materialised zero tensor, equal in value; ZeroTensor only saves memory.
at::Tensor efficientZeroTensor(c10::SymIntArrayRef size, std::optional<at::ScalarType> dtype,
                               std::optional<at::Layout> layout, std::optional<at::Device> device,
                               std::optional<bool> pin_memory) {
  return at::zeros_symint(size, dtype, layout, device, pin_memory);
}

// kaiser_window's generic kernel fills the window through a kernel PyTorch
// registers per device type (a DispatchStub) for the CPU, CUDA and MPS only:
// on the ipu it raised "DispatchStub: unsupported device type". The window
// depends on the arguments alone, so it is made on the host and copied to the
// ipu, as a tensor made from host data is.
at::Tensor kaiserWindow(int64_t window_length, bool periodic, double beta,
                        std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                        std::optional<at::Device> device, std::optional<bool> pin_memory) {
  const c10::Device ipu(c10::DeviceType::IPU, deviceIndexOf(device));
  return at::kaiser_window(window_length, periodic, beta, dtype, layout, c10::Device(c10::kCPU),
                           pin_memory)
      .to(ipu);
}

// Its other overloads call the generic kernel directly, with PyTorch's defaults.
at::Tensor kaiserWindowPeriodic(int64_t window_length, bool periodic,
                                std::optional<at::ScalarType> dtype,
                                std::optional<at::Layout> layout, std::optional<at::Device> device,
                                std::optional<bool> pin_memory) {
  return kaiserWindow(window_length, periodic, /*beta=*/12.0, dtype, layout, device, pin_memory);
}

at::Tensor kaiserWindowDefault(int64_t window_length, std::optional<at::ScalarType> dtype,
                               std::optional<at::Layout> layout, std::optional<at::Device> device,
                               std::optional<bool> pin_memory) {
  return kaiserWindowPeriodic(window_length, /*periodic=*/true, dtype, layout, device, pin_memory);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, IPU, m) {
  m.impl("empty.memory_format", TORCH_FN(empty));
  m.impl("empty_strided", TORCH_FN(emptyStrided));
  m.impl("empty_like", TORCH_FN(emptyLike));
  m.impl("_to_copy", TORCH_FN(toCopy));
  m.impl("as_strided", TORCH_FN(at::native::as_strided_tensorimpl));
  m.impl("view", TORCH_FN(at::native::view));
  m.impl("_reshape_alias", TORCH_FN(at::native::_reshape_alias));
  m.impl("resize_", TORCH_FN(resizeIpu));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(setStorage));
  m.impl("set_.source_Storage", TORCH_FN(setStorageWhole));
  m.impl("set_.source_Tensor", TORCH_FN(setTensor));
  m.impl("set_", TORCH_FN(setEmpty));
  // Compares storages, offsets, sizes and strides: metadata only. On the host
  // (where an op without a kernel runs) the operands are copies, never set to
  // each other.
  m.impl("is_set_to", TORCH_FN(at::native::is_set_to));
  m.impl("_copy_from", TORCH_FN(copyFrom));
  m.impl("_copy_from_and_resize", TORCH_FN(copyFromAndResize));
  m.impl("_local_scalar_dense", TORCH_FN(localScalarDense));
  m.impl("_fused_sdp_choice", TORCH_FN(fusedSdpChoice));
  m.impl("scaled_dot_product_attention", TORCH_FN(scaledDotProductAttention));
  m.impl("_has_compatible_shallow_copy_type", TORCH_FN(hasCompatibleShallowCopyType));
  m.impl("group_norm", TORCH_FN(groupNorm));
  m.impl("_batch_norm_impl_index", TORCH_FN(batchNormImplIndex));
  m.impl("record_stream", TORCH_FN(recordStream));
  m.impl("_lazy_clone", TORCH_FN(lazyClone));
  m.impl("_efficientzerotensor", TORCH_FN(efficientZeroTensor));
  m.impl("kaiser_window", TORCH_FN(kaiserWindowDefault));
  m.impl("kaiser_window.periodic", TORCH_FN(kaiserWindowPeriodic));
  m.impl("kaiser_window.beta", TORCH_FN(kaiserWindow));
}

// Host tensors copied to the ipu keep their layout too (see preservedStrides).
TORCH_LIBRARY_IMPL(aten, CPU, m) { m.impl("_to_copy", TORCH_FN(toCopy)); }

// Ops with a host (CPU) kernel and also a generic math kernel for other
// devices would get the math version on the ipu, which computes differently
// from the CPU and captures as several nodes (mish_backward's decomposition
// rounds each step in bfloat16, the CPU's kernel once). Capture them as they
// are instead; likewise convolution, whose generic kernel dispatches by device,
// mode, whose generic kernel refuses devices other than CPU, CUDA and XPU,
// conj_physical_, whose generic kernel calls the CPU's out= kernel directly
// (a per-device-type kernel: "DispatchStub: unsupported device type ipu"), and
// ldexp, whose generic kernel (its only one) calls a per-device-type kernel
// (std::ldexp) for the CPU and CUDA and else multiplies by 2 ** other computed
// in the input's dtype: a float16 input underflowed or overflowed where the
// CPU's did not (2 ** -25, 2 ** 20). _grouped_mm's generic kernel (its only
// one) copies the group offsets to the host to multiply group by group: on the
// ipu a value read on the host, which specialised a wrapped mixture-of-experts
// model's step on each batch's routing (a new variant per batch); its output's
// shape depends on no value, so it captures whole (in lazy mode bfloat16 only:
// PyTorch's Meta kernel refuses the CPU's float32, which then runs on the host).
// _safe_softmax (attention's math path) has only a generic kernel, four ops on
// any device; whole, passes::useOwnKernels runs it as one (the CPU's values):
// kernels/own_kernels.h lists such ops.
namespace {
bool capturedWholeForOwnKernel(const c10::OperatorName& name) {
  return name.overload_name.empty() && kernels::atenCapturedWhole(name.name);
}

bool genericKernelDispatchesByDevice(const c10::OperatorName& name) {
  if (name.name == "aten::convolution" || name.name == "aten::convolution_backward" ||
      name.name == "aten::ldexp" || name.name == "aten::ldexp_" ||
      name.name == "aten::conj_physical_" || name.name == "aten::_grouped_mm") {
    return true;
  }
  return name.name == "aten::mode" &&
         (name.overload_name.empty() || name.overload_name == "values");
}
}  // namespace

struct CaptureHostKernelOps {
  CaptureHostKernelOps()
      : library(torch::Library::IMPL, "aten", c10::DispatchKey::IPU, __FILE__, __LINE__) {
    // First, so that the loop below leaves their ops alone.
    registerUnboxedKernels(library);
    auto& dispatcher = c10::Dispatcher::singleton();
    for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
      if (name.name.rfind("aten::", 0) != 0) continue;
      const c10::OperatorHandle op = *dispatcher.findOp(name);
      const bool has_math_kernel =
          op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) ||
          op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional) ||
          op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd);
      const bool wanted = (op.hasKernelForDispatchKey(c10::DispatchKey::CPU) && has_math_kernel) ||
                          genericKernelDispatchesByDevice(name) || capturedWholeForOwnKernel(name);
      if (!wanted || op.hasKernelForDispatchKey(c10::DispatchKey::IPU)) continue;
      const std::string qualified = name.overload_name.empty()
                                        ? name.name.substr(6)
                                        : name.name.substr(6) + "." + name.overload_name;
      library.impl(qualified.c_str(), torch::CppFunction::makeFromBoxedFunction<&ipuFallback>());
    }
  }
  torch::Library library;
};
const CaptureHostKernelOps capture_host_kernel_ops;

// Copies read lazily conjugated or negated sources as they are (the kernels
// that finally run honour the bits); resolving them first would recurse.
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}
TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(_, IPU, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&ipuFallback>());
}

// Above autograd, so that the chosen kernel's own derivative is recorded
// (and on the backend key too, for inference mode, which skips autograd):
// these replace generic kernels that would do something else on the ipu.
TORCH_LIBRARY_IMPL(aten, AutogradIPU, m) {
  m.impl("scaled_dot_product_attention", TORCH_FN(scaledDotProductAttention));
  m.impl("_has_compatible_shallow_copy_type", TORCH_FN(hasCompatibleShallowCopyType));
  m.impl("group_norm", TORCH_FN(groupNorm));
  m.impl("_batch_norm_impl_index", TORCH_FN(batchNormImplIndex));
}

// Core registers no autograd fallback for AutogradIPU: operators without an
// autograd formula (custom ops) must still run, and say so if differentiated.
TORCH_LIBRARY_IMPL(_, AutogradIPU, m) {
  m.fallback(torch::autograd::basicAutogradNotImplementedFallback());
}

}  // namespace poptorch::capture
