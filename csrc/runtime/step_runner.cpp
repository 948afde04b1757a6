#include "runtime/step_runner.h"

#include <ATen/ops/zeros.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <exception>
#include <functional>

#include "common/denormal_mode.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "profiling/profiler.h"
#include "runtime/executor.h"
#include "runtime/guard_failure.h"
#include "runtime/program_twin.h"
#include "runtime/worker.h"

namespace poptorch::runtime {
namespace {

// Where micro-batch k's values of an output go: a slot of the result, or nowhere.
class OutputSlots {
 public:
  OutputSlots(const StepShape& shape, const Gather& gather) : shape_(shape), gather_(gather) {
    const int64_t per_iteration = shape.accumulation * shape.replicas;
    switch (gather.mode) {
      case OutputMode::kAll:
        count_ = shape.iterations * per_iteration;
        break;
      case OutputMode::kEveryN:
        count_ = (shape.iterations / gather.return_period) * per_iteration;
        break;
      case OutputMode::kFinal:
      case OutputMode::kSum:
        count_ = shape.replicas;
        break;
    }
  }

  int64_t count() const { return count_; }
  bool sums() const { return gather_.mode == OutputMode::kSum; }

  // -1 when micro-batch k returns nothing.
  int64_t slotOf(int64_t k) const {
    const int64_t per_iteration = shape_.accumulation * shape_.replicas;
    const int64_t iteration = k / per_iteration;
    const int64_t within = k % per_iteration;
    const int64_t replica = k % shape_.replicas;
    switch (gather_.mode) {
      case OutputMode::kAll:
        return k;
      case OutputMode::kEveryN:
        if ((iteration + 1) % gather_.return_period != 0) return -1;
        return ((iteration + 1) / gather_.return_period - 1) * per_iteration + within;
      case OutputMode::kFinal:
        return k >= (shape_.iterations * per_iteration - shape_.replicas) ? replica : -1;
      case OutputMode::kSum:
        return replica;
    }
    return -1;
  }

 private:
  StepShape shape_;
  Gather gather_;
  int64_t count_ = 0;
};

// A gathered output: slots x the device output's shape, returned with the slots
// folded into the first dimension (or stacked, for scalars; or dropped, for one).
class GatheredOutput {
 public:
  GatheredOutput(const at::Tensor& device_output, int64_t slots) : device_(device_output) {
    std::vector<int64_t> sizes{slots};
    sizes.insert(sizes.end(), device_output.sizes().begin(), device_output.sizes().end());
    slots_ = at::zeros(sizes, device_output.options().device(c10::kCPU));
  }

  // Gathers from `device` (the output, or its twin in another lane).
  void gather(int64_t slot, bool sum, const at::Tensor& device) {
    at::Tensor source = hostAlias(device);
    at::Tensor target = slots_.select(0, slot);
    if (sum) {
      target.add_(source);
    } else {
      target.copy_(source);
    }
  }

  at::Tensor result() const {
    if (slots_.size(0) == 1) return slots_.squeeze(0);
    if (device_.dim() == 0) return slots_;
    return slots_.flatten(0, 1);
  }

