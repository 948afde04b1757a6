// Runs the micro-batches of a call through the pipeline stages of a model
// split over IPUs (compiler::pipelineStages), each IPU on a thread of its
// own, as the seeds' "Pipelined execution" describes: the pipeline fills,
// stage k of micro-batch i runs while stage k+1 runs micro-batch i-1, and it
// drains. Every pipeline stage runs its micro-batches in order on its IPU's
// thread, so what a stage accumulates (gradients, running statistics) adds up
// in the order one IPU would: the values are those of the program run
// micro-batch after micro-batch.
#pragma once

#include <ATen/core/Tensor.h>

#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "compiler/pipeline_stages.h"
#include "runtime/program.h"
#include "runtime/program_twin.h"

namespace poptorch::runtime {

struct StepTimeline;

// How the stages of a model split over IPUs run (Options.setExecutionStrategy).
enum class StageSchedule : int {
  kProgramOrder = 0,  // the whole program on the calling thread (phased execution)
  kOneAtATime = 1,    // each stage on its IPU's thread, one IPU at a time (sharded)
  kPipelined = 2,     // stages of successive micro-batches at once (pipelined)
};

// What the caller does around each micro-batch k, on the IPU threads: `load`
// fills the device inputs with its rows before its first stage; `unload`
// takes its outputs (and the input rows the step changed) after its last.
struct MicroBatchIo {
  std::function<void(int64_t k, const std::vector<at::Tensor>& inputs)> load;
  std::function<void(int64_t k, const Program& ran, const std::vector<at::Tensor>& inputs,
                     const std::vector<at::Tensor>& outputs)>
      unload;
};

class PipelineScheduler {
 public:
  // Null when `micro_step` does not run as stages under `schedule`, with the
  // reason in `why_not`: fewer than two stages, nodes with host effects, or
  // (pipelined) a value that carries from one micro-batch to the next across
  // stages (a buffer one stage writes and another reads), or an output that
  // is not computed afresh by every micro-batch. `inputs`/`outputs` are the
  // micro-step's device inputs and outputs.
  static std::unique_ptr<PipelineScheduler> make(const Program& micro_step,
                                                 const std::vector<at::Tensor>& inputs,
                                                 const std::vector<at::Tensor>& outputs,
                                                 StageSchedule schedule, std::string& why_not);
  ~PipelineScheduler();  // stops and joins the IPU threads
  PipelineScheduler(const PipelineScheduler&) = delete;
  PipelineScheduler& operator=(const PipelineScheduler&) = delete;

  // Runs micro-batches [first, first + count) (micro-batch k with the seed
  // salt seed + k + 1) and returns when they have all run. A stage that fails
  // stops the micro-batches after its own (they may have run some of their
  // stages); those before it complete, as they would one after another, and
  // the error of the earliest micro-batch that failed is raised.
  void run(int64_t first, int64_t count, uint64_t seed, const MicroBatchIo& io,
           StepTimeline* timeline);

 private:
  // The device inputs and outputs of one micro-batch in flight, and its run.
  struct Slot {
    const Program* program = nullptr;
    std::unique_ptr<Program> twin;  // owns `program`, but for the first slot
    std::vector<at::Tensor> inputs;
    std::vector<at::Tensor> outputs;
    std::optional<StagedRun> run;
    double seconds = 0;    // the run's time so far
    int64_t start_ns = 0;  // when its first stage started
  };
  // The current call of run().
  struct Call {
    int64_t first = 0;
    int64_t count = 0;
    uint64_t seed = 0;
    const MicroBatchIo* io = nullptr;
    StepTimeline* timeline = nullptr;
    uint32_t denormal_mode = 0;  // of the calling thread (common/denormal_mode.h)
  };

  PipelineScheduler(const Program& micro_step, std::vector<compiler::PipelineStage> stages,
                    size_t depth, const std::vector<at::Tensor>& inputs,
                    const std::vector<at::Tensor>& outputs);
  void stopThreads();
  void loop(size_t thread, int kernel_threads, int64_t session);
  // The pipeline stage `thread` may run next (the latest that is ready), or -1.
  int next(size_t thread) const;
  // When the IPU of `thread` could start stage s of the call's i-th
  // micro-batch: once the IPU was free and the stage's inputs were ready.
  int64_t readyAt(size_t thread, size_t s, int64_t i) const;
  // Runs stage s of the call's i-th micro-batch, which its IPU could start
  // at `ready_ns`; sets `end_ns` when it returns; returns its error.
  std::exception_ptr runStage(size_t s, int64_t i, int64_t ready_ns, int64_t& end_ns);

  std::vector<compiler::PipelineStage> stages_;
  size_t depth_;                                // micro-batches in flight at most
  std::vector<Slot> slots_;                     // depth_ of them, micro-batch i in i % depth_
  std::vector<std::vector<size_t>> by_thread_;  // the stages each IPU thread runs, latest first

  std::mutex mutex_;
  std::condition_variable work_;      // a stage may be ready
  std::condition_variable finished_;  // a stage returned
  Call call_;
  std::vector<int64_t> done_;  // per stage: micro-batches of the call it ran
  int64_t call_start_ns_ = 0;
  std::vector<std::vector<int64_t>> ended_;  // [stage][micro-batch of the call]: when it ended
  std::vector<int64_t> free_ns_;             // per thread: when its last stage ended
  std::vector<bool> running_;                // per stage
  size_t active_ = 0;                        // stages running
  std::exception_ptr error_;                 // of the earliest micro-batch that failed
  int64_t error_at_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> threads_;  // last: started once the rest exists
};

}  // namespace poptorch::runtime
