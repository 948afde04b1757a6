// Memory for the results that kernels allocate themselves, recycled between
// runs. A node whose kernel has no out= variant (convolution and its backward,
// batch norm, relu) returns a fresh tensor at every run. The CPU allocator
// takes a large one from mmap or a heap it trims again after the free, so each
// run paid the kernel's page faults (one per 4 KiB, zero-filled) and munmaps
// for them: 12% of a ResNet-8 training step's CPU time went to the kernel, 3.5%
// more to malloc. While a thread runs a node's kernel (Scope), allocations of
// at least kMinBytes reuse a block of the same size that an earlier result
// freed. Everything else goes to the allocator installed before this one.
#pragma once

#include <cstddef>
#include <cstdint>

namespace poptorch::runtime::result_blocks {

constexpr size_t kMinBytes = size_t{256} << 10;
// Idle blocks kept at most, in bytes; those freed beyond it go back to the system.
constexpr int64_t kMaxIdleBytes = int64_t{256} << 20;

// Installs the recycling allocator as the CPU allocator (once; later calls do
// nothing). Without it, Scope changes nothing.
void install();

// Large allocations on this thread reuse freed blocks while it lives.
class Scope {
 public:
  Scope();
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
};

int64_t idleBytes();
// Frees the idle blocks (torch.ipu.empty_cache()).
void clear();

}  // namespace poptorch::runtime::result_blocks
