// The emulated IPU machine: N virtual IPUs ("ipu:0" ... "ipu:N-1"), each with
// a fixed amount of memory, as on a real IPU-POD. Tensor bytes live in host
// memory; every byte is accounted against the IPU that owns it.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/Device.h>
#include <c10/core/StorageImpl.h>

#include <cstdint>
#include <exception>

namespace poptorch::device {

// Defaults look like a small IPU-POD: 4 IPUs of 900 MB. POPTORCH_NUM_IPUS and
// POPTORCH_IPU_MEMORY_MB override them; configure() changes them at run time.
int deviceCount();
int64_t memoryCapacity(int index);
int64_t memoryAllocated(int index);
int64_t maxMemoryAllocated(int index);
void resetPeakMemoryAllocated(int index);
// Throws if any ipu memory is allocated: the machine cannot change under live tensors.
void configure(int num_ipus, int64_t memory_per_ipu_bytes);

// Accounts `storage`'s bytes to ipu:`index` instead of the IPU that holds them
// (the weights of a block live on the block's IPU), or with `streamed` to the
// streaming memory attached to it (phased execution's weights, brought onto
// the IPU only for the phases that use them); the storage's device does not
// change. The capacity is not checked: the caller checks each IPU's total.
void accountOn(c10::StorageImpl& storage, int index, bool streamed = false);
// Bytes in the streaming memory attached to ipu:`index` (not in memoryAllocated).
int64_t streamingMemoryAllocated(int index);
// True when accountOn put `storage` in streaming memory.
bool isStreamed(const c10::StorageImpl& storage);
// The IPU whose memory holds `storage` (its device's unless accountOn moved it).
int accountedIpu(const c10::StorageImpl& storage);

// Whether this thread's reservations may exceed an IPU's capacity; returns the
// previous setting. A wrapped model's weights are allocated before the blocks
// that place them over the IPUs are known, and each IPU is checked once they are.
bool deferCapacityCheck(bool deferred);

// Throws an IndexError naming the valid range when `index` is not a device.
void checkIndex(int index);
c10::Device ipu(int index);

// Current device of this thread (as torch.cuda.current_device()).
int currentIndex();
void setCurrentIndex(int index);

// The allocator registered for DeviceType::IPU. Its DataPtrs are *lazy*: the
// bytes are reserved on the IPU at once (an out-of-memory error surfaces at the
// line that asked) but host memory is only attached by materialize().
c10::Allocator* allocator();
c10::DataPtr allocateLazy(size_t nbytes, int index);

bool isMaterialized(const c10::StorageImpl& storage);
// Attaches host memory to a lazy storage (no-op when it already has some).
void materialize(c10::StorageImpl& storage);
// Grows a storage to `nbytes`, keeping its content.
void growStorage(c10::StorageImpl& storage, size_t nbytes);

// A storage whose value a graph could not compute (an op it depends on
// failed when the graph ran) is poisoned with that op's error: using it in an
// op or reading it raises the error. The first error stays until a graph
// computes the whole storage again (clearPoison).
void poison(c10::StorageImpl& storage, std::exception_ptr error);
void clearPoison(c10::StorageImpl& storage);
// The error `storage` is poisoned with, or null.
std::exception_ptr poisonOf(const c10::StorageImpl& storage);
inline void checkNotPoisoned(const c10::StorageImpl& storage) {
  if (std::exception_ptr error = poisonOf(storage)) std::rethrow_exception(error);
}

}  // namespace poptorch::device
