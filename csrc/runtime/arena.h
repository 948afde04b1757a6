// Host memory for the temporaries of a run, kept between runs. Allocating each
// temporary afresh costs the allocator's work and, for the large ones, fresh
// pages from the kernel (a page fault per 4 KiB, zero-filled) and cold caches:
// as much as the kernels themselves in a small graph.
#pragma once

#include <c10/core/Allocator.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

namespace poptorch::runtime {

class ArenaPool {
 public:
  // A block of at least `nbytes` that returns to the pool when it ends. Runs
  // at the same time (inference lanes, the streaming worker) hold blocks of
  // their own.
  class Lease {
   public:
    Lease(ArenaPool& pool, c10::DataPtr block, int64_t nbytes)
        : pool_(&pool), block_(std::move(block)), nbytes_(nbytes) {}
    // A moved-from lease returns nothing (DataPtr keeps its address when moved).
    Lease(Lease&& other) noexcept
        : pool_(std::exchange(other.pool_, nullptr)),
          block_(std::move(other.block_)),
          nbytes_(other.nbytes_) {}
    Lease& operator=(Lease&&) = delete;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease();

    std::byte* data() const { return static_cast<std::byte*>(block_.get()); }

   private:
    ArenaPool* pool_;
    c10::DataPtr block_;
    int64_t nbytes_;
  };

  // Idle blocks are kept up to `max_idle` of them and `max_idle_bytes` in all:
  // more than runs can use at once would only hold memory, and a graph whose
  // temporaries are that large spends far longer in its kernels than in
  // allocating them.
  ArenaPool(size_t max_idle, int64_t max_idle_bytes)
      : max_idle_(max_idle), max_idle_bytes_(max_idle_bytes) {}

  // The pool every run leases from.
  static ArenaPool& get();

  Lease acquire(int64_t nbytes);

  int64_t idleBytes() const;
  // Frees the idle blocks (torch.ipu.empty_cache()).
  void clear();

 private:
  struct Block {
    c10::DataPtr data;
    int64_t nbytes;
  };

  void release(c10::DataPtr data, int64_t nbytes);

  const size_t max_idle_;
  const int64_t max_idle_bytes_;
  mutable std::mutex mutex_;
  std::vector<Block> idle_;
  int64_t idle_bytes_ = 0;
};

}  // namespace poptorch::runtime
