#include "compiler/pipeline_stages.h"

#include <absl/container/flat_hash_set.h>

#include <algorithm>
#include <numeric>

namespace poptorch::compiler {

bool inModelStage(const ir::Placement& placement) {
  return placement.block != ir::Placement::kOutsideBlocks;
}

std::vector<int32_t> modelStages(const ir::Graph& program) {
  std::vector<int32_t> stages;
  for (const ir::Node& node : program.nodes) {
    if (inModelStage(node.placement)) stages.push_back(node.placement.stage);
  }
  std::sort(stages.begin(), stages.end());
  stages.erase(std::unique(stages.begin(), stages.end()), stages.end());
  return stages;
}

int32_t rankOf(int32_t pipeline_stage, int32_t n) {
  return pipeline_stage < n ? pipeline_stage : 2 * n - 2 - pipeline_stage;
}

std::optional<std::vector<int32_t>> assignPipelineStages(const ir::Graph& program) {
  const std::vector<int32_t> stages = modelStages(program);
  if (stages.size() < 2) return std::nullopt;
  const auto n = static_cast<int32_t>(stages.size());
  // Per buffer: the latest pipeline stage that wrote it, and that read it.
  std::vector<int32_t> written(program.buffers.size(), 0);
  std::vector<int32_t> read(program.buffers.size(), 0);
  std::vector<int32_t> assigned;
  assigned.reserve(program.nodes.size());
  for (const ir::Node& node : program.nodes) {
    int32_t after = 0;  // the earliest pipeline stage its dependencies allow
    for (const ir::TensorRef& in : node.inputs) after = std::max(after, written[in.buffer]);
    auto writing = [&](ir::BufferId b) { after = std::max({after, written[b], read[b]}); };
    for (ir::BufferId w : node.writes) writing(w);
    for (const ir::TensorRef& out : node.outputs) writing(out.buffer);

    int32_t stage = after;
    if (inModelStage(node.placement)) {
      const auto rank = static_cast<int32_t>(
          std::lower_bound(stages.begin(), stages.end(), node.placement.stage) - stages.begin());
      const int32_t forward = rank;
      const int32_t backward = 2 * n - 2 - rank;
      if (after > backward) return std::nullopt;
      stage = after <= forward ? forward : backward;
    }
    for (const ir::TensorRef& in : node.inputs) read[in.buffer] = std::max(read[in.buffer], stage);
    for (ir::BufferId w : node.writes) written[w] = std::max(written[w], stage);
    for (const ir::TensorRef& out : node.outputs) {
      written[out.buffer] = std::max(written[out.buffer], stage);
    }
    assigned.push_back(stage);
  }
  return assigned;
}

ir::Graph orderByPipelineStage(ir::Graph program) {
  const std::optional<std::vector<int32_t>> stages = assignPipelineStages(program);
  if (!stages || std::is_sorted(stages->begin(), stages->end())) return program;
  std::vector<size_t> order(program.nodes.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return (*stages)[a] < (*stages)[b]; });
  std::vector<ir::Node> nodes;
  nodes.reserve(order.size());
  for (size_t i : order) nodes.push_back(std::move(program.nodes[i]));
  program.nodes = std::move(nodes);
  return program;
}

std::vector<PipelineStage> pipelineStages(const ir::Graph& program) {
  const std::optional<std::vector<int32_t>> stages = assignPipelineStages(program);
  if (!stages || !std::is_sorted(stages->begin(), stages->end())) return {};
  const auto n = static_cast<int32_t>(modelStages(program).size());
  // The IPU of each model stage: its blocks'.
  std::vector<int32_t> ipu_of_rank(static_cast<size_t>(n), -1);
  for (size_t i = 0; i < program.nodes.size(); ++i) {
    const ir::Placement& placement = program.nodes[i].placement;
    int32_t& ipu = ipu_of_rank[static_cast<size_t>(rankOf((*stages)[i], n))];
    if (inModelStage(placement) && ipu < 0) ipu = placement.ipu;
  }
  std::vector<PipelineStage> ranges;
  for (size_t i = 0; i < stages->size(); ++i) {
    if (i == 0 || (*stages)[i] != (*stages)[i - 1]) {
      const int32_t ipu = ipu_of_rank[static_cast<size_t>(rankOf((*stages)[i], n))];
      ranges.push_back({i, i, std::max(ipu, 0)});
    }
    ranges.back().end = i + 1;
  }
  if (ranges.size() < 2) return {};
  return ranges;
}

int64_t bytesExchangedBetweenIpus(const ir::Graph& program) {
  std::vector<int32_t> home(program.buffers.size(), -1);
  absl::flat_hash_set<std::pair<ir::BufferId, int32_t>> received;
  int64_t bytes = 0;
  for (const ir::Node& node : program.nodes) {
    const int32_t ipu = node.placement.ipu;
    for (const ir::TensorRef& in : node.inputs) {
      int32_t& at = home[in.buffer];
      if (at < 0) at = ipu;
      if (at != ipu && received.emplace(in.buffer, ipu).second) {
        bytes += program.buffers[in.buffer].nbytes;
      }
    }
    for (ir::BufferId w : node.writes) {
      if (home[w] < 0) home[w] = ipu;
    }
    for (const ir::TensorRef& out : node.outputs) {
      if (home[out.buffer] < 0) home[out.buffer] = ipu;
    }
  }
  return bytes;
}

}  // namespace poptorch::compiler
