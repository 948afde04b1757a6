#include "capture/placement.h"

#include <ATen/SequenceNumber.h>
#include <torch/csrc/autograd/function.h>

#include <algorithm>
#include <optional>
#include <utility>

namespace poptorch::capture {
namespace {

struct ThreadPlacements {
  bool recording = false;
  bool in_forward = false;
  int recomputing = 0;  // nesting depth of beginRecompute
  ir::Placement current;
  // (first autograd sequence number, block) in the order blocks began.
  std::vector<std::pair<uint64_t, ir::Placement>> by_sequence;
  std::vector<BlockUse> uses;
};

// Per thread: each thread that captures a step has its own blocks.
thread_local ThreadPlacements state;

std::optional<ir::Placement> backwardPlacement() {
  const auto node = torch::autograd::get_current_node();
  if (!node || state.by_sequence.empty()) return std::nullopt;
  const uint64_t seq = node->sequence_nr();
  auto it = std::upper_bound(state.by_sequence.begin(), state.by_sequence.end(), seq,
                             [](uint64_t s, const auto& entry) { return s < entry.first; });
  if (it == state.by_sequence.begin()) return std::nullopt;  // made before the forward
  return std::prev(it)->second;
}

}  // namespace

void beginPlacements() {
  state = ThreadPlacements{};
  state.recording = true;
  state.in_forward = true;
  state.by_sequence.emplace_back(at::sequence_number::peek(), state.current);
}

void setBlock(const ir::Placement& placement) {
  if (!state.recording) return;
  state.current = placement;
  state.by_sequence.emplace_back(at::sequence_number::peek(), placement);
}

void endForward() {
  state.in_forward = false;
  state.current = ir::Placement{};
}

void endPlacements() { state = ThreadPlacements{}; }

void beginRecompute() { ++state.recomputing; }

void endRecompute() {
  if (state.recomputing > 0) --state.recomputing;
  if (state.recomputing == 0 && !state.in_forward) state.current = ir::Placement{};
}

ir::Placement placeCapturedOp(const ir::Node& node, const std::function<int()>& inputs_ipu) {
  if (!state.recording) return {};
  if (state.recomputing > 0) return state.current;
  if (std::optional<ir::Placement> backward = backwardPlacement()) return *backward;
  if (!state.in_forward) {
    ir::Placement outside;
    // Outside every block (not kBeforeBlocks, the layers before the first block).
    outside.block = ir::Placement::kOutsideBlocks;
    outside.ipu = inputs_ipu();
    return outside;
  }
  auto use = std::find_if(state.uses.begin(), state.uses.end(),
                          [](const BlockUse& u) { return u.block == state.current.block; });
  if (use == state.uses.end()) {
    state.uses.push_back({state.current.block, 1, node.name()});
  } else {
    ++use->nodes;
  }
  return state.current;
}

std::vector<BlockUse> forwardBlockUse() { return state.uses; }

}  // namespace poptorch::capture
