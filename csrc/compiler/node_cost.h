// How long a node's kernel takes, estimated from its sizes alone: the FLOPs of
// a matrix product, convolution or attention, the bytes an elementwise or
// reduction kernel moves. The runtime uses it to decide where running
// independent nodes on two cores at once (each kernel on one) beats running
// them one after another, each kernel on both (see compiler/parallel_ranges.h).
#pragma once

#include "ir/graph.h"

namespace poptorch::compiler {

struct NodeCost {
  double one_core_us = 0;   // the kernel on one thread
  double two_cores_us = 0;  // on two threads, as PyTorch splits it
};

NodeCost estimateNodeCost(const ir::Node& node);

}  // namespace poptorch::compiler
