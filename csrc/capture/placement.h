// Which block (stage, phase, IPU) each captured node belongs to, for models
// split over several IPUs with poptorch.BeginBlock / poptorch.Block.
//
// While a wrapped model's step is captured, Python tells this thread which
// block its forward is in (setBlock); forward nodes take that block. The
// backward of an op belongs to the block of the op: autograd numbers the
// nodes it creates (at::sequence_number) and runs each backward function
// with it as the current node, so a block remembers the first sequence number
// it began at, and a backward node takes the block whose range holds the
// sequence number of the autograd node being run.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace poptorch::capture {

// Starts recording placements on this thread: nodes are before any block.
void beginPlacements();
// From the next op on, this thread's forward ops belong to `placement`.
void setBlock(const ir::Placement& placement);
// The forward has ended: ops that are not the backward of a forward op (the
// optimiser update, accumulators) are in no block (see placeCapturedOp).
void endForward();
// Stops recording placements on this thread.
void endPlacements();

// A checkpointed part of the forward (torch.utils.checkpoint) runs again in
// backward: until endRecompute, ops take the block setBlock names, as they
// did in the forward, not the block of the backward node being run.
void beginRecompute();
void endRecompute();

// The placement of `node`, captured now on this thread (the default outside
// beginPlacements/endPlacements); counted in forwardBlockUse when forward.
// After the forward, outside the backward, a node is in no block and runs on
// the IPU `inputs_ipu` names (the IPU of its inputs' memory).
ir::Placement placeCapturedOp(const ir::Node& node, const std::function<int()>& inputs_ipu);

// Forward nodes captured per block since beginPlacements (by Placement::block),
// with the first op's name: for the rules on blocks (every op of a model
// annotated with `with Block` scopes must be in one).
struct BlockUse {
  int32_t block;
  int64_t nodes;
  std::string first_op;
};
std::vector<BlockUse> forwardBlockUse();

}  // namespace poptorch::capture
