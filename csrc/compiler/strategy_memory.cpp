#include "compiler/strategy_memory.h"

#include <absl/container/flat_hash_set.h>

#include <algorithm>
#include <optional>
#include <utility>

#include "compiler/memory_plan.h"
#include "compiler/pipeline_stages.h"

namespace poptorch::compiler {
namespace {

// Bytes on each IPU at each node: intervals of nodes added, then summed.
class ByNodeAndIpu {
 public:
  explicit ByNodeAndIpu(size_t num_nodes) : num_nodes_(num_nodes) {}

  // `nbytes` on `ipu` while nodes [first, last] run.
  void add(int32_t ipu, size_t first, size_t last, int64_t nbytes) {
    std::vector<int64_t>& diff = ipu_(ipu);
    diff[first] += nbytes;
    diff[last + 1] -= nbytes;
  }

  // Per IPU, the largest of its bytes at a node.
  std::vector<int64_t> peaks() const {
    std::vector<int64_t> result(diffs_.size(), 0);
    for (size_t d = 0; d < diffs_.size(); ++d) {
      int64_t live = 0;
      for (size_t i = 0; i < num_nodes_; ++i) {
        live += diffs_[d][i];
        result[d] = std::max(result[d], live);
      }
    }
    return result;
  }

 private:
  std::vector<int64_t>& ipu_(int32_t ipu) {
    const auto d = static_cast<size_t>(ipu);
    while (diffs_.size() <= d) diffs_.emplace_back(num_nodes_ + 1, 0);
    return diffs_[d];
  }

