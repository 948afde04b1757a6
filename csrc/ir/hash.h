// Structural hashing: two graphs with the same hash run the same program on
// buffers of the same shapes. Runtime arguments (learning rates, scalars) are
// left out, so changing them does not recompile.
#pragma once

#include <cstdint>

#include "ir/graph.h"

namespace poptorch::ir {

uint64_t structuralHash(const Graph& graph);
// Hash of one constant argument value (used by hashing and by CSE).
uint64_t hashConstant(const c10::IValue& value);

inline uint64_t hashCombine(uint64_t seed, uint64_t value) {
  // The mixer of boost::hash_combine, widened to 64 bits.
  return seed ^ (value + 0x9e3779b97f4a7c15ULL + (seed << 12) + (seed >> 4));
}

}  // namespace poptorch::ir
