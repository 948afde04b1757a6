#include "runtime/pipeline_scheduler.h"

#include <ATen/Parallel.h>
#include <omp.h>

#include <algorithm>
#include <utility>

#include "common/denormal_mode.h"
#include "profiling/profiler.h"
#include "runtime/step_runner.h"

namespace poptorch::runtime {
namespace {

// Why the stages of `program` cannot hold several micro-batches at once
// (empty if they can): a buffer that one stage writes and another uses
// carries a value from one micro-batch to the next, which a pipeline would
// read out of turn; an output that is not computed afresh by each
// micro-batch cannot be one of each micro-batch's own. `inputs` and `outputs`
// are each micro-batch's own.
std::string carriedValue(const Program& program, const std::vector<compiler::PipelineStage>& stages,
                         const std::vector<at::Tensor>& inputs,
                         const std::vector<at::Tensor>& outputs) {
  const ir::Graph& graph = program.compiledGraph();
  const std::vector<c10::Storage>& storages = program.storages();
  auto among = [&](ir::BufferId b, const std::vector<at::Tensor>& tensors) {
    return std::any_of(tensors.begin(), tensors.end(),
                       [&](const at::Tensor& t) { return storages[b].is_alias_of(t.storage()); });
  };
  const size_t num_buffers = graph.buffers.size();
  std::vector<int> stage_of(num_buffers, -1);  // the stage that uses it, or -1
  std::vector<bool> several(num_buffers, false), written(num_buffers, false);
  std::vector<bool> produced_first(num_buffers, false), used(num_buffers, false);
  for (size_t s = 0; s < stages.size(); ++s) {
    for (size_t i = stages[s].begin; i < stages[s].end; ++i) {
      const ir::Node& node = graph.nodes[i];
      auto use = [&](ir::BufferId b, bool writes, bool produces) {
        if (!storages[b]) return;  // a temporary: each micro-batch has its own
        if (!used[b]) produced_first[b] = produces;
        used[b] = true;
        several[b] = several[b] || (stage_of[b] >= 0 && stage_of[b] != static_cast<int>(s));
        stage_of[b] = static_cast<int>(s);
        written[b] = written[b] || writes;
      };
      for (const ir::TensorRef& in : node.inputs) use(in.buffer, false, false);
      for (ir::BufferId w : node.writes) use(w, true, false);
      for (const ir::TensorRef& out : node.outputs) use(out.buffer, true, true);
    }
  }
  for (size_t b = 0; b < num_buffers; ++b) {
    const auto id = static_cast<ir::BufferId>(b);
    if (!used[b] || among(id, inputs)) continue;
    if (among(id, outputs) && !produced_first[b]) {
      return "an output of " + std::to_string(graph.buffers[b].nbytes) +
             " bytes is not computed afresh by every micro-batch (the model returns a weight or "
             "a buffer it updates)";
    }
    if (written[b] && several[b] && !among(id, outputs)) {
      return "a tensor of " + std::to_string(graph.buffers[b].nbytes) +
             " bytes that the step keeps from one micro-batch to the next is written by one "
             "pipeline stage and used by another (e.g. a weight shared by two stages)";
    }
  }
  return {};
}

}  // namespace

std::unique_ptr<PipelineScheduler> PipelineScheduler::make(const Program& micro_step,
                                                           const std::vector<at::Tensor>& inputs,
                                                           const std::vector<at::Tensor>& outputs,
                                                           StageSchedule schedule,
                                                           std::string& why_not) {
  if (schedule == StageSchedule::kProgramOrder) {
    why_not = "the execution strategy runs the step in program order";
    return nullptr;
  }
  std::vector<compiler::PipelineStage> stages =
      compiler::pipelineStages(micro_step.compiledGraph());
  if (stages.empty()) {
    why_not = "the step has fewer than two pipeline stages";
    return nullptr;
  }
  if (micro_step.hasHostEffects()) {
    why_not = "the step has ops with effects on the host, which run in program order";
    return nullptr;
  }
  size_t depth = 1;
  if (schedule == StageSchedule::kPipelined) {
    why_not = carriedValue(micro_step, stages, inputs, outputs);
    if (!why_not.empty()) return nullptr;
    depth = stages.size();
  }
  return std::unique_ptr<PipelineScheduler>(
      new PipelineScheduler(micro_step, std::move(stages), depth, inputs, outputs));
}

PipelineScheduler::PipelineScheduler(const Program& micro_step,
                                     std::vector<compiler::PipelineStage> stages, size_t depth,
                                     const std::vector<at::Tensor>& inputs,
                                     const std::vector<at::Tensor>& outputs)
    : stages_(std::move(stages)), depth_(depth), slots_(depth), done_(stages_.size(), 0) {
  slots_[0].program = &micro_step;
  slots_[0].inputs = inputs;
  slots_[0].outputs = outputs;
  for (size_t d = 1; d < depth_; ++d) {
    ProgramTwin twin = twinWithOwnIo(micro_step, inputs, outputs);
    slots_[d].twin = std::move(twin.program);
    slots_[d].program = slots_[d].twin.get();
    slots_[d].inputs = std::move(twin.inputs);
    slots_[d].outputs = std::move(twin.outputs);
  }
  // A thread per IPU; each runs its stages, the latest ready one first (a
  // backward stage before a forward one frees a micro-batch's activations).
  std::vector<int32_t> ipus;
  for (size_t s = stages_.size(); s-- > 0;) {
    auto it = std::find(ipus.begin(), ipus.end(), stages_[s].ipu);
    if (it == ipus.end()) {
      ipus.push_back(stages_[s].ipu);
      by_thread_.emplace_back();
      it = std::prev(ipus.end());
    }
    by_thread_[static_cast<size_t>(it - ipus.begin())].push_back(s);
  }
  // The host's cores shared between the IPUs that run at once, as the IPU
  // Model gives each IPU a share of the machine.
  const int cores = at::get_num_threads();
  const int kernel_threads =
      depth_ > 1 ? std::max(1, cores / static_cast<int>(ipus.size())) : cores;
  const int64_t session = profiling::currentSession();
  try {
    for (size_t t = 0; t < by_thread_.size(); ++t) {
      threads_.emplace_back(
          [this, t, kernel_threads, session] { loop(t, kernel_threads, session); });
    }
  } catch (...) {
    stopThreads();  // those that started
    throw;
  }
}

PipelineScheduler::~PipelineScheduler() { stopThreads(); }

void PipelineScheduler::stopThreads() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_.notify_all();
  for (std::thread& thread : threads_) {
    if (thread.joinable()) thread.join();
  }
}

