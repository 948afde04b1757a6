#include "runtime/arena.h"

#include <gtest/gtest.h>

#include <optional>

namespace poptorch {
namespace {

using runtime::ArenaPool;

TEST(ArenaPool, ReusesTheSmallestIdleBlockThatFits) {
  ArenaPool pool(/*max_idle=*/4, /*max_idle_bytes=*/1 << 20);
  std::byte* small = nullptr;
  std::byte* large = nullptr;
  {
    ArenaPool::Lease a = pool.acquire(1000);
    ArenaPool::Lease b = pool.acquire(5000);
    small = a.data();
    large = b.data();
  }
  EXPECT_EQ(pool.idleBytes(), 6000);
  EXPECT_EQ(pool.acquire(800).data(), small);
  EXPECT_EQ(pool.acquire(2000).data(), large);
}

TEST(ArenaPool, ConcurrentLeasesGetBlocksOfTheirOwn) {
  ArenaPool pool(4, 1 << 20);
  { ArenaPool::Lease warm = pool.acquire(1000); }
  ArenaPool::Lease first = pool.acquire(1000);
  ArenaPool::Lease second = pool.acquire(1000);
  EXPECT_NE(first.data(), second.data());
}

TEST(ArenaPool, HoldsNoMoreThanItsLimits) {
  ArenaPool pool(/*max_idle=*/2, /*max_idle_bytes=*/10000);
  { ArenaPool::Lease huge = pool.acquire(20000); }
  EXPECT_EQ(pool.idleBytes(), 0);  // larger than the pool keeps: freed at once
  {
    ArenaPool::Lease a = pool.acquire(1000);
    ArenaPool::Lease b = pool.acquire(2000);
    ArenaPool::Lease c = pool.acquire(3000);
  }
  EXPECT_EQ(pool.idleBytes(), 5000);  // two blocks at most: the smallest went
  { ArenaPool::Lease d = pool.acquire(9000); }
  EXPECT_EQ(pool.idleBytes(), 9000);  // 10000 bytes at most, smallest first
}

TEST(ArenaPool, AMovedLeaseReturnsItsBlockOnce) {
  ArenaPool pool(4, 1 << 20);
  {
    std::optional<ArenaPool::Lease> moved;
    ArenaPool::Lease lease = pool.acquire(512);
    moved.emplace(std::move(lease));
  }
  EXPECT_EQ(pool.idleBytes(), 512);
}

}  // namespace
}  // namespace poptorch
