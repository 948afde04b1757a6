#include "device/ipu_tensor.h"

#include <ATen/EmptyTensor.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/TensorImpl.h>
#include <torch/csrc/autograd/function.h>

#include <cstring>
#include <utility>

#include "common/metrics.h"
#include "device/ipu_device.h"
#include "profiling/profiler.h"

namespace poptorch::device {

namespace {
thread_local bool float64_scalars_allowed = false;
thread_local bool float64_intermediates = false;

// Integer tensors compute in the default dtype (`a / b`, `a.lt_(0.5)`), where
// the user asked for no float64 tensor.
const char* defaultDtypeHint() {
  return c10::get_default_dtype() == caffe2::TypeMeta::Make<double>()
             ? " torch.get_default_dtype() is torch.float64, in which ops of integer tensors "
               "compute: set it to torch.float32 (torch.set_default_dtype)."
             : "";
}

// Whether the autograd engine is applying one of PyTorch's own derivative formulas
// (a generated node, a TraceableFunction; custom Functions, whose backward is the
// user's code, and AccumulateGrad are not; is_traceable() would ask a Python node's
// class, so the type is asked instead). Some compute in float64 for float32 inputs: renorm's
// backward takes its norms in at::toAccumulateType(float, device), float64 on every
// device but CUDA and MPS, and linalg.lstsq's backward calls linalg.pinv, whose
// tolerances are float64. Those tensors are the formula's own: the engine casts the
// gradients it returns to the inputs' dtypes before any hook or .grad sees them, so the
// user never holds one; the host kernels compute them as the CPU does.
bool inDerivativeFormula() {
  const auto node = torch::autograd::get_current_node();
  return dynamic_cast<const torch::autograd::TraceableFunction*>(node.get()) != nullptr;
}
}  // namespace

Float64Intermediates::Float64Intermediates()
    : previous_(std::exchange(float64_intermediates, true)) {}

Float64Intermediates::~Float64Intermediates() { float64_intermediates = previous_; }

bool setFloat64ScalarsAllowed(bool allowed) {
  return std::exchange(float64_scalars_allowed, allowed);
}

bool isUnsupportedDtype(c10::ScalarType dtype) {
  return dtype == c10::ScalarType::Double || dtype == c10::ScalarType::ComplexDouble;
}

std::string unsupportedDtypeMessage(c10::ScalarType dtype) {
  return c10::str("ipu tensors cannot hold ", c10::toString(dtype),
                  ": IPUs have no 64-bit floating point. Use float32 (tensor.float(), "
                  "model.float()) or complex64 before moving to the ipu.",
                  defaultDtypeHint());
}

void checkSupportedDtype(c10::ScalarType dtype, bool scalar) {
  if (!isUnsupportedDtype(dtype)) return;
  if ((scalar && float64_scalars_allowed) || float64_intermediates || inDerivativeFormula()) {
    return;
  }
  TORCH_CHECK_TYPE(false, unsupportedDtypeMessage(dtype));
}

at::Tensor emptyIpuTensor(c10::IntArrayRef sizes, c10::IntArrayRef strides, c10::ScalarType dtype,
                          int index, int64_t storage_offset) {
  checkSupportedDtype(dtype, sizes.empty());
  const size_t itemsize = c10::elementSize(dtype);
  const size_t nbytes = at::detail::computeStorageNbytes(sizes, strides, itemsize, storage_offset);
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes, allocateLazy(nbytes, index),
                       allocator(), /*resizable=*/true);
  return ipuView(storage, sizes, strides, storage_offset, dtype);
}

at::Tensor ipuView(const c10::Storage& storage, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                   int64_t storage_offset, c10::ScalarType dtype) {
  auto impl = c10::make_intrusive<c10::TensorImpl>(c10::Storage(storage),
                                                   c10::DispatchKeySet(c10::DispatchKey::IPU),
                                                   c10::scalarTypeToTypeMeta(dtype));
  impl->set_sizes_and_strides(sizes, strides, storage_offset);
  return at::Tensor(std::move(impl));
}

at::Tensor uploadToIpu(const at::Tensor& host, int index) {
  const at::Tensor source = host.contiguous();
  at::Tensor result = emptyIpuTensor(source.sizes(), source.strides(), source.scalar_type(), index);
  c10::StorageImpl* storage = result.storage().unsafeGetStorageImpl();
  materialize(*storage);
  const size_t nbytes = source.nbytes();
  const profiling::TransferSpan span(profiling::Kind::kToIpu, static_cast<int64_t>(nbytes), index);
  if (nbytes > 0) std::memcpy(storage->mutable_data(), source.const_data_ptr(), nbytes);
  Metrics::get().bytesToIpu(static_cast<int64_t>(nbytes));
  return result;
}

}  // namespace poptorch::device
