// The ops captured since the last sync point, over the ipu storages they touch.
// One per process, like a device queue: any thread may capture, so every
// method expects the caller to hold lock(). A thread that captures a step whole
// (trainingModel/inferenceModel) has a graph of its own meanwhile, so that ops
// of other threads never enter the step.
#pragma once

#include <ATen/core/Tensor.h>
#include <absl/container/flat_hash_map.h>
#include <c10/util/Exception.h>

#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ir/graph.h"
#include "runtime/program.h"

namespace poptorch::capture {

class PendingGraph {
 public:
  // This thread's graph: the step it captures whole, or the process's.
  static PendingGraph& get();

  // This thread captures a step whole until endStepCapture(), which
  // discards what is left of it: the step must not run in pieces, so what the
  // host reads is evaluated and guarded instead (see capture/step_capture.h),
  // and a flush does nothing.
  static void beginStepCapture();
  static void endStepCapture();
  static bool capturingStep();

  std::unique_lock<std::mutex> lock() { return std::unique_lock<std::mutex>(mutex_); }

  // The buffer of `tensor` (an ipu tensor); registers it the first time its
  // storage is seen.
  ir::BufferId bufferOf(const at::Tensor& tensor);
  // Registers the storage of a tensor that a node of this graph creates.
  ir::BufferId addResult(const at::Tensor& tensor);
  bool references(const c10::StorageImpl* storage) const { return ids_.contains(storage); }
  // Records that a registered storage grew (out= arguments, resize_).
  void noteResize(const c10::StorageImpl* storage);

  // Changes the plan of the pending matrix multiplication that made
  // `result`'s buffer (poptorch.serializedMatMul, poptorch.set_available_memory);
  // false when no pending matmul made it.
  bool planMatMul(const at::Tensor& result, const std::function<void(ir::MatMulPlan&)>& change);

  // Appends a node; runs the graph when it grows past POPTORCH_MAX_GRAPH_NODES.
  // A guard node records where the user's code read the value it guards.
  void append(ir::Node&& node);
  // A node of `op` appended to be filled in place, as a node keeps its lists
  // inline and moving it costs a copy of each element: commitNode() completes
  // it as append() does, and dropNode() removes it instead (the call failed,
  // or it records nothing). Nothing else may append meanwhile.
  ir::Node& beginNode(const c10::OperatorHandle& op);
  void commitNode();
  void dropNode();

  // A buffer that no tensor refers to: a temporary of nodes given to
  // appendNodes(), which hold no guard.
  ir::BufferId addTemporary(const ir::BufferInfo& info);
  // Appends `nodes` (over this graph's buffers; replayed, not captured) as
  // one unit: the graph runs when it has grown past POPTORCH_MAX_GRAPH_NODES
  // only after the last of them.
  void appendNodes(std::vector<ir::Node> nodes);
  // Counts the times the pending nodes were taken to run or discarded: nodes
  // appended at the same count are still pending together.
  uint64_t generation() const { return generation_; }

  // Turns the pending nodes into a program (compiled, or found in the cache)
  // bound to their storages, and leaves the pending graph empty. Storages
  // that outlive the graph are materialised. Null if nothing is pending,
  // unless `allow_empty` (a step that only returns its inputs). If that fails,
  // the storages the nodes write are poisoned with the error (device::poison),
  // which is raised.
  std::unique_ptr<runtime::Program> prepare(bool allow_empty = false);

  // The sync point: prepares and runs every pending node, leaving each live
  // ipu storage materialised and up to date, or poisoned with the error that
  // kept it from its value (reading it raises the error). Returns the first
  // error of the graphs run since the previous sync point, for synchronize()
  // to raise; a read raises only the errors of the tensor it reads.
  std::exception_ptr flush();

  // The values `tensors` (ipu tensors) would hold if the pending nodes ran,
  // as CPU tensors, computed without running them: a copy of the graph runs
  // on copies of the buffers it would change, and the graph stays pending.
  std::vector<at::Tensor> evaluate(const std::vector<at::Tensor>& tensors);

  // A step captured whole keeps the warnings its calls gave (the CPU
  // kernels', capture/cpu_checks.h): each call of the model gives them again,
  // as on the CPU, where its run gives none. takeWarnings() hands them over.
  void noteWarning(const c10::Warning& warning) {
    if (whole_step_capture_) warnings_.push_back(warning);
  }
  std::vector<c10::Warning> takeWarnings() { return std::exchange(warnings_, {}); }

  // Forgets every pending node (a capture that failed half-way).
  void discard();

  size_t size() const { return graph_.nodes.size(); }
  std::string toString() const { return graph_.toString(); }

 private:
  explicit PendingGraph(bool whole_step);

  // Strong references keep inputs' bytes alive until the graph runs; weak ones
  // let the graph see which of its own results nobody holds any more; a
  // temporary (addTemporary) has neither.
  struct Entry {
    c10::Storage strong;
    std::optional<c10::weak_intrusive_ptr<c10::StorageImpl>> weak;
  };
  ir::BufferId addBuffer(const at::Tensor& tensor, bool existed_before);

  std::mutex mutex_;
  ir::Graph graph_;
  absl::flat_hash_map<const c10::StorageImpl*, ir::BufferId> ids_;
  std::vector<Entry> entries_;
  // prepare() for a graph run lazily: its error is noted on the device queue
  // and poisons the graph's results.
  std::unique_ptr<runtime::Program> prepareLazily();
  // Streams the first nodes of a long graph to the device queue, so that the
  // device computes while the host captures the rest.
  void streamPendingNodes();

  // Runs the graph if it grew past POPTORCH_MAX_GRAPH_NODES, or streams its
  // first nodes (POPTORCH_STREAM_NODES).
  void runIfLong();

  std::vector<c10::Warning> warnings_;
  uint64_t generation_ = 0;
  size_t max_nodes_;
  size_t stream_nodes_;
  const bool whole_step_capture_;
};

}  // namespace poptorch::capture
