#include <absl/container/flat_hash_map.h>

#include <vector>

#include "ir/hash.h"
#include "passes/passes.h"

namespace poptorch::passes {
namespace {

// A node's inputs are equal to another's when they are the same views of the
// same buffers, each buffer having been written the same number of times.
struct VersionedInputs {
  ir::Inputs refs;
  std::vector<int32_t> versions;
  bool operator==(const VersionedInputs&) const = default;
};

bool argsEqual(const ir::Node& a, const ir::Node& b) {
  // Calls in another denormal mode or deterministic-algorithms setting may
  // compute other values from the same inputs.
  if (a.args.size() != b.args.size() || !a.sameStateOfCall(b)) return false;
  for (size_t i = 0; i < a.args.size(); ++i) {
    const ir::Arg& x = a.args[i];
    const ir::Arg& y = b.args[i];
    if (x.kind != y.kind || x.refs != y.refs) return false;
    if (x.kind == ir::ArgKind::kConstant && !c10::_fastEqualsForContainer(x.value, y.value)) {
      return false;
    }
  }
  return true;
}

bool mergeable(const ir::Node& node, const ir::Graph& graph) {
  if (node.outputs.empty() || !node.writes.empty() || node.isNondeterministic() ||
      node.hasHostEffects()) {
    return false;
  }
  for (const ir::Arg& arg : node.args) {
    // Runtime arguments may differ on the next run of the same executable.
    if (arg.kind == ir::ArgKind::kRuntime) return false;
  }
  for (const ir::TensorRef& out : node.outputs) {
    if (graph.buffers[out.buffer].live_after) return false;
  }
  return true;
}

}  // namespace

ir::Graph eliminateCommonSubexpressions(ir::Graph graph) {
  // Buffers written by any node: results on them may change after creation.
  std::vector<bool> ever_written(graph.buffers.size(), false);
  for (const ir::Node& node : graph.nodes) {
    for (ir::BufferId w : node.writes) ever_written[w] = true;
  }

  std::vector<int32_t> version(graph.buffers.size(), 0);
  std::vector<ir::BufferId> replacement(graph.buffers.size());
  for (size_t b = 0; b < replacement.size(); ++b) replacement[b] = static_cast<ir::BufferId>(b);

  absl::flat_hash_map<uint64_t, std::vector<size_t>> seen;  // key -> kept node positions
  std::vector<VersionedInputs> kept_inputs;
  std::vector<ir::Node> kept;
  kept.reserve(graph.nodes.size());

  for (ir::Node& node : graph.nodes) {
    for (ir::TensorRef& in : node.inputs) in.buffer = replacement[in.buffer];
    for (ir::BufferId& w : node.writes) w = replacement[w];

    VersionedInputs inputs{node.inputs, {}};
    for (const ir::TensorRef& in : node.inputs) inputs.versions.push_back(version[in.buffer]);

    bool merged = false;
    bool candidate = mergeable(node, graph);
    for (const ir::TensorRef& out : node.outputs)
      candidate = candidate && !ever_written[out.buffer];
    uint64_t key = 0;
    if (candidate) {
      key = ir::hashCombine(std::hash<std::string>{}(node.name()), node.inputs.size());
      for (const ir::Arg& arg : node.args) {
        if (arg.kind == ir::ArgKind::kConstant)
          key = ir::hashCombine(key, ir::hashConstant(arg.value));
      }
      for (size_t i = 0; i < inputs.refs.size(); ++i) {
        key = ir::hashCombine(key, static_cast<uint64_t>(inputs.refs[i].buffer));
        key = ir::hashCombine(key, static_cast<uint64_t>(inputs.versions[i]));
      }
      for (size_t position : seen[key]) {
        const ir::Node& earlier = kept[position];
        // A matmul's plan changes its modelled memory, not its value: two
        // planned differently are kept apart so each plan is counted.
        if (earlier.op == node.op && kept_inputs[position] == inputs && argsEqual(earlier, node) &&
            earlier.outputs.size() == node.outputs.size() && earlier.matmul == node.matmul) {
          for (size_t o = 0; o < node.outputs.size(); ++o) {
            replacement[node.outputs[o].buffer] = earlier.outputs[o].buffer;
          }
          merged = true;
          break;
        }
      }
    }
    if (merged) continue;

    for (ir::BufferId w : node.writes) ++version[w];
    if (candidate) seen[key].push_back(kept.size());
    kept_inputs.push_back(std::move(inputs));
    kept.push_back(std::move(node));
  }
  graph.nodes = std::move(kept);
  return graph;
}

}  // namespace poptorch::passes
