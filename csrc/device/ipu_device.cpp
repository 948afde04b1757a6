#include "device/ipu_device.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>

#include "common/environment.h"

namespace poptorch::device {
namespace {

constexpr int kMaxIpus = 64;
constexpr int64_t kMiB = 1024 * 1024;

// The machine's shape and its memory accounting. Counters are atomics because
// tensors are created and freed on any thread.
struct Machine {
  std::atomic<int> num_ipus{static_cast<int>(
      std::min<int64_t>(integerFromEnvironment("POPTORCH_NUM_IPUS", 4, 1), kMaxIpus))};
  std::atomic<int64_t> capacity{integerFromEnvironment("POPTORCH_IPU_MEMORY_MB", 900, 1) * kMiB};
  std::array<std::atomic<int64_t>, kMaxIpus> allocated{};
  std::array<std::atomic<int64_t>, kMaxIpus> peak{};
  // Bytes in the streaming memory attached to each IPU (phased execution's
  // weights): off the chip, so not checked against its capacity.
  std::array<std::atomic<int64_t>, kMaxIpus> streamed{};
};

Machine& machine() {
  static Machine m;
  return m;
}

thread_local int current_index = 0;
thread_local bool capacity_check_deferred = false;

// Owner of one storage's bytes: its reservation on an IPU, host memory once
// materialised, and the error it is poisoned with. A DataPtr's context.
struct Block {
  int index;
  size_t nbytes;
  bool streamed = false;  // in the streaming memory of ipu `index`, not on it
  void* data = nullptr;
  // `error` changes under poison_mutex; `poisoned` says whether it is set, so
  // that a healthy storage (every storage, nearly always) is checked lock-free.
  std::atomic<bool> poisoned{false};
  std::exception_ptr error;
};

std::mutex poison_mutex;

void reserve(int index, size_t nbytes) {
  Machine& m = machine();
  const int64_t now =
      m.allocated[index].fetch_add(static_cast<int64_t>(nbytes)) + static_cast<int64_t>(nbytes);
  if (now > m.capacity.load() && !capacity_check_deferred) {
    m.allocated[index].fetch_sub(static_cast<int64_t>(nbytes));
    TORCH_CHECK_WITH(OutOfMemoryError, false, "IPU out of memory. Tried to allocate ",
                     nbytes / kMiB, " MiB (", nbytes, " bytes) on ipu:", index, ", which has ",
                     m.capacity.load() / kMiB, " MiB in total and ",
                     (now - static_cast<int64_t>(nbytes)) / kMiB,
                     " MiB allocated. Free tensors you no longer need, use a smaller "
                     "batch, spread the model over more IPUs, or raise "
                     "POPTORCH_IPU_MEMORY_MB.");
  }
  int64_t peak = m.peak[index].load();
  while (now > peak && !m.peak[index].compare_exchange_weak(peak, now)) {
  }
}

void release(int index, size_t nbytes) {
  machine().allocated[index].fetch_sub(static_cast<int64_t>(nbytes));
}

// Reserves or releases (negative `nbytes`) a block's bytes where it lives.
void account(const Block& block, int64_t nbytes) {
  if (block.streamed) {
    machine().streamed[block.index].fetch_add(nbytes);
  } else if (nbytes >= 0) {
    reserve(block.index, static_cast<size_t>(nbytes));
  } else {
    release(block.index, static_cast<size_t>(-nbytes));
  }
}

void deleteBlock(void* context) {
  auto* block = static_cast<Block*>(context);
  account(*block, -static_cast<int64_t>(block->nbytes));
  c10::free_cpu(block->data);
  delete block;
}

Block* blockOf(const c10::StorageImpl& storage) {
  const c10::DataPtr& data_ptr = storage.data_ptr();
  if (data_ptr.get_deleter() != &deleteBlock) return nullptr;
  return static_cast<Block*>(data_ptr.get_context());
}

// Replaces the storage's DataPtr with one that points at `block->data`,
// handing ownership of the block from the old DataPtr to the new one.
void rebind(c10::StorageImpl& storage, Block* block) {
  c10::DataPtr& old = storage._mutable_data_ptr_no_checks();
  const c10::Device device = old.device();
  old.release_context();
  storage.set_data_ptr_noswap(c10::DataPtr(block->data, block, &deleteBlock, device));
}

class IpuAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override { return allocateLazy(nbytes, current_index); }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
};

IpuAllocator ipu_allocator;

}  // namespace

int deviceCount() { return machine().num_ipus.load(); }

int64_t memoryCapacity(int index) {
  checkIndex(index);
  return machine().capacity.load();
}

int64_t memoryAllocated(int index) {
  checkIndex(index);
  return machine().allocated[index].load();
}

int64_t maxMemoryAllocated(int index) {
  checkIndex(index);
  return machine().peak[index].load();
}

void resetPeakMemoryAllocated(int index) {
  checkIndex(index);
  machine().peak[index] = machine().allocated[index].load();
}

