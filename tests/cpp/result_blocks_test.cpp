#include "runtime/result_blocks.h"

#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>

namespace poptorch {
namespace {

namespace result_blocks = runtime::result_blocks;

constexpr size_t kLarge = result_blocks::kMinBytes * 2;

TEST(ResultBlocks, ALargeBlockFreedInAScopeServesTheNextOfItsSize) {
  result_blocks::install();
  result_blocks::clear();
  c10::Allocator* allocator = c10::GetCPUAllocator();
  const result_blocks::Scope scope;
  void* first = nullptr;
  {
    c10::DataPtr block = allocator->allocate(kLarge);
    first = block.get();
  }
  EXPECT_EQ(result_blocks::idleBytes(), static_cast<int64_t>(kLarge));
  c10::DataPtr again = allocator->allocate(kLarge);
  EXPECT_EQ(again.get(), first);
  EXPECT_EQ(result_blocks::idleBytes(), 0);
  c10::DataPtr other_size = allocator->allocate(kLarge + 64);
  EXPECT_NE(other_size.get(), first);
}

TEST(ResultBlocks, SmallBlocksAndBlocksOutsideAScopeAreNotKept) {
  result_blocks::install();
  result_blocks::clear();
  c10::Allocator* allocator = c10::GetCPUAllocator();
  { c10::DataPtr outside = allocator->allocate(kLarge); }
  {
    const result_blocks::Scope scope;
    c10::DataPtr small = allocator->allocate(result_blocks::kMinBytes - 1);
  }
  EXPECT_EQ(result_blocks::idleBytes(), 0);
}

// oneDNN's ideep allocates through raw_allocate() inside convolution kernels.
TEST(ResultBlocks, RawAllocationsWorkInAndOutOfAScope) {
  result_blocks::install();
  result_blocks::clear();
  c10::Allocator* allocator = c10::GetCPUAllocator();
  void* outside = allocator->raw_allocate(kLarge);
  allocator->raw_deallocate(outside);
  {
    const result_blocks::Scope scope;
    void* inside = allocator->raw_allocate(kLarge);
    static_cast<char*>(inside)[kLarge - 1] = 1;
    allocator->raw_deallocate(inside);
  }
  EXPECT_EQ(result_blocks::idleBytes(), static_cast<int64_t>(kLarge));
  result_blocks::clear();
  EXPECT_EQ(result_blocks::idleBytes(), 0);
}

}  // namespace
}  // namespace poptorch
