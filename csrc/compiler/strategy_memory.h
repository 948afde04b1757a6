// Memory per IPU under the multi-IPU execution strategies, beyond what each
// IPU holds (weights, optimiser state): what planMemory's peak of one run's
// temporaries becomes when the stages of a model split over IPUs run as a
// pipeline, or in phases.
//
// Pipelined execution: a pipeline runs stage k of micro-batch i while stage
// k+1 runs micro-batch i-1, so a temporary made in pipeline stage a and last
// read in pipeline stage b > a is alive for b - a + 1 micro-batches at once
// (the forward of model stage k of N keeps its activations for the backward,
// 2 (N - k) - 1 pipeline stages later, as PopART's stashes do; the
// pipeline's rules give it that many micro-batches). Its IPU (the one of the
// node that makes it) keeps those copies all along; a temporary used within
// one pipeline stage lives from its first use to its last, as in planMemory.
//
// Phased execution (poptorch.SerialPhasedExecution,
// poptorch.ParallelPhasedExecution), as PopTorch's user guide describes it:
// weights, their optimiser state and accumulators live in streaming memory
// and are brought onto an IPU for the phases that use them; activations stay
// on the IPU or go to streaming memory between phases, as the strategy's
// poptorch.Liveness says.
//
// A run is a sequence of phases: the forward phases in order, then the
// backward ones in reverse order. The last forward phase and the first
// backward phase are one phase (the backward of the last model stage joins
// its forward, see compiler/pipeline_stages.h), which makes the peak of
// useSeparateBackwardPhase an upper bound (its separate phase could free
// more). A node in no block (gradient accumulation, an update in the step)
// is in the phase of the pipeline stage its dependencies give it. In a
// program with no model stages (the update of accumulated gradients), each
// node is a phase of its own: it brings in the tensors it updates.
#pragma once

#include <cstdint>
#include <vector>

#include "compiler/executable.h"

namespace poptorch::compiler {

// poptorch.Liveness, by value.
enum class Liveness : int32_t {
  kAlwaysLive = 0,                // activations stay on the IPU that makes them
  kOffChipAfterFwd = 1,           // the forward's activations the backward needs wait
  kOffChipAfterFwdNoOverlap = 2,  // off the chip between the passes (same memory)
  kOffChipAfterEachPhase = 3,     // activations are on the chip only in phases that use them
};

// Per node of exe.program, the phase of the run it belongs to (numbered in
// order from 0), and per phase whether it is a backward one.
struct RunPhases {
  std::vector<int32_t> of_node;
  std::vector<bool> backward;
};
RunPhases runPhases(const ir::Graph& program);

// Matrix multiplications: while one runs, its IPU needs temporaries beyond
// its operands and result, as PopLibs plans them: its operands rearranged
// for the tiles and float32 partials of its result, batch x (M K + K N) x
// the operands' element size + batch x M N x 4 bytes for [M, K] x [K, N].
// poptorch.serializedMatMul computes it in `factor` parts one after another,
// so the dimension it splits (InputChannels: M, ReducingDim: K,
// OutputChannels: N) counts 1/factor; the planner keeps the temporaries
// within the available memory proportion of the IPU's memory
// (poptorch.set_available_memory on the result, else the model's
// Options.setAvailableMemoryProportion for the IPU, else PopLibs' 0.6).
struct MatMulMemory {
  std::vector<double> available_memory;  // per IPU; 0 (or none): PopLibs' 0.6
  int64_t capacity = 0;                  // bytes of each IPU
};
int64_t matMulWorkingBytes(const ir::Node& node, int32_t ipu, const MatMulMemory& memory);

// Per IPU: the peak bytes of the temporaries of `exe` run one micro-batch at
// a time (and of its matmuls' working memory).
std::vector<int64_t> sequentialPeakBytes(const Executable& exe, const MatMulMemory& memory);

// Per IPU: the peak bytes of the temporaries of `exe` run as a pipeline (and
// of its matmuls' working memory); sequentialPeakBytes when it has fewer than
// two pipeline stages.
std::vector<int64_t> pipelinedPeakBytes(const Executable& exe, const MatMulMemory& memory);

// Per IPU: the peak bytes a phased run of `exe` needs on it: in each phase,
// the streamed buffers (`streamed[b]`) its nodes on that IPU use, plus the
// temporaries on the chip at each node. A temporary counts on the IPU of the
// node that makes it (as in planMemory). Matmuls add their working memory.
std::vector<int64_t> phasedPeakBytes(const Executable& exe, const std::vector<bool>& streamed,
                                     Liveness liveness, const MatMulMemory& memory);

}  // namespace poptorch::compiler
