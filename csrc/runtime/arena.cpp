#include "runtime/arena.h"

#include <c10/core/CPUAllocator.h>

#include <algorithm>

namespace poptorch::runtime {

ArenaPool::Lease::~Lease() {
  if (pool_ != nullptr) pool_->release(std::move(block_), nbytes_);
}

ArenaPool& ArenaPool::get() {
  static ArenaPool pool;
  return pool;
}

ArenaPool::Lease ArenaPool::acquire(int64_t nbytes) {
  std::unique_lock<std::mutex> lock(mutex_);
  // The smallest idle block that fits.
  auto best = idle_.end();
  for (auto it = idle_.begin(); it != idle_.end(); ++it) {
    if (it->nbytes >= nbytes && (best == idle_.end() || it->nbytes < best->nbytes)) best = it;
  }
  if (best == idle_.end()) {
    lock.unlock();
    return Lease(*this, c10::GetCPUAllocator()->allocate(static_cast<size_t>(nbytes)), nbytes);
  }
  Block block = std::move(*best);
  idle_.erase(best);
  lock.unlock();
  return Lease(*this, std::move(block.data), block.nbytes);
}

void ArenaPool::release(c10::DataPtr data, int64_t nbytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  idle_.push_back({std::move(data), nbytes});
  if (idle_.size() > kMaxIdle) {
    // Drop the smallest: the larger ones serve every run the smaller would.
    auto smallest =
        std::min_element(idle_.begin(), idle_.end(),
                         [](const Block& a, const Block& b) { return a.nbytes < b.nbytes; });
    idle_.erase(smallest);
  }
}

}  // namespace poptorch::runtime