void PipelineScheduler::run(int64_t first, int64_t count, uint64_t seed, const MicroBatchIo& io,
                            StepTimeline* timeline) {
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    call_ = Call{first, count, seed, &io, timeline, denormalMode()};
    std::fill(done_.begin(), done_.end(), 0);
    call_start_ns_ = profiling::now();
    ended_.assign(stages_.size(), std::vector<int64_t>(static_cast<size_t>(count), 0));
    free_ns_.assign(threads_.size(), call_start_ns_);
    work_.notify_all();
    // After a failure, the micro-batches before it complete, as they would
    // have one after another; those after it stop where they are.
    finished_.wait(lock,
                   [&] { return active_ == 0 && done_.back() == (error_ ? error_at_ : count); });
    call_.io = nullptr;  // nothing more to run
    error = std::exchange(error_, nullptr);
  }
  // A failure leaves the runs of the micro-batches after it half done.
  for (Slot& slot : slots_) slot.run.reset();
  if (error) std::rethrow_exception(error);
}

int PipelineScheduler::next(size_t thread) const {
  if (call_.io == nullptr) return -1;
  for (size_t s : by_thread_[thread]) {
    const int64_t i = done_[s];
    if (i >= (error_ ? error_at_ : call_.count)) continue;
    // A micro-batch enters once the one that held its slot has left.
    const bool ready = s == 0 ? (i < static_cast<int64_t>(depth_) ||
                                 done_.back() > i - static_cast<int64_t>(depth_))
                              : done_[s - 1] > i;
    if (ready) return static_cast<int>(s);
  }
  return -1;
}

