// How two tensors overlap in memory, decided from their storages.
#pragma once

#include <ATen/MemoryOverlap.h>
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace poptorch {

// What at::get_overlap_status says of `a` and `b`, from their byte extents
// in their storage: PyTorch's reads data pointers, which an ipu tensor whose
// bytes do not exist yet (a lazy result) lacks. Partial: they share some
// bytes, or the same bytes in another order; kTooHard: one is not dense.
inline at::MemOverlapStatus storageOverlap(const at::Tensor& a, const at::Tensor& b) {
  if (a.is_same(b)) return at::MemOverlapStatus::Full;
  if (a.numel() == 0 || b.numel() == 0) return at::MemOverlapStatus::No;
  if (!a.is_non_overlapping_and_dense() || !b.is_non_overlapping_and_dense()) {
    return at::MemOverlapStatus::TooHard;
  }
  if (!a.storage().is_alias_of(b.storage())) return at::MemOverlapStatus::No;
  const int64_t a_begin = a.storage_offset() * static_cast<int64_t>(a.itemsize());
  const int64_t a_end = a_begin + static_cast<int64_t>(a.nbytes());
  const int64_t b_begin = b.storage_offset() * static_cast<int64_t>(b.itemsize());
  const int64_t b_end = b_begin + static_cast<int64_t>(b.nbytes());
  if (a_begin == b_begin && a_end == b_end) {
    return a.strides().equals(b.strides()) ? at::MemOverlapStatus::Full
                                           : at::MemOverlapStatus::Partial;
  }
  return a_begin < b_end && b_begin < a_end ? at::MemOverlapStatus::Partial
                                            : at::MemOverlapStatus::No;
}

}  // namespace poptorch