void configure(int num_ipus, int64_t memory_per_ipu_bytes) {
  TORCH_CHECK_VALUE(num_ipus >= 1 && num_ipus <= kMaxIpus,
                    "the number of IPUs must be between 1 and ", kMaxIpus, ", got ", num_ipus);
  TORCH_CHECK_VALUE(memory_per_ipu_bytes > 0, "IPU memory must be positive, got ",
                    memory_per_ipu_bytes);
  Machine& m = machine();
  for (int i = 0; i < kMaxIpus; ++i) {
    TORCH_CHECK(m.allocated[i].load() == 0 && m.streamed[i].load() == 0,
                "cannot reconfigure the IPUs while ipu:", i,
                " holds tensors; configure before creating any ipu tensor");
  }
  m.num_ipus = num_ipus;
  m.capacity = memory_per_ipu_bytes;
}

void accountOn(c10::StorageImpl& storage, int index, bool streamed) {
  checkIndex(index);
  Block* block = blockOf(storage);
  if (block == nullptr || (block->index == index && block->streamed == streamed)) return;
  const auto nbytes = static_cast<int64_t>(block->nbytes);
  account(*block, -nbytes);
  block->index = index;
  block->streamed = streamed;
  const bool previous = deferCapacityCheck(true);
  account(*block, nbytes);  // cannot throw: the check is deferred
  deferCapacityCheck(previous);
}

int64_t streamingMemoryAllocated(int index) {
  checkIndex(index);
  return machine().streamed[index].load();
}

bool isStreamed(const c10::StorageImpl& storage) {
  const Block* block = blockOf(storage);
  return block != nullptr && block->streamed;
}

int accountedIpu(const c10::StorageImpl& storage) {
  const Block* block = blockOf(storage);
  return block != nullptr ? block->index : std::max<int>(0, storage.device().index());
}

bool deferCapacityCheck(bool deferred) { return std::exchange(capacity_check_deferred, deferred); }

void checkIndex(int index) {
  TORCH_CHECK_INDEX(index >= 0 && index < deviceCount(), "ipu:", index,
                    " is not a device: this machine has ", deviceCount(),
                    " IPUs (ipu:0 to ipu:", deviceCount() - 1,
                    "). Set POPTORCH_NUM_IPUS for more.");
}

c10::Device ipu(int index) {
  return c10::Device(c10::DeviceType::IPU, static_cast<c10::DeviceIndex>(index));
}

int currentIndex() { return current_index; }

void setCurrentIndex(int index) {
  checkIndex(index);
  current_index = index;
}

c10::Allocator* allocator() { return &ipu_allocator; }

c10::DataPtr allocateLazy(size_t nbytes, int index) {
  checkIndex(index);
  reserve(index, nbytes);
  auto* block = new Block{index, nbytes};
  return c10::DataPtr(nullptr, block, &deleteBlock, ipu(index));
}

bool isMaterialized(const c10::StorageImpl& storage) {
  const Block* block = blockOf(storage);
  return block == nullptr || block->data != nullptr || block->nbytes == 0;
}

void materialize(c10::StorageImpl& storage) {
  Block* block = blockOf(storage);
  if (block == nullptr || block->data != nullptr || block->nbytes == 0) return;
  block->data = c10::alloc_cpu(block->nbytes);
  rebind(storage, block);
}

void growStorage(c10::StorageImpl& storage, size_t nbytes) {
  Block* block = blockOf(storage);
  TORCH_INTERNAL_ASSERT(block != nullptr, "storage was not allocated by the ipu allocator");
  if (nbytes <= block->nbytes) return;
  account(*block, static_cast<int64_t>(nbytes - block->nbytes));
  if (block->data != nullptr) {
    void* data = c10::alloc_cpu(nbytes);
    std::memcpy(data, block->data, block->nbytes);
    c10::free_cpu(block->data);
    block->data = data;
  }
  block->nbytes = nbytes;
  rebind(storage, block);
  storage.set_nbytes(nbytes);
}

void poison(c10::StorageImpl& storage, std::exception_ptr error) {
  Block* block = blockOf(storage);
  if (block == nullptr) return;
  std::lock_guard<std::mutex> lock(poison_mutex);
  if (block->error) return;
  block->error = std::move(error);
  block->poisoned.store(true, std::memory_order_release);
}

void clearPoison(c10::StorageImpl& storage) {
  Block* block = blockOf(storage);
  if (block == nullptr || !block->poisoned.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(poison_mutex);
  block->poisoned.store(false, std::memory_order_release);
  block->error = nullptr;
}

std::exception_ptr poisonOf(const c10::StorageImpl& storage) {
  const Block* block = blockOf(storage);
  if (block == nullptr || !block->poisoned.load(std::memory_order_acquire)) return nullptr;
  std::lock_guard<std::mutex> lock(poison_mutex);
  return block->error;
}

}  // namespace poptorch::device
