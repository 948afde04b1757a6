#include "runtime/result_blocks.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

namespace poptorch::runtime::result_blocks {
namespace {

thread_local int scope_depth = 0;

// Every block goes back through recycle(): tensors carry it as their deleter,
// and oneDNN's ideep, which allocates its scratch memory outside tensors,
// allocates and frees through c10::GetAllocator(kCPU)->raw_allocate() and
// raw_deallocate() at each call (PyTorch's IDeepRegistration.cpp), that is
// through this allocator once installed. So a block ideep took before
// install() comes to recycle() too; it is not in sizes_ and goes to the
// allocator it came from.
class RecyclingAllocator final : public c10::Allocator {
 public:
  explicit RecyclingAllocator(c10::Allocator* next) : next_(next) {}

  c10::DataPtr allocate(size_t nbytes) override {
    if (scope_depth == 0 || nbytes < kMinBytes) return next_->allocate(nbytes);
    void* data = takeIdle(nbytes);
    if (data == nullptr) {
      data = c10::alloc_cpu(nbytes);
      std::lock_guard<std::mutex> lock(mutex_);
      sizes_[data] = nbytes;
    }
    // The context is the data, as raw_allocate() requires.
    return {data, data, &recycle, c10::Device(c10::kCPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &recycle; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  int64_t idleBytes() {
    std::lock_guard<std::mutex> lock(mutex_);
    return idle_bytes_;
  }

  void clear() {
    std::vector<void*> freed;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (auto& [nbytes, blocks] : idle_) {
        for (void* data : blocks) {
          sizes_.erase(data);
          freed.push_back(data);
        }
      }
      idle_.clear();
      idle_bytes_ = 0;
    }
    for (void* data : freed) c10::free_cpu(data);
  }

  static RecyclingAllocator* installed;

 private:
  static void recycle(void* data) { installed->giveBack(data); }

  void* takeIdle(size_t nbytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = idle_.find(nbytes);
    if (it == idle_.end() || it->second.empty()) return nullptr;
    void* data = it->second.back();
    it->second.pop_back();
    idle_bytes_ -= static_cast<int64_t>(nbytes);
    return data;
  }

  void giveBack(void* data) {
    std::unique_lock<std::mutex> lock(mutex_);
    auto it = sizes_.find(data);
    if (it == sizes_.end()) {  // the next allocator's, freed through raw_deleter()
      lock.unlock();
      c10::DeleterFnPtr next_deleter = next_->raw_deleter();
      if (next_deleter != nullptr) {
        next_deleter(data);
      } else {
        c10::free_cpu(data);
      }
      return;
    }
    const size_t nbytes = it->second;
    if (idle_bytes_ + static_cast<int64_t>(nbytes) <= kMaxIdleBytes) {
      idle_[nbytes].push_back(data);
      idle_bytes_ += static_cast<int64_t>(nbytes);
      return;
    }
    sizes_.erase(it);
    lock.unlock();
    c10::free_cpu(data);
  }

  c10::Allocator* const next_;
  std::mutex mutex_;
  std::unordered_map<void*, size_t> sizes_;  // every block it handed out and has not freed
  std::unordered_map<size_t, std::vector<void*>> idle_;  // by size
  int64_t idle_bytes_ = 0;
};

RecyclingAllocator* RecyclingAllocator::installed = nullptr;

}  // namespace

void install() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Never destroyed: tensors freed during the process's exit still return
    // their blocks to it.
    RecyclingAllocator::installed = new RecyclingAllocator(c10::GetCPUAllocator());
    c10::SetCPUAllocator(RecyclingAllocator::installed, /*priority=*/1);
  });
}

Scope::Scope() { ++scope_depth; }
Scope::~Scope() { --scope_depth; }

int64_t idleBytes() {
  return RecyclingAllocator::installed == nullptr ? 0 : RecyclingAllocator::installed->idleBytes();
}

void clear() {
  if (RecyclingAllocator::installed != nullptr) RecyclingAllocator::installed->clear();
}

}  // namespace poptorch::runtime::result_blocks