int64_t PipelineScheduler::readyAt(size_t thread, size_t s, int64_t i) const {
  const auto depth = static_cast<int64_t>(depth_);
  int64_t inputs_ready = call_start_ns_;
  if (s > 0) {
    inputs_ready = ended_[s - 1][static_cast<size_t>(i)];
  } else if (i >= depth) {
    inputs_ready = ended_.back()[static_cast<size_t>(i - depth)];  // its slot was freed
  }
  return std::max(inputs_ready, free_ns_[thread]);
}

void PipelineScheduler::loop(size_t thread, int kernel_threads, int64_t session) {
  omp_set_num_threads(kernel_threads);
  const profiling::SessionScope in_session(session, static_cast<int32_t>(thread) + 1);
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    int next_stage = -1;
    work_.wait(lock, [&] { return stopping_ || (next_stage = next(thread)) >= 0; });
    if (next_stage < 0) return;  // stopping
    const auto s = static_cast<size_t>(next_stage);
    const int64_t i = done_[s];
    const int64_t ready_ns = readyAt(thread, s, i);
    ++active_;
    lock.unlock();
    int64_t end_ns = 0;
    std::exception_ptr error = runStage(s, i, ready_ns, end_ns);
    lock.lock();
    --active_;
    free_ns_[thread] = end_ns;
    if (!error) {
      ended_[s][static_cast<size_t>(i)] = end_ns;
      ++done_[s];
    } else if (!error_ || i < error_at_) {
      error_ = std::move(error);
      error_at_ = i;
    }
    work_.notify_all();
    finished_.notify_all();
  }
}

std::exception_ptr PipelineScheduler::runStage(size_t s, int64_t i, int64_t ready_ns,
                                               int64_t& end_ns) {
  // call_ changes only while no stage runs.
  const int64_t k = call_.first + i;
  const compiler::PipelineStage& stage = stages_[s];
  const bool last = s + 1 == stages_.size();
  Slot& slot = slots_[static_cast<size_t>(i) % depth_];
  try {
    if (s == 0) {
      slot.program->checkTemporaryMemory();
      call_.io->load(k, slot.inputs);
      const DenormalModeOfCall of_call(call_.denormal_mode);
      slot.run.emplace(slot.program->stagedRun(call_.seed + static_cast<uint64_t>(k) + 1));
      slot.seconds = 0;
    }
    const int64_t start = profiling::now();
    if (s == 0) slot.start_ns = start;
    const bool ok = slot.run->runNodes(stage.begin, stage.end);
    end_ns = profiling::now();
    slot.seconds += static_cast<double>(end_ns - start) * 1e-9;
    if (StepTimeline* timeline = call_.timeline) {
      if (s == 0) timeline->launch[k] = start;
      if (last) timeline->launch_complete[k] = end_ns;
    }
    if (profiling::enabled()) {
      // The emulated IPU's time: from when it could start the stage (its
      // thread, sharing the host's cores, may have started later) to its end.
      profiling::stageRan(slot.program->executable(), static_cast<int32_t>(s), stage.ipu, k,
                          ready_ns, end_ns);
    }
    if (ok && !last) return nullptr;
    std::exception_ptr error = slot.run->finish();
    slot.run.reset();
    if (error) return error;
    slot.program->countRun(slot.seconds);
    // The micro-batch's whole run, as a program run in profiles (as metrics count it).
    if (profiling::enabled())
      profiling::programRan(slot.program->executable(), slot.start_ns, end_ns);
    call_.io->unload(k, *slot.program, slot.inputs, slot.outputs);
    return nullptr;
  } catch (...) {
    slot.run.reset();
    end_ns = profiling::now();
    return std::current_exception();
  }
}

}  // namespace poptorch::runtime
