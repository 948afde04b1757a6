#include <vector>

#include "passes/passes.h"

namespace poptorch::passes {

ir::Graph eliminateDeadCode(ir::Graph graph) {
  std::vector<bool> needed(graph.buffers.size(), false);
  for (size_t b = 0; b < graph.buffers.size(); ++b) needed[b] = graph.buffers[b].live_after;

  // Walk backwards: a node is live when it produces or writes a buffer that a
  // later live node reads (or that outlives the graph); its inputs are then needed.
  std::vector<bool> keep(graph.nodes.size(), false);
  for (size_t i = graph.nodes.size(); i-- > 0;) {
    const ir::Node& node = graph.nodes[i];
    // Guards must hold whatever uses their results; ops acting on the host
    // (printing, callbacks) act whether or not their results are used; other
    // nodes without results or writes have opaque side effects.
    bool live = node.guard != ir::Guard::kNone || node.hasHostEffects() ||
                (node.outputs.empty() && node.writes.empty());
    for (const ir::TensorRef& out : node.outputs) live = live || needed[out.buffer];
    for (ir::BufferId w : node.writes) live = live || needed[w];
    if (!live) continue;
    keep[i] = true;
    for (const ir::TensorRef& in : node.inputs) needed[in.buffer] = true;
  }

  graph.keepNodes(keep);
  return graph;
}

}  // namespace poptorch::passes
