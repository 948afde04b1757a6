// The device guard for DeviceType::IPU: device switching for DeviceGuard and
// friends, and PyTorch's generic streams and events (torch.Stream("ipu"),
// torch.Event("ipu")). Every IPU has one in-order queue of work (see
// capture/device_queue.h): its streams are names for that queue, so waiting
// on one stream for another, or on an event, has nothing to wait for.
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <atomic>
#include <chrono>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "capture/device_queue.h"
#include "device/ipu_device.h"

namespace poptorch::device {
namespace {

// The stream each IPU's work is on, per thread, as exchangeStream sets it.
thread_local absl::flat_hash_map<c10::DeviceIndex, c10::StreamId> current_streams;

// A recorded point of the queue: the host time at which the work queued
// before it had run.
struct IpuEvent {
  std::optional<std::chrono::steady_clock::time_point> reached;
};

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
  c10::DeviceIndex deviceCount() const noexcept override {
    return static_cast<c10::DeviceIndex>(poptorch::device::deviceCount());
  }

  // Streams ------------------------------------------------------------------
  c10::Stream getStream(c10::Device d) const override {
    const c10::Device device = withIndex(d);
    auto it = current_streams.find(device.index());
    return c10::Stream(c10::Stream::UNSAFE, device, it == current_streams.end() ? 0 : it->second);
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, withIndex(d));
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool /*high_priority*/) const override {
    return getNewStream(d, 0);
  }
  // Priorities are accepted: one queue has no order but its own.
  c10::Stream getNewStream(c10::Device d, int /*priority*/) const override {
    static std::atomic<c10::StreamId> next_id{1};
    return c10::Stream(c10::Stream::UNSAFE, withIndex(d), next_id++);
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    const c10::Stream old = getStream(s.device());
    current_streams[old.device_index()] = s.id();
    return old;
  }
  bool queryStream(const c10::Stream& /*stream*/) const override { return capture::queueIsIdle(); }
  // These raise what the work raised, as CUDA's synchronize gives a kernel's error.
  void synchronizeStream(const c10::Stream& /*stream*/) const override { capture::synchronize(); }
  void synchronizeDevice(c10::DeviceIndex /*index*/) const override { capture::synchronize(); }

  // Events -------------------------------------------------------------------
  // Recording runs the work queued before the event, so that the event's time
  // is when that work was done (what elapsed_time measures). An error of that
  // work is raised by the next sync point: recording is asynchronous.
  void record(void** event, const c10::Stream& stream, c10::DeviceIndex /*index*/,
              c10::EventFlag /*flag*/) const override {
    TORCH_CHECK(stream.device_type() == c10::DeviceType::IPU, "an ipu event records on an ipu ",
                "stream, got a stream of ", stream.device());
    if (*event == nullptr) *event = new IpuEvent();  // owned by PyTorch: destroyEvent
    capture::runPendingWork();
    static_cast<IpuEvent*>(*event)->reached = std::chrono::steady_clock::now();
  }
  void destroyEvent(void* event, c10::DeviceIndex /*index*/) const noexcept override {
    delete static_cast<IpuEvent*>(event);
  }
  // The queue is in order: work queued after the event runs after it anyway.
  void block(void* /*event*/, const c10::Stream& /*stream*/) const override {}
  // A recorded event is reached when it is recorded.
  bool queryEvent(void* /*event*/) const override { return true; }
  void synchronizeEvent(void* /*event*/) const override {}
  double elapsedTime(void* start, void* end, c10::DeviceIndex /*index*/) const override {
    // c10::Event checked that both were created with timing and recorded.
    const auto* from = static_cast<const IpuEvent*>(start);
    const auto* to = static_cast<const IpuEvent*>(end);
    TORCH_CHECK(from != nullptr && to != nullptr && from->reached && to->reached,
                "Both events must be recorded before calculating elapsed time.");
    return std::chrono::duration<double, std::milli>(*to->reached - *from->reached).count();
  }

 private:
  c10::Device withIndex(c10::Device d) const { return d.has_index() ? d : getDevice(); }
};

C10_REGISTER_GUARD_IMPL(IPU, IpuGuardImpl);

struct RegisterAllocator {
  RegisterAllocator() { c10::SetAllocator(c10::DeviceType::IPU, allocator()); }
};
RegisterAllocator register_allocator;

}  // namespace
}  // namespace poptorch::device
