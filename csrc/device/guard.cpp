// The device guard for DeviceType::IPU: device switching for DeviceGuard and
// friends. The emulated IPU has one in-order stream per device and no events.
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "device/ipu_device.h"

namespace poptorch::device {
namespace {

struct IpuGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return c10::DeviceType::IPU; }

  c10::Device exchangeDevice(c10::Device d) const override {
    const c10::Device old = getDevice();
    setDevice(d);
    return old;
  }
  c10::Device getDevice() const override { return ipu(currentIndex()); }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.is_ipu(), "expected an ipu device, got ", d);
    if (d.has_index()) setCurrentIndex(d.index());
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.has_index() && d.index() >= 0 && d.index() < deviceCount()) {
      setCurrentIndex(d.index());
    }
  }
  c10::Stream getStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, d);
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    return c10::Stream(c10::Stream::DEFAULT, s.device());
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    return static_cast<c10::DeviceIndex>(poptorch::device::deviceCount());
  }
};

C10_REGISTER_GUARD_IMPL(IPU, IpuGuardImpl);

struct RegisterAllocator {
  RegisterAllocator() { c10::SetAllocator(c10::DeviceType::IPU, allocator()); }
};
RegisterAllocator register_allocator;

}  // namespace
}  // namespace poptorch::device
