// The pipeline stages of a program split over IPUs (poptorch.BeginBlock,
// poptorch.Block): which nodes run together on one IPU for one micro-batch.
//
// A model of N stages trains through 2N-1 pipeline stages, as in PopTorch:
// the forward of stages 0..N-1, then the backward of stages N-2..0 (the last
// stage's backward joins its forward). Inference has the N forward ones. A
// node takes the first pipeline stage of its block's stage that comes at or
// after every node it depends on (what it reads, and every earlier access to
// what it writes), so a backward node that needs only forward values runs
// in the forward. The layers before the first block (and their backward)
// are model stage 0 on IPU 0, as in PopTorch. A node in no block (the loss's
// seed gradient, gradient accumulation, the update) takes the first pipeline
// stage its dependencies allow.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "ir/graph.h"

namespace poptorch::compiler {

struct PipelineStage {
  size_t begin = 0;  // its nodes, [begin, end) of the program
  size_t end = 0;
  int32_t ipu = 0;  // the IPU of its block's stage
};

// Whether `placement` is in one of the model's stages: a block's, or the
// layers before the first block (stage 0 on IPU 0, as in PopTorch), not the
// ops after the forward that no block holds (the update, accumulators).
bool inModelStage(const ir::Placement& placement);

// The stages of the program's blocks, in order.
std::vector<int32_t> modelStages(const ir::Graph& program);

// The rank (in modelStages) of the model stage that pipeline stage
// `pipeline_stage` of a model of `n` stages belongs to.
int32_t rankOf(int32_t pipeline_stage, int32_t n);

// Per node, its pipeline stage (an index into the 2N-1 of the model), or
// nothing when the program has fewer than two stages or a node depends on a
// later pipeline stage than its own can be (the stages cannot then run as a
// pipeline).
std::optional<std::vector<int32_t>> assignPipelineStages(const ir::Graph& program);

// The program with its nodes ordered by pipeline stage (stable), so that
// each pipeline stage is one range of nodes; unchanged when the stages
// cannot be assigned. Every pair of nodes that access a buffer keeps its
// order: the program computes the same values.
ir::Graph orderByPipelineStage(ir::Graph program);

// The program's pipeline stages as ranges of nodes, in order (empty ones
// left out); empty when it has fewer than two, or its nodes are not ordered
// by pipeline stage.
std::vector<PipelineStage> pipelineStages(const ir::Graph& program);

// The bytes one run moves between IPUs: a buffer lives on the IPU of the
// first node that uses it (a node runs on its block's IPU, see
// ir::Placement), and each other IPU that reads it receives it once.
int64_t bytesExchangedBetweenIpus(const ir::Graph& program);

}  // namespace poptorch::compiler
