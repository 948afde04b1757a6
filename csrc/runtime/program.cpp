#include "runtime/program.h"

#include <algorithm>
#include <chrono>

#include "common/environment.h"
#include "common/metrics.h"
#include "common/user_errors.h"
#include "compiler/pipeline_stages.h"
#include "device/ipu_device.h"
#include "runtime/executor.h"
#include "runtime/guard_failure.h"

namespace poptorch::runtime {
namespace {

// POPTORCH_INTER_OP: the ranges of `exe` whose independent nodes run on two
// threads (runtime/inter_op.h): 0 none, 1 those where the estimate says it
// pays (compiler/parallel_ranges.h), 2 every segment with independent nodes
// (for tests and measurements). Null for none.
const Ranges* twoThreadRanges(const compiler::Executable& exe) {
  const int64_t mode = integerFromEnvironment("POPTORCH_INTER_OP", 0, 0);
  POPTORCH_CHECK_VALUE(mode <= 2, "POPTORCH_INTER_OP must be 0, 1 or 2, got ", mode);
  const compiler::NodeDependencies& deps = exe.dependencies;
  if (mode == 1 && !deps.parallel_ranges.empty()) return &deps.parallel_ranges;
  if (mode == 2 && deps.parallel()) return &deps.segments;
  return nullptr;
}

}  // namespace

Program::Program(std::shared_ptr<const compiler::Executable> executable, ir::Graph graph,
                 std::vector<c10::Storage> storages)
    : Program(std::move(executable), std::make_shared<const ir::Graph>(std::move(graph)),
              std::move(storages)) {}

Program::Program(std::shared_ptr<const compiler::Executable> executable,
                 std::shared_ptr<const ir::Graph> graph, std::vector<c10::Storage> storages)
    : executable_(std::move(executable)),
      graph_(std::move(graph)),
      storages_(std::move(storages)),
      external_(storages_.size(), nullptr) {
  for (size_t b = 0; b < storages_.size(); ++b) {
    if (storages_[b]) external_[b] = storages_[b].unsafeGetStorageImpl();
  }
  bool split = false;  // over several IPUs
  for (const ir::Node& node : graph_->nodes) {
    host_effects_ = host_effects_ || node.hasHostEffects();
    needs_calling_thread_ = needs_calling_thread_ || (node.seed && node.generator_arg < 0);
    split = split || node.placement.ipu != 0;
  }
  needs_calling_thread_ = needs_calling_thread_ || host_effects_;
  two_thread_ranges_ = needs_calling_thread_ ? nullptr : twoThreadRanges(*executable_);
  if (split) exchanged_bytes_ = compiler::bytesExchangedBetweenIpus(executable_->program);
}

std::unique_ptr<Program> Program::twin(
    const std::vector<std::pair<c10::Storage, c10::Storage>>& replace) const {
  std::vector<c10::Storage> storages = storages_;
  for (c10::Storage& s : storages) {
    for (const auto& [from, to] : replace) {
      if (s && s.is_alias_of(from)) s = to;
    }
  }
  return rebound(std::move(storages));
}

std::unique_ptr<Program> Program::rebound(std::vector<c10::Storage> storages) const {
  return std::unique_ptr<Program>(new Program(executable_, graph_, std::move(storages)));
}

bool Program::writes(const c10::StorageImpl* storage) const {
  for (const ir::Node& node : executable_->program.nodes) {
    for (ir::BufferId w : node.writes) {
      if (external_[w] == storage) return true;
    }
  }
  return false;
}

bool Program::writesOnly(const std::vector<c10::Storage>& reloaded,
                         const std::vector<c10::Storage>& produced) const {
  auto among = [&](ir::BufferId b, const std::vector<c10::Storage>& storages) {
    if (executable_->roles[b] != compiler::BufferRole::kExternal) return true;
    return std::any_of(storages.begin(), storages.end(),
                       [&](const c10::Storage& s) { return storages_[b].is_alias_of(s); });
  };
  for (const ir::Node& node : executable_->program.nodes) {
    for (ir::BufferId w : node.writes) {
      if (!among(w, reloaded)) return false;
    }
    for (const ir::TensorRef& out : node.outputs) {
      if (!among(out.buffer, reloaded) && !among(out.buffer, produced)) return false;
    }
  }
  return true;
}

void Program::run(uint64_t seed_salt) const {
  checkTemporaryMemory();
  if (std::exception_ptr error = execute(seed_salt, OnError::kStop)) {
    std::rethrow_exception(error);
  }
}

std::exception_ptr Program::tryRun(uint64_t seed_salt) const {
  try {
    checkTemporaryMemory();
    return execute(seed_salt, OnError::kPoisonDependents);
  } catch (const GuardFailure&) {
    throw;
  } catch (...) {
    // The run did not start (its temporaries do not fit) or stopped half-way:
    // nothing it writes holds a value.
    std::exception_ptr error = std::current_exception();
    for (const ir::Node& node : executable_->program.nodes) {
      for (ir::BufferId w : node.writes) {
        if (external_[w] != nullptr) device::poison(*external_[w], error);
      }
      for (const ir::TensorRef& out : node.outputs) {
        if (external_[out.buffer] != nullptr) device::poison(*external_[out.buffer], error);
      }
    }
    return error;
  }
}

std::exception_ptr Program::execute(uint64_t seed_salt, OnError on_error) const {
  const auto start = std::chrono::steady_clock::now();
  std::exception_ptr error = executable_->has_guards
                                 ? runGuarded(seed_salt, on_error)
                                 : runtime::execute(*executable_, *graph_, external_, seed_salt,
                                                    on_error, two_thread_ranges_);
  countRun(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return error;
}

void Program::countRun(double seconds) const {
  Metrics::get().executed(seconds);
  if (exchanged_bytes_ != 0) Metrics::get().bytesBetweenIpus(exchanged_bytes_);
}

namespace {

compiler::MatMulMemory matMulMemory(const std::vector<double>& available_memory) {
  return {available_memory, device::memoryCapacity(0)};
}

}  // namespace

std::vector<int64_t> Program::sequentialPeakBytes(
    const std::vector<double>& available_memory) const {
  return compiler::sequentialPeakBytes(*executable_, matMulMemory(available_memory));
}

std::vector<int64_t> Program::pipelinedPeakBytes(
    const std::vector<double>& available_memory) const {
  return compiler::pipelinedPeakBytes(*executable_, matMulMemory(available_memory));
}

std::vector<int64_t> Program::phasedPeakBytes(compiler::Liveness liveness,
                                              const std::vector<double>& available_memory) const {
  std::vector<bool> streamed(external_.size(), false);
  for (size_t b = 0; b < external_.size(); ++b) {
    streamed[b] = external_[b] != nullptr && device::isStreamed(*external_[b]);
  }
  return compiler::phasedPeakBytes(*executable_, streamed, liveness,
                                   matMulMemory(available_memory));
}

int Program::ipuOfFirstUse(const c10::StorageImpl* storage) const {
  auto uses = [&](ir::BufferId b) { return external_[b] == storage; };
  for (const ir::Node& node : executable_->program.nodes) {
    const bool used = std::any_of(node.inputs.begin(), node.inputs.end(),
                                  [&](const ir::TensorRef& in) { return uses(in.buffer); }) ||
                      std::any_of(node.writes.begin(), node.writes.end(), uses) ||
                      std::any_of(node.outputs.begin(), node.outputs.end(),
                                  [&](const ir::TensorRef& out) { return uses(out.buffer); });
    if (used) return node.placement.ipu;
  }
  return -1;
}

void Program::checkTemporaryMemory() const {
  // Temporaries must fit beside what the IPU already holds, as on hardware.
  const auto& peaks = executable_->peak_temporary_bytes;
  for (size_t d = 0; d < peaks.size(); ++d) {
    if (peaks[d] == 0) continue;
    const int index = static_cast<int>(d);
    const int64_t free = device::memoryCapacity(index) - device::memoryAllocated(index);
    TORCH_CHECK_WITH(OutOfMemoryError, peaks[d] <= free, "IPU out of memory: the graph needs ",
                     peaks[d] >> 20, " MiB of temporaries on ipu:", index, " but only ", free >> 20,
                     " MiB are free. Synchronise more often (smaller graphs), "
                     "use a smaller batch, or raise POPTORCH_IPU_MEMORY_MB.");
  }
}

std::exception_ptr Program::runGuarded(uint64_t seed_salt, OnError on_error) const {
  // What the nodes before a guard change in place must be undone if the guard
  // fails: the run then never happened.
  std::vector<std::pair<at::Tensor, at::Tensor>> saved;
  for (ir::BufferId b : executable_->guarded_writes) {
    at::Tensor bytes = hostBytes(*external_[b]);
    saved.emplace_back(bytes, bytes.clone());
  }
  try {
    return runtime::execute(*executable_, *graph_, external_, seed_salt, on_error,
                            /*two_thread_ranges=*/nullptr);
  } catch (GuardFailure& failure) {
    for (auto& [bytes, copy] : saved) bytes.copy_(copy);
    auto site = graph_->guard_sites.find(failure.node);
    if (site != graph_->guard_sites.end()) failure.site = site->second;
    throw;
  }
}

}  // namespace poptorch::runtime
