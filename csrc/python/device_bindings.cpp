// poptorch._C's ipu devices: how many, which is current, their memory and the
// storages of ipu tensors.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "capture/pending_graph.h"
#include "device/ipu_device.h"
#include "device/ipu_tensor.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace poptorch::python {
namespace {

// Python may look at an ipu tensor's storage (serialization, data_ptr(),
// storage copies), and PyTorch refuses a storage with no bytes as "invalid":
// give it host memory now. Nothing runs; reading its values still syncs.
void backStorage(const at::Tensor& tensor) {
  TORCH_CHECK_VALUE(tensor.is_ipu(), "expected an ipu tensor, got one on ", tensor.device());
  if (!tensor.has_storage()) return;  // a wrapper subclass: nothing to back
  auto lock = capture::PendingGraph::get().lock();
  device::materialize(*tensor.storage().unsafeGetStorageImpl());
}

}  // namespace

void bindDevice(py::module& m) {
  // torch.Stream takes the device type as a number.
  m.attr("IPU_DEVICE_TYPE") = static_cast<int>(c10::DeviceType::IPU);
  m.def("device_count", &device::deviceCount);
  m.def("current_device", &device::currentIndex);
  m.def("set_device", &device::setCurrentIndex);
  m.def("check_device", &device::checkIndex, "Raises an IndexError if `index` is not an ipu.");
  m.def("configure_ipus", &device::configure, py::arg("num_ipus"), py::arg("memory_per_ipu"));
  m.def("memory_allocated", &device::memoryAllocated);
  m.def("max_memory_allocated", &device::maxMemoryAllocated);
  m.def("reset_peak_memory_stats", &device::resetPeakMemoryAllocated);
  m.def("memory_capacity", &device::memoryCapacity);
  m.def(
      "account_on",
      [](const at::Tensor& tensor, int ipu, bool streamed) {
        device::accountOn(*tensor.storage().unsafeGetStorageImpl(), ipu, streamed);
      },
      py::arg("tensor"), py::arg("ipu"), py::arg("streamed") = false,
      "Counts the tensor's storage in the memory of ipu `ipu`, or in the streaming memory "
      "attached to it (its device is unchanged).");
  m.def("streaming_memory_allocated", &device::streamingMemoryAllocated, py::arg("ipu"),
        "Bytes in the streaming memory attached to ipu `ipu` (phased execution's weights).");
  m.def("defer_capacity_check", &device::deferCapacityCheck, py::arg("deferred"),
        "Whether this thread's ipu allocations may exceed an IPU's capacity; returns the "
        "previous setting.");
  m.def("set_float64_scalars_allowed", &device::setFloat64ScalarsAllowed,
        "Whether this thread may make 0-dim float64 ipu tensors; returns the previous setting.");
  m.def("back_storage", &backStorage,
        "Gives an ipu tensor's storage host memory (without running anything).");
}

}  // namespace poptorch::python