 private:
  at::Tensor device_;
  at::Tensor slots_;
};

void copyRows(const at::Tensor& host, int64_t k, const at::Tensor& device) {
  const size_t nbytes = device.nbytes();
  TORCH_CHECK(host.is_contiguous() && device.is_contiguous() &&
                  host.scalar_type() == device.scalar_type() &&
                  static_cast<size_t>(host.nbytes()) >= (k + 1) * nbytes,
              "internal: a host batch does not match the device input it feeds");
  auto* source = static_cast<const char*>(host.const_data_ptr()) + k * nbytes;
  std::memcpy(device.mutable_data_ptr(), source, nbytes);
  Metrics::get().bytesToIpu(static_cast<int64_t>(nbytes));
}

// The step changed its input in place: so do micro-batch k's rows of the host
// batch, as the CPU changes the caller's tensor.
void copyRowsBack(const at::Tensor& device, int64_t k, const at::Tensor& host) {
  const size_t nbytes = device.nbytes();
  auto* target = static_cast<char*>(host.mutable_data_ptr()) + k * nbytes;
  std::memcpy(target, device.const_data_ptr(), nbytes);
  Metrics::get().bytesFromIpu(static_cast<int64_t>(nbytes));
}

// One lane of execution: a micro-step and the device tensors it reads its
// inputs from and writes its outputs to.
struct Lane {
  // Runs one micro-step; returns the program that ran.
  std::function<const Program&(uint64_t seed_salt)> run;
  std::vector<at::Tensor> inputs;
  std::vector<at::Tensor> outputs;
};

// A second lane for `micro_step`: a twin with inputs and outputs of its own.
std::pair<std::unique_ptr<Program>, Lane> twinLane(const Program& micro_step,
                                                   const std::vector<at::Tensor>& inputs,
                                                   const std::vector<at::Tensor>& outputs) {
  ProgramTwin twin = twinWithOwnIo(micro_step, inputs, outputs);
  Lane lane;
  lane.inputs = std::move(twin.inputs);
  lane.outputs = std::move(twin.outputs);
  lane.run = [program = twin.program.get()](uint64_t seed_salt) -> const Program& {
    program->run(seed_salt);
    return *program;
  };
  return {std::move(twin.program), std::move(lane)};
}

// Inference micro-batches are independent: with two lanes, one per core,
// they run two at a time. Only when the program writes nothing the lanes
// share, needs no calling thread (default-generator randoms, host effects),
// and outputs are not summed. A program specialised on values read while
// capturing may run there too (see runLanes).
bool lanesApply(const Program* micro_step, const UpdateVariants* update,
                const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs,
                const StepShape& shape, const std::vector<OutputSlots>& slots) {
  const bool sums =
      std::any_of(slots.begin(), slots.end(), [](const OutputSlots& s) { return s.sums(); });
  if (micro_step == nullptr || update != nullptr || sums || micro_step->needsCallingThread() ||
      shape.iterations * shape.accumulation * shape.replicas < 2) {
    return false;
  }
  // Inputs are reloaded for every micro-batch; an output written in place (a
  // buffer the model returns) would carry a value from one to the next.
  std::vector<c10::Storage> reloaded;
  std::vector<c10::Storage> produced;
  for (const at::Tensor& t : inputs) reloaded.push_back(t.storage());
  for (const at::Tensor& t : outputs) produced.push_back(t.storage());
  return micro_step->writesOnly(reloaded, produced);
}

// What the lanes of one call share.
struct Call {
  const std::vector<at::Tensor>& host_inputs;
  const std::vector<OutputSlots>& slots;
  std::vector<GatheredOutput>& outputs;
  uint64_t seed;
  StepTimeline* timeline;  // may be null
  // With one lane, or a pipeline (no replica buffers):
  UpdateVariants* update = nullptr;  // after every `per_iteration`-th micro-batch
  int64_t per_iteration = 1;
  ReplicaBuffers* replica_buffers = nullptr;
  int64_t replicas = 1;
  // Runs before each run of `update` (may be empty).
  std::function<void()> before_update;
};

// Fills `inputs` with micro-batch k's rows of the host inputs.
void loadInputs(const Call& call, int64_t k, const std::vector<at::Tensor>& inputs) {
  StepTimeline* timeline = call.timeline;
  for (size_t j = 0; j < inputs.size(); ++j) {
    if (timeline != nullptr) timeline->input[j][k] = profiling::now();
    copyRows(call.host_inputs[j], k, inputs[j]);
    if (timeline != nullptr) timeline->input_complete[j][k] = profiling::now();
  }
}

// After micro-batch k ran `ran`: the input rows it changed go back to the
// host batch, and its outputs to their slots.
void unloadOutputs(const Call& call, int64_t k, const Program& ran,
                   const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs) {
  StepTimeline* timeline = call.timeline;
  for (size_t j = 0; j < inputs.size(); ++j) {
    if (ran.writes(inputs[j].storage().unsafeGetStorageImpl())) {
      copyRowsBack(inputs[j], k, call.host_inputs[j]);
    }
  }
  for (size_t o = 0; o < call.outputs.size(); ++o) {
    const int64_t slot = call.slots[o].slotOf(k);
    if (slot < 0) continue;
    if (timeline != nullptr) timeline->output[o][slot] = profiling::now();
    call.outputs[o].gather(slot, call.slots[o].sums(), outputs[o]);
    if (timeline != nullptr) timeline->output_complete[o][slot] = profiling::now();
  }
}

// Runs the update after an iteration's micro-batches, which ran the variants `ran`.
void runUpdate(const Call& call, const std::vector<size_t>& ran) {
  if (call.before_update) call.before_update();
  call.update->forVariants(ran).run();
}

// Runs micro-batches first, first + stride, ... of `count` on `lane`;
// `variants` says which variants ran before each update. With `stopped`, a
// guard that fails stops the lane: `*stopped` is then the micro-batch it
// failed on (whose run left no trace), else `count`.
void runLane(const Lane& lane, int64_t first, int64_t stride, int64_t count, const Call& call,
             StepVariants& variants, int64_t* stopped = nullptr) {
  StepTimeline* timeline = call.timeline;
  if (stopped != nullptr) *stopped = count;
  for (int64_t k = first; k < count; k += stride) {
    if (call.replica_buffers != nullptr) call.replica_buffers->select(k % call.replicas);
    loadInputs(call, k, lane.inputs);
    if (timeline != nullptr) timeline->launch[k] = profiling::now();
    const Program* ran = nullptr;
    try {
      ran = &lane.run(call.seed + static_cast<uint64_t>(k) + 1);
    } catch (const GuardFailure&) {
      if (stopped == nullptr) throw;
      *stopped = k;
      return;
    }
    if (timeline != nullptr) timeline->launch_complete[k] = profiling::now();
    unloadOutputs(call, k, *ran, lane.inputs, lane.outputs);
    if (call.update != nullptr && (k + 1) % call.per_iteration == 0) {
      runUpdate(call, variants.takeRan());
    }
  }
}

// Runs the micro-batches through `pipeline`, flushed before each update.
void runPipelined(PipelineScheduler& pipeline, int64_t count, const Call& call) {
  const MicroBatchIo io{
      [&call](int64_t k, const std::vector<at::Tensor>& inputs) { loadInputs(call, k, inputs); },
      [&call](int64_t k, const Program& ran, const std::vector<at::Tensor>& inputs,
              const std::vector<at::Tensor>& outputs) {
        unloadOutputs(call, k, ran, inputs, outputs);
      }};
  const int64_t group = call.update != nullptr ? call.per_iteration : count;
  for (int64_t first = 0; first < count; first += group) {
    pipeline.run(first, std::min(group, count - first), call.seed, io, call.timeline);
    if (call.update != nullptr) runUpdate(call, {0});  // the only variant
  }
}

// Runs micro-batches on two lanes at once, on the threads of an OpenMP team of
// two: its threads persist between calls, and the kernels inside it run on one
// thread each (OpenMP does not nest). A smaller team runs both lanes in turn.
// Lane l runs micro-batches l, l + 2, ...; a guard that fails stops it, and
// `stopped[l]` is where (see runLane).
void runInTwoLanes(const Lane& first, const Lane& second, int64_t count, const Call& call,
                   StepVariants& variants, std::array<int64_t, 2>& stopped) {
  const Lane* lanes[] = {&first, &second};
  std::exception_ptr errors[2];
  const int64_t session = profiling::currentSession();  // the caller's, for the team's threads
  const uint32_t denormal_mode = denormalMode();
#pragma omp parallel num_threads(2)
  {
    const profiling::SessionScope in_session(session, omp_get_thread_num());
    const DenormalModeOfCall of_call(denormal_mode);
    for (int l = omp_get_thread_num(); l < 2; l += omp_get_num_threads()) {
      try {
        runLane(*lanes[l], l, 2, count, call, variants, &stopped[l]);
      } catch (...) {
        errors[l] = std::current_exception();
      }
    }
  }
  for (const std::exception_ptr& error : errors) {
    if (error) std::rethrow_exception(error);
  }
}

// Runs the micro-batches of an inference call on two lanes (see lanesApply):
// `only`, the step's one variant, on `lane`'s tensors and on a twin's. The
// lanes cannot capture the step again, which takes the calling thread: a
// micro-batch whose guard fails, and the rest of its lane's, run afterwards on
// `lane` through `variants`, which captures a variant for their values.
void runLanes(const Program& only, const Lane& lane, int64_t count, const Call& call,
              StepVariants& variants) {
  auto [twin, second] = twinLane(only, lane.inputs, lane.outputs);
  const Lane first{[&only](uint64_t seed_salt) -> const Program& {
                     only.run(seed_salt);
                     return only;
                   },
                   lane.inputs, lane.outputs};
  std::array<int64_t, 2> stopped{count, count};
  POPTORCH_LOG(kDebug) << "the inference micro-batches run on two lanes";
  runInTwoLanes(first, second, count, call, variants, stopped);
  for (int64_t k = std::min(stopped[0], stopped[1]); k < count; ++k) {
    if (k < stopped[k % 2]) continue;
    POPTORCH_LOG(kDebug) << "micro-batch " << k << " runs again on the calling thread: a guard "
                         << "failed on its lane";
    runLane(lane, k, 1, k + 1, call, variants);
  }
}

// Sizes the timeline for one call.
void prepare(StepTimeline& timeline, size_t inputs, int64_t count,
             const std::vector<OutputSlots>& slots) {
  const auto n = static_cast<size_t>(count);
  timeline.input.assign(inputs, std::vector<int64_t>(n, 0));
  timeline.input_complete.assign(inputs, std::vector<int64_t>(n, 0));
  timeline.launch.assign(n, 0);
  timeline.launch_complete.assign(n, 0);
  timeline.output.clear();
  timeline.output_complete.clear();
  for (const OutputSlots& s : slots) {
    timeline.output.emplace_back(static_cast<size_t>(s.count()), 0);
    timeline.output_complete.emplace_back(static_cast<size_t>(s.count()), 0);
  }
}

}  // namespace

std::vector<at::Tensor> runSteps(
    StepVariants& micro_step, UpdateVariants* update, const std::vector<at::Tensor>& device_inputs,
    const std::vector<at::Tensor>& host_inputs, const std::vector<at::Tensor>& device_outputs,
    const StepShape& shape, uint64_t seed, ReplicaBuffers* replica_buffers,
    const std::function<void()>& before_update, StepTimeline* timeline) {
  TORCH_CHECK(device_inputs.size() == host_inputs.size(),
              "internal: host and device inputs differ in number");
  Worker::get().waitIdle();
  micro_step.takeRan();  // what a failed call ran counts for no update
  // The CPU model computes each call in the denormal mode of that call.
  const DenormalModeOfCall of_call(denormalMode());
  TORCH_CHECK(shape.output_gathers.empty() || shape.output_gathers.size() == device_outputs.size(),
              "internal: an output mode for some outputs only");
  std::vector<OutputSlots> slots;
  std::vector<GatheredOutput> outputs;
  slots.reserve(device_outputs.size());
  outputs.reserve(device_outputs.size());
  for (size_t o = 0; o < device_outputs.size(); ++o) {
    slots.emplace_back(shape,
                       shape.output_gathers.empty() ? shape.gather : shape.output_gathers[o]);
    outputs.emplace_back(device_outputs[o], slots.back().count());
  }

  const int64_t per_iteration = shape.accumulation * shape.replicas;
  const int64_t count = shape.iterations * per_iteration;
  if (timeline != nullptr) prepare(*timeline, device_inputs.size(), count, slots);
  const Lane lane{
      [&micro_step](uint64_t seed_salt) -> const Program& { return micro_step.run(seed_salt); },
      device_inputs, device_outputs};
  Call call{host_inputs, slots, outputs, seed, timeline};
  const Program* unguarded = micro_step.unguarded();
  std::unique_ptr<PipelineScheduler> pipeline;
  if (unguarded != nullptr && replica_buffers == nullptr &&
      shape.stages != StageSchedule::kProgramOrder) {
    std::string why_not;
    pipeline =
        PipelineScheduler::make(*unguarded, device_inputs, device_outputs, shape.stages, why_not);
    if (!pipeline) {
      POPTORCH_LOG(kDebug) << "the stages run in program order: " << why_not;
    }
  }
  if (pipeline) {
    call.update = update;
    call.per_iteration = per_iteration;
    call.before_update = before_update;
    runPipelined(*pipeline, count, call);
  } else if (replica_buffers == nullptr &&
             lanesApply(micro_step.only(), update, device_inputs, device_outputs, shape, slots)) {
    runLanes(*micro_step.only(), lane, count, call, micro_step);
  } else {
    // Replica 0's buffers are the host's again after the call, even a failed one.
    struct Settle {
      ReplicaBuffers* buffers;
      ~Settle() {
        if (buffers == nullptr) return;
        try {
          buffers->settle();
        } catch (const std::exception& error) {  // a destructor must not throw
          POPTORCH_LOG(kErr) << "restoring replica 0's buffers failed: " << error.what();
        }
      }
    } settle{replica_buffers};
    call.update = update;
    call.per_iteration = per_iteration;
    call.replica_buffers = replica_buffers;
    call.replicas = shape.replicas;
    call.before_update = before_update;
    runLane(lane, 0, 1, count, call, micro_step);
  }

  std::vector<at::Tensor> results;
  results.reserve(outputs.size());
  for (const GatheredOutput& out : outputs) {
    results.push_back(out.result());
    Metrics::get().bytesFromIpu(static_cast<int64_t>(results.back().nbytes()));
  }
  return results;
}

}  // namespace poptorch::runtime
