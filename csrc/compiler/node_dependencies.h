// Which nodes of a planned executable may run at the same time: the runtime
// runs independent nodes (a layer's weight and input gradients, the updates of
// different parameters, the branches of a block) on two cores at once.
#pragma once

#include <cstdint>
#include <vector>

namespace poptorch::compiler {

struct Executable;

struct NodeDependencies {
  // Per node of the program: the later nodes that must wait for it. A node
  // waits for what it reads to be written, for the reads of what it
  // overwrites to be done, and, for a temporary that takes arena bytes another
  // temporary had, for every use of that temporary (the memory plan places
  // temporaries as if the nodes ran one after another).
  std::vector<std::vector<int32_t>> successors;
  // The program cut into ranges [begin, end) of its nodes, in order. A range of
  // one node runs alone: every node before it precedes it, every node after it
  // follows it (its kernel may use every core). In a longer range some nodes
  // are independent of each other, and none waits for a node after the range.
  struct Segment {
    int32_t begin = 0;
    int32_t end = 0;
  };
  std::vector<Segment> segments;
  // The ranges of segments where running their nodes on two threads is
  // estimated to pay (see compiler/parallel_ranges.h), in order.
  std::vector<Segment> parallel_ranges;

  // True when some segment holds nodes that may run at once.
  bool parallel() const;
};

// The dependencies of `exe` (planned: its roles and arena offsets are set).
// A program with guards, whose failure must undo the run at the guard, gets
// one segment per node.
NodeDependencies nodeDependencies(const Executable& exe);

}  // namespace poptorch::compiler
