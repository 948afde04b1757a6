#include "runtime/arena.h"

#include <c10/core/CPUAllocator.h>

#include <algorithm>

namespace poptorch::runtime {

ArenaPool::Lease::~Lease() {
  if (pool_ != nullptr) pool_->release(std::move(block_), nbytes_);
}

ArenaPool& ArenaPool::get() {
  constexpr size_t kMaxIdle = 4;  // inference lanes and the streaming worker: 2 runs at once
  constexpr int64_t kMaxIdleBytes = int64_t{256} << 20;
  static ArenaPool pool(kMaxIdle, kMaxIdleBytes);
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
  idle_bytes_ -= block.nbytes;
  lock.unlock();
  return Lease(*this, std::move(block.data), block.nbytes);
}

void ArenaPool::release(c10::DataPtr data, int64_t nbytes) {
  if (nbytes > max_idle_bytes_) return;  // freed with `data`
  std::lock_guard<std::mutex> lock(mutex_);
  idle_.push_back({std::move(data), nbytes});
  idle_bytes_ += nbytes;
  // Drop the smallest first: the larger serve every run the smaller would.
  while (idle_.size() > max_idle_ || idle_bytes_ > max_idle_bytes_) {
    auto smallest =
        std::min_element(idle_.begin(), idle_.end(),
                         [](const Block& a, const Block& b) { return a.nbytes < b.nbytes; });
    idle_bytes_ -= smallest->nbytes;
    idle_.erase(smallest);
  }
}

int64_t ArenaPool::idleBytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return idle_bytes_;
}

void ArenaPool::clear() {
  std::vector<Block> idle;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    idle.swap(idle_);
    idle_bytes_ = 0;
  }  // freed outside the lock
}

}  // namespace poptorch::runtime