  size_t num_nodes_;
  std::vector<std::vector<int64_t>> diffs_;
};

}  // namespace

int64_t matMulWorkingBytes(const ir::Node& node, int32_t ipu, const MatMulMemory& memory) {
  if (!node.isMatMul()) return 0;
  const auto [lhs, rhs] = node.matMulOperands();
  if (lhs->sizes.size() < 2 || rhs->sizes.size() < 2) return 0;
  int64_t batch = 1;
  for (size_t d = 0; d + 2 < lhs->sizes.size(); ++d) batch *= lhs->sizes[d];
  int64_t m = lhs->sizes[lhs->sizes.size() - 2];
  int64_t k = lhs->sizes.back();
  int64_t n = rhs->sizes.back();
  const int64_t factor = std::max<int64_t>(1, node.matmul.factor);
  switch (node.matmul.split) {
    case ir::MatMulPlan::Split::kInputChannels:
      m /= factor;
      break;
    case ir::MatMulPlan::Split::kReducingDim:
      k /= factor;
      break;
    case ir::MatMulPlan::Split::kOutputChannels:
      n /= factor;
      break;
    case ir::MatMulPlan::Split::kNone:
      break;
  }
  const int64_t bytes =
      batch * (m * k * static_cast<int64_t>(c10::elementSize(lhs->dtype)) +
               k * n * static_cast<int64_t>(c10::elementSize(rhs->dtype)) + m * n * 4);
  // Not above 0: unset (set_available_memory stores a proportion of 0 as the
  // smallest float above it, which bounds the same).
  double proportion = node.matmul.available_memory;
  if (proportion <= 0 && static_cast<size_t>(ipu) < memory.available_memory.size()) {
    proportion = memory.available_memory[static_cast<size_t>(ipu)];
  }
  if (proportion <= 0) proportion = 0.6;
  const auto bound = static_cast<int64_t>(proportion * static_cast<double>(memory.capacity));
  return std::min(bytes, bound);
}

namespace {

// The IPU a node runs on (the one of its first result's memory outside blocks).
int32_t ipuOfNode(const ir::Graph& program, const ir::Node& node) {
  return node.outputs.empty() ? std::max(0, node.placement.ipu)
                              : ipuOfUse(program, node, node.outputs.front().buffer);
}

// The working memory of `exe`'s matmuls, each while it runs.
void addMatMuls(const Executable& exe, const MatMulMemory& memory, ByNodeAndIpu& bytes) {
  for (size_t i = 0; i < exe.program.nodes.size(); ++i) {
    const ir::Node& node = exe.program.nodes[i];
    const int32_t ipu = ipuOfNode(exe.program, node);
    if (const int64_t working = matMulWorkingBytes(node, ipu, memory); working > 0) {
      bytes.add(ipu, i, i, working);
    }
  }
}

// Peaks of temporaries run one micro-batch at a time, or (with `stages`, the
// pipeline stage of each node) as a pipeline.
std::vector<int64_t> temporaryPeaks(const Executable& exe, const std::vector<int32_t>* stages,
                                    const MatMulMemory& memory) {
  const ir::Graph& program = exe.program;
  std::vector<int64_t> first(program.buffers.size(), -1);
  std::vector<int64_t> last(program.buffers.size(), -1);
  for (size_t i = 0; i < program.nodes.size(); ++i) {
    forEachBuffer(program.nodes[i], [&](ir::BufferId b) {
      if (first[b] < 0) first[b] = static_cast<int64_t>(i);
      last[b] = static_cast<int64_t>(i);
    });
  }
  ByNodeAndIpu bytes(program.nodes.size());
  addMatMuls(exe, memory, bytes);
  std::vector<int64_t> stashed;  // per IPU
  for (size_t b = 0; b < program.buffers.size(); ++b) {
    const auto id = static_cast<ir::BufferId>(b);
    if (first[b] < 0 || !isTemporary(exe, id)) continue;
    const auto from = static_cast<size_t>(first[b]);
    const auto to = static_cast<size_t>(last[b]);
    const int32_t ipu = ipuOfUse(program, program.nodes[from], id);
    const int32_t copies = stages == nullptr ? 1 : (*stages)[to] - (*stages)[from] + 1;
    if (copies == 1) {
      bytes.add(ipu, from, to, program.buffers[b].nbytes);
    } else {
      if (stashed.size() <= static_cast<size_t>(ipu)) stashed.resize(ipu + 1, 0);
      stashed[ipu] += copies * program.buffers[b].nbytes;
    }
  }
  std::vector<int64_t> peaks = bytes.peaks();
  peaks.resize(std::max(peaks.size(), stashed.size()), 0);
  for (size_t d = 0; d < stashed.size(); ++d) peaks[d] += stashed[d];
  return peaks;
}

}  // namespace

std::vector<int64_t> sequentialPeakBytes(const Executable& exe, const MatMulMemory& memory) {
  return temporaryPeaks(exe, nullptr, memory);
}

std::vector<int64_t> pipelinedPeakBytes(const Executable& exe, const MatMulMemory& memory) {
  if (pipelineStages(exe.program).empty()) return temporaryPeaks(exe, nullptr, memory);
  const std::optional<std::vector<int32_t>> stages = assignPipelineStages(exe.program);
  return temporaryPeaks(exe, &*stages, memory);
}

RunPhases runPhases(const ir::Graph& program) {
  const std::vector<int32_t> stages = modelStages(program);
  const auto n = static_cast<int32_t>(stages.size());
  const std::optional<std::vector<int32_t>> pipeline = assignPipelineStages(program);
  std::vector<int32_t> phase_of_rank(stages.size(), 0);
  int32_t last_phase = 0;
  for (const ir::Node& node : program.nodes) {
    if (!inModelStage(node.placement)) continue;
    const auto rank =
        std::lower_bound(stages.begin(), stages.end(), node.placement.stage) - stages.begin();
    phase_of_rank[static_cast<size_t>(rank)] = node.placement.phase;
    last_phase = std::max(last_phase, node.placement.phase);
  }
  RunPhases phases;
  std::optional<std::pair<int32_t, bool>> previous;  // (phase, backward) of the last node
  for (size_t i = 0; i < program.nodes.size(); ++i) {
    const ir::Placement& placement = program.nodes[i].placement;
    std::optional<std::pair<int32_t, bool>> key;  // none: a phase of its own
    if (pipeline) {
      const int32_t stage = (*pipeline)[i];
      const int32_t phase = phase_of_rank[static_cast<size_t>(rankOf(stage, n))];
      key = {phase, stage >= n && phase != last_phase};
    } else if (inModelStage(placement)) {
      key = {placement.phase, false};
    } else if (n > 0) {
      key = previous;  // with the model's one stage, after it
    }
    if (!key || !previous || *key != *previous) {
      phases.backward.push_back(key ? key->second : true);
    }
    phases.of_node.push_back(static_cast<int32_t>(phases.backward.size()) - 1);
    previous = key;
  }
  return phases;
}

std::vector<int64_t> phasedPeakBytes(const Executable& exe, const std::vector<bool>& streamed,
                                     Liveness liveness, const MatMulMemory& memory) {
  const ir::Graph& program = exe.program;
  const size_t num_nodes = program.nodes.size();
  const RunPhases phases = runPhases(program);
  const size_t num_phases = phases.backward.size();
  std::vector<size_t> begin(num_phases, num_nodes);
  std::vector<size_t> end(num_phases, 0);  // one past the phase's last node
  for (size_t i = 0; i < num_nodes; ++i) {
    const auto p = static_cast<size_t>(phases.of_node[i]);
    begin[p] = std::min(begin[p], i);
    end[p] = i + 1;
  }

  ByNodeAndIpu bytes(num_nodes);
  addMatMuls(exe, memory, bytes);
  // Streamed buffers: on an IPU for the whole of each phase that uses them there.
  absl::flat_hash_set<std::pair<size_t, std::pair<ir::BufferId, int32_t>>> loaded;
  std::vector<std::vector<size_t>> uses_of(program.buffers.size());  // temporaries
  for (size_t i = 0; i < num_nodes; ++i) {
    const ir::Node& node = program.nodes[i];
    const auto p = static_cast<size_t>(phases.of_node[i]);
    forEachBuffer(node, [&](ir::BufferId b) {
      if (streamed[b]) {
        const int32_t ipu = ipuOfUse(program, node, b);
        if (loaded.insert({p, {b, ipu}}).second) {
          bytes.add(ipu, begin[p], end[p] - 1, program.buffers[b].nbytes);
        }
      } else if (isTemporary(exe, b) && (uses_of[b].empty() || uses_of[b].back() != i)) {
        uses_of[b].push_back(i);
      }
    });
  }

  // Temporaries: on the IPU of the node that makes them, while the liveness
  // keeps them on the chip.
  for (size_t b = 0; b < uses_of.size(); ++b) {
    const std::vector<size_t>& uses = uses_of[b];
    if (uses.empty()) continue;
    const size_t first = uses.front();
    const size_t last = uses.back();
    const auto id = static_cast<ir::BufferId>(b);
    const int32_t ipu = ipuOfUse(program, program.nodes[first], id);
    const int64_t nbytes = program.buffers[b].nbytes;
    auto phase = [&](size_t node) { return static_cast<size_t>(phases.of_node[node]); };
    if (liveness == Liveness::kOffChipAfterEachPhase) {
      // In each phase that uses it: from its first use there (or the
      // phase's start) to its last (or the phase's end).
      for (size_t k = 0; k < uses.size(); ++k) {
        const size_t p = phase(uses[k]);
        if (k > 0 && phase(uses[k - 1]) == p) continue;
        const size_t from = p == phase(first) ? first : begin[p];
        const size_t to = p == phase(last) ? last : end[p] - 1;
        bytes.add(ipu, from, to, nbytes);
      }
    } else if (liveness != Liveness::kAlwaysLive && !phases.backward[phase(first)] &&
               phases.backward[phase(last)]) {
      // Made in the forward and needed in the backward: on the chip until
      // the forward ends, then again from the first backward phase using it.
      size_t forward_end = first;  // the first node of the backward
      while (!phases.backward[phase(forward_end)]) ++forward_end;
      const size_t backward_use = *std::find_if(
          uses.begin(), uses.end(), [&](size_t u) { return phases.backward[phase(u)]; });
      bytes.add(ipu, first, forward_end - 1, nbytes);
      bytes.add(ipu, begin[phase(backward_use)], last, nbytes);
    } else {
      bytes.add(ipu, first, last, nbytes);
    }
  }
  return bytes.peaks();
}

}  // namespace poptorch::compiler
