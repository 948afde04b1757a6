// A compiled graph bound to the ipu storages it reads and writes: what a sync
// point runs once, and what trainingModel/inferenceModel replay for every
// micro-batch without running Python again.
#pragma once

#include <exception>
#include <memory>
#include <vector>

#include "compiler/executable.h"
#include "compiler/strategy_memory.h"
#include "runtime/executor.h"

namespace poptorch::runtime {

class Program {
 public:
  Program(std::shared_ptr<const compiler::Executable> executable, ir::Graph graph,
          std::vector<c10::Storage> storages);

  // The same program on other storages: `replace` maps storages of this
  // program to the ones the twin uses instead (the others are shared).
  std::unique_ptr<Program> twin(
      const std::vector<std::pair<c10::Storage, c10::Storage>>& replace) const;
  // The same program on `storages`, one per buffer as storages() (null for
  // temporaries).
  std::unique_ptr<Program> rebound(std::vector<c10::Storage> storages) const;

  // True if a node writes `storage` (an ipu storage the program is bound to) in place.
  bool writes(const c10::StorageImpl* storage) const;

  // True if every buffer the program writes in place is one of `reloaded`
  // (storages given a new value before each run) and every result it
  // computes goes to one of `reloaded` or `produced` (or a temporary): no
  // value then carries from one run to the next, and twins that own those
  // storages can run at the same time.
  bool writesOnly(const std::vector<c10::Storage>& reloaded,
                  const std::vector<c10::Storage>& produced) const;

  // Runs the program once. A non-zero `seed_salt` gives its random ops fresh
  // seeds (every replay of a training step draws new dropout masks). A node
  // that fails raises its error, as on the CPU: the nodes after it do not run,
  // and what it wrote is poisoned (reading it raises the error).
  void run(uint64_t seed_salt = 0) const;
  // Runs a lazy graph once. A node that fails poisons what it and the nodes
  // depending on it would write, and the others run: errors surface where a
  // tensor computed from them is read, never at an unrelated op. Returns the
  // first error (null if none) instead of raising it; only a GuardFailure is
  // raised.
  [[nodiscard]] std::exception_ptr tryRun(uint64_t seed_salt = 0) const;

  // One run made in parts, the stages of a pipeline (see StagedRun); the
  // caller counts it (countRun).
  StagedRun stagedRun(uint64_t seed_salt) const {
    return StagedRun(*executable_, *graph_, external_, seed_salt);
  }
  // Counts a run that took `seconds` in poptorch.metrics() (with the bytes
  // it moved between IPUs).
  void countRun(double seconds) const;
  // Raises OutOfMemoryError when the temporaries of a run do not fit beside
  // what each IPU holds.
  void checkTemporaryMemory() const;

  size_t numNodes() const { return executable_->program.nodes.size(); }
  const compiler::Executable& executable() const { return *executable_; }
  // The optimised program this runs.
  const ir::Graph& compiledGraph() const { return executable_->program; }
  // Modelled peak of temporary memory, per IPU.
  const std::vector<int64_t>& peakTemporaryBytes() const {
    return executable_->peak_temporary_bytes;
  }
  // Modelled peak of temporary memory per IPU (with matmuls' working memory,
  // bounded by `available_memory` per IPU, see compiler::MatMulMemory) of a
  // run one micro-batch at a time, and of a pipelined run.
  std::vector<int64_t> sequentialPeakBytes(const std::vector<double>& available_memory) const;
  std::vector<int64_t> pipelinedPeakBytes(const std::vector<double>& available_memory) const;
  // Modelled peak per IPU of a phased run (compiler::phasedPeakBytes): the
  // storages accounted in streaming memory are brought in per phase.
  std::vector<int64_t> phasedPeakBytes(compiler::Liveness liveness,
                                       const std::vector<double>& available_memory) const;
  // The IPU of the first node that uses `storage` (in a model split over IPUs,
  // the IPU of that node's block), or -1 when no node uses it.
  int ipuOfFirstUse(const c10::StorageImpl* storage) const;
  // True when the program is specialised on values read while capturing: a
  // run may then throw GuardFailure, having changed nothing.
  bool hasGuards() const { return executable_->has_guards; }
  const std::vector<c10::Storage>& storages() const { return storages_; }
  // The graph as captured (its buffers, and its nodes' runtime arguments).
  const ir::Graph& graph() const { return *graph_; }
  // True when the program must run on the calling thread, one run at a time:
  // a random op in it draws from the default generator, whose state the
  // runtime swaps while it runs (and the capturing thread draws seeds from),
  // or a node has host effects (ir::Node::hasHostEffects), which must happen
  // in order and may call Python (the caller may hold the GIL while it waits
  // for the worker).
  bool needsCallingThread() const { return needs_calling_thread_; }
  // True when a node has host effects (see needsCallingThread).
  bool hasHostEffects() const { return host_effects_; }

 private:
  Program(std::shared_ptr<const compiler::Executable> executable,
          std::shared_ptr<const ir::Graph> graph, std::vector<c10::Storage> storages);

  std::exception_ptr execute(uint64_t seed_salt, OnError on_error) const;
  std::exception_ptr runGuarded(uint64_t seed_salt, OnError on_error) const;

  std::shared_ptr<const compiler::Executable> executable_;
  std::shared_ptr<const ir::Graph> graph_;   // as captured: runtime arguments come from here
  std::vector<c10::Storage> storages_;       // keeps external buffers alive
  std::vector<c10::StorageImpl*> external_;  // per buffer, null unless external
  bool needs_calling_thread_ = false;
  bool host_effects_ = false;
  // Ranges whose independent nodes may run at the same time (see execute()),
  // or null.
  const Ranges* two_thread_ranges_ = nullptr;
  // Bytes a run moves between IPUs (compiler::bytesExchangedBetweenIpus).
  int64_t exchanged_bytes_ = 0;
};

}  // namespace poptorch::runtime
