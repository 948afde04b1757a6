// The replay loop of trainingModel/inferenceModel: one call runs
// `iterations x accumulation x replicas` micro-batches through a captured
// micro-step program (and the optimiser update after each iteration) in C++.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

#include "runtime/pipeline_scheduler.h"
#include "runtime/program.h"
#include "runtime/replica_buffers.h"
#include "runtime/step_variants.h"
#include "runtime/update_variants.h"

namespace poptorch::runtime {

enum class OutputMode : int { kAll = 0, kFinal = 1, kEveryN = 2, kSum = 3 };

// Which micro-batches' values of one output are returned, and how.
struct Gather {
  OutputMode mode = OutputMode::kAll;
  int64_t return_period = 1;  // kEveryN: every return_period-th iteration
};

struct StepShape {
  int64_t iterations = 1;
  int64_t accumulation = 1;
  int64_t replicas = 1;
  Gather gather;                       // of every output without one of its own
  std::vector<Gather> output_gathers;  // per output (PopTorch's anchored tensors), or empty
  // A model split over IPUs: how its stages run.
  StageSchedule stages = StageSchedule::kProgramOrder;
};

// When each micro-batch of a call moved its data and ran, in nanoseconds on
// profiling::now()'s clock: PopTorch's performance counters
// (PoplarExecutor.getPerfCounters, the latencies, cycleCount) and the
// profile's host transfers. A few clock reads per micro-batch.
struct StepTimeline {
  // [input][micro-batch]: its rows' copy to the device started, completed.
  std::vector<std::vector<int64_t>> input, input_complete;
  // [micro-batch]: its micro-step started, completed.
  std::vector<int64_t> launch, launch_complete;
  // [output][slot of the result]: the copy to the host started, completed.
  std::vector<std::vector<int64_t>> output, output_complete;
};

// Micro-batch k (ordered by iteration, then accumulation step, then replica)
// is rows [k*b, (k+1)*b) of every host input, b being the device input's first
// dimension. After each run of `micro_step` the device outputs are gathered
// per their output mode into host tensors, which are returned. `update` (may be
// null) runs after each iteration's micro-batches, the program for the variants
// they ran. A micro-step whose guards
// fail is captured again (see StepVariants) and the loop goes on.
// `replica_buffers` (may be null) swaps in each replica's own buffers.
// `before_update` (may be empty) runs before each run of `update`: with replicas
// in other processes, it reduces the accumulated gradients across them.
// `timeline` (may be null) records when each micro-batch moved and ran.
// A micro-step split into pipeline stages runs them as `shape.stages` says
// (see PipelineScheduler), when it can; a pipeline fills and drains for each
// iteration's micro-batches, before the update.
std::vector<at::Tensor> runSteps(
    StepVariants& micro_step, UpdateVariants* update, const std::vector<at::Tensor>& device_inputs,
    const std::vector<at::Tensor>& host_inputs, const std::vector<at::Tensor>& device_outputs,
    const StepShape& shape, uint64_t seed, ReplicaBuffers* replica_buffers = nullptr,
    const std::function<void()>& before_update = {}, StepTimeline* timeline = nullptr);

}  // namespace poptorch::runtime
