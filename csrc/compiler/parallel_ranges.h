// Where running independent nodes on two threads pays: the ranges of a program
// whose nodes, each kernel on one core, two at a time where their dependencies
// allow, are estimated to finish sooner than one after another, each kernel on
// both cores. Two cores pay for independent kernels that split badly over two
// threads (small matrix products, kernels below ATen's grain, PyTorch's
// element-by-element random kernels) and lose for a chain of large ones.
#pragma once

#include <vector>

#include "compiler/node_dependencies.h"

namespace poptorch::compiler {

struct Executable;

// Ranges [begin, end) of `exe`'s nodes, in order, each inside one of `deps`'s
// segments and of at least two nodes, from the estimated time of each node's
// kernel (compiler/node_cost.h), of a thread taking over another's work and of
// starting and joining a range on two threads. A program with nothing to gain
// gets none.
std::vector<NodeDependencies::Segment> chooseParallelRanges(const Executable& exe,
                                                            const NodeDependencies& deps);

}  // namespace poptorch::compiler
