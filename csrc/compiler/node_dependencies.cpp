#include "compiler/node_dependencies.h"

#include <algorithm>

#include "compiler/executable.h"
#include "compiler/parallel_ranges.h"

namespace poptorch::compiler {
namespace {

bool isTemporary(const Executable& exe, ir::BufferId b) {
  return exe.roles[b] == BufferRole::kProduced || exe.roles[b] == BufferRole::kScratch;
}

// The edges of `exe`'s program, as predecessors per node (see NodeDependencies).
std::vector<std::vector<int32_t>> predecessors(const Executable& exe) {
  const ir::Graph& program = exe.program;
  const size_t num_buffers = program.buffers.size();
  std::vector<std::vector<int32_t>> preds(program.nodes.size());
  std::vector<int32_t> last_writer(num_buffers, -1);
  std::vector<std::vector<int32_t>> readers(num_buffers);  // since its last write
  std::vector<std::vector<int32_t>> users(num_buffers);    // of a temporary, all of them
  std::vector<bool> placed(num_buffers, false);
  std::vector<ir::BufferId> temporaries;  // placed so far
  auto overlap = [&](ir::BufferId a, ir::BufferId b) {
    const int64_t a_begin = exe.arena_offset[a], b_begin = exe.arena_offset[b];
    return a_begin < b_begin + program.buffers[b].nbytes &&
           b_begin < a_begin + program.buffers[a].nbytes;
  };
  std::vector<ir::BufferId> reads, writes;
  for (size_t i = 0; i < program.nodes.size(); ++i) {
    const ir::Node& node = program.nodes[i];
    std::vector<int32_t>& p = preds[i];
    reads.clear();
    writes.assign(node.writes.begin(), node.writes.end());
    for (const ir::TensorRef& out : node.outputs) writes.push_back(out.buffer);
    for (const ir::TensorRef& in : node.inputs) reads.push_back(in.buffer);
    // A temporary takes its arena bytes at its first use, which writes them.
    for (ir::BufferId b : reads) {
      if (isTemporary(exe, b) && !placed[b]) writes.push_back(b);
    }
    for (ir::BufferId b : writes) {
      if (!isTemporary(exe, b) || placed[b]) continue;
      placed[b] = true;
      for (ir::BufferId earlier : temporaries) {
        if (overlap(earlier, b)) p.insert(p.end(), users[earlier].begin(), users[earlier].end());
      }
      temporaries.push_back(b);
    }
    for (ir::BufferId b : reads) {
      if (last_writer[b] >= 0) p.push_back(last_writer[b]);
    }
    for (ir::BufferId b : writes) {
      if (last_writer[b] >= 0) p.push_back(last_writer[b]);
      p.insert(p.end(), readers[b].begin(), readers[b].end());
    }
    const auto index = static_cast<int32_t>(i);
    for (ir::BufferId b : reads) readers[b].push_back(index);
    for (ir::BufferId b : writes) {
      last_writer[b] = index;
      readers[b].clear();
    }
    for (ir::BufferId b : reads) {
      if (isTemporary(exe, b)) users[b].push_back(index);
    }
    for (ir::BufferId b : writes) {
      if (isTemporary(exe, b)) users[b].push_back(index);
    }
    std::sort(p.begin(), p.end());
    p.erase(std::unique(p.begin(), p.end()), p.end());
    p.erase(std::remove(p.begin(), p.end(), index), p.end());
  }
  return preds;
}

// Per node: true when every earlier node precedes it and every later node
// follows it. Program order is a topological order, so every earlier node
// precedes node i exactly when each of them has a successor at or before i
// (following successors from it then ends at i), and likewise after it.
std::vector<bool> runsAlone(const std::vector<std::vector<int32_t>>& preds,
                            const std::vector<std::vector<int32_t>>& succs) {
  const auto n = static_cast<int32_t>(preds.size());
  std::vector<bool> alone(preds.size(), true);
  int32_t latest_first_successor = 0;  // of the nodes before i
  for (int32_t i = 0; i < n; ++i) {
    if (latest_first_successor > i) alone[i] = false;
    const auto& s = succs[i];
    latest_first_successor = std::max(latest_first_successor, s.empty() ? n : s.front());
  }
  int32_t earliest_last_predecessor = n;  // of the nodes after i
  for (int32_t i = n - 1; i >= 0; --i) {
    if (earliest_last_predecessor < i) alone[i] = false;
    const auto& p = preds[i];
    earliest_last_predecessor = std::min(earliest_last_predecessor, p.empty() ? -1 : p.back());
  }
  return alone;
}

}  // namespace

bool NodeDependencies::parallel() const {
  return std::any_of(segments.begin(), segments.end(),
                     [](const Segment& s) { return s.end - s.begin > 1; });
}

NodeDependencies nodeDependencies(const Executable& exe) {
  const size_t n = exe.program.nodes.size();
  NodeDependencies deps;
  deps.successors.resize(n);
  if (exe.has_guards) {
    for (size_t i = 0; i < n; ++i) {
      deps.segments.push_back({static_cast<int32_t>(i), static_cast<int32_t>(i + 1)});
    }
    return deps;
  }
  const std::vector<std::vector<int32_t>> preds = predecessors(exe);
  for (size_t i = 0; i < n; ++i) {
    for (int32_t p : preds[i]) deps.successors[p].push_back(static_cast<int32_t>(i));
  }
  const std::vector<bool> alone = runsAlone(preds, deps.successors);
  for (size_t i = 0; i < n; ++i) {
    const auto index = static_cast<int32_t>(i);
    const bool joins = !alone[i] && i > 0 && !alone[i - 1];
    if (joins) {
      deps.segments.back().end = index + 1;
    } else {
      deps.segments.push_back({index, index + 1});
    }
  }
  deps.parallel_ranges = chooseParallelRanges(exe, deps);
  return deps;
}

}  // namespace poptorch::compiler
