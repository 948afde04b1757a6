#include "capture/pending_graph.h"

#include <algorithm>
#include <cstring>

#include "capture/device_queue.h"
#include "capture/step_capture.h"
#include "common/environment.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/source_location.h"
#include "compiler/executable_lookup.h"
#include "device/ipu_device.h"
#include "device/ipu_tensor.h"
#include "passes/passes.h"
#include "runtime/executor.h"
#include "runtime/worker.h"

namespace poptorch::capture {
namespace {

// A materialised ipu storage of `nbytes` on `device`, with a copy of `from`'s
// bytes if given.
c10::Storage scratchStorage(int64_t nbytes, c10::Device device, const c10::Storage* from) {
  at::Tensor bytes = device::emptyIpuTensor({nbytes}, {1}, c10::ScalarType::Byte, device.index());
  c10::StorageImpl& storage = *bytes.storage().unsafeGetStorageImpl();
  device::materialize(storage);
  if (from != nullptr && nbytes > 0) {
    std::memcpy(storage.mutable_data(), from->data(), static_cast<size_t>(nbytes));
  }
  return bytes.storage();
}

// The items of `kept`, in order (items are per buffer; see dropUnusedBuffers).
template <typename T>
std::vector<T> keptItems(std::vector<T>&& items, const std::vector<ir::BufferId>& kept) {
  std::vector<T> result;
  result.reserve(kept.size());
  for (ir::BufferId b : kept) result.push_back(std::move(items[b]));
  return result;
}

// Numbers the nodes of `graph` in order again (Node::source_index, by which the
// runtime finds a node's arguments and errors name it) after some were dropped.
void renumberNodes(ir::Graph& graph) {
  absl::flat_hash_map<int32_t, std::string> sites;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    ir::Node& node = graph.nodes[i];
    auto site = graph.guard_sites.find(node.source_index);
    if (site != graph.guard_sites.end()) sites.emplace(i, std::move(site->second));
    node.source_index = static_cast<int32_t>(i);
  }
  graph.guard_sites = std::move(sites);
}

// The step this thread captures whole, if any.
thread_local std::unique_ptr<PendingGraph> step_graph;

}  // namespace

PendingGraph& PendingGraph::get() {
  if (step_graph) return *step_graph;
  static PendingGraph pending(/*whole_step=*/false);
  return pending;
}

void PendingGraph::beginStepCapture() {
  TORCH_CHECK(!step_graph, "a step is already being captured on this thread");
  step_graph.reset(new PendingGraph(/*whole_step=*/true));
}

void PendingGraph::endStepCapture() { step_graph.reset(); }

bool PendingGraph::capturingStep() { return step_graph != nullptr; }

PendingGraph::PendingGraph(bool whole_step)
    : max_nodes_(integerFromEnvironment("POPTORCH_MAX_GRAPH_NODES", 20000, 1)),
      stream_nodes_(integerFromEnvironment("POPTORCH_STREAM_NODES", 0, 0)),
      whole_step_capture_(whole_step) {}

ir::BufferId PendingGraph::addBuffer(const at::Tensor& tensor, bool existed_before) {
  c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
  ir::BufferInfo info;
  info.nbytes = static_cast<int64_t>(storage->nbytes());
  info.device = tensor.device();
  info.existed_before = existed_before;
  const ir::BufferId id = graph_.addBuffer(info);
  Entry entry;
  if (existed_before) {
    entry.strong = tensor.storage();
  } else {
    entry.weak = tensor.storage().getWeakStorageImpl();
  }
  entries_.push_back(std::move(entry));
  ids_.emplace(storage, id);
  return id;
}

ir::BufferId PendingGraph::bufferOf(const at::Tensor& tensor) {
  const c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
  auto it = ids_.find(storage);
  // A storage with no bytes yet (an uninitialised factory result) holds no
  // value the graph depends on.
  return it != ids_.end() ? it->second : addBuffer(tensor, device::isMaterialized(*storage));
}

ir::BufferId PendingGraph::addResult(const at::Tensor& tensor) {
  return addBuffer(tensor, /*existed_before=*/false);
}

bool PendingGraph::planMatMul(const at::Tensor& result,
                              const std::function<void(ir::MatMulPlan&)>& change) {
  auto it = ids_.find(result.storage().unsafeGetStorageImpl());
  if (it == ids_.end()) return false;
  for (auto node = graph_.nodes.rbegin(); node != graph_.nodes.rend(); ++node) {
    const bool made =
        std::any_of(node->outputs.begin(), node->outputs.end(),
                    [&](const ir::TensorRef& out) { return out.buffer == it->second; });
    if (!made) continue;
    if (!node->isMatMul()) return false;
    change(node->matmul);
    return true;
  }
  return false;
}

void PendingGraph::noteResize(const c10::StorageImpl* storage) {
  auto it = ids_.find(storage);
  if (it != ids_.end()) graph_.buffers[it->second].nbytes = static_cast<int64_t>(storage->nbytes());
}

void PendingGraph::append(ir::Node&& node) {
  graph_.nodes.push_back(std::move(node));
  commitNode();
}

ir::Node& PendingGraph::beginNode(const c10::OperatorHandle& op) {
  return graph_.nodes.emplace_back(op);
}

void PendingGraph::commitNode() {
  ir::Node& node = graph_.nodes.back();
  node.source_index = static_cast<int32_t>(graph_.nodes.size() - 1);
  if (node.guard != ir::Guard::kNone) {
    graph_.guard_sites.emplace(node.source_index, userSourceLocation());
  }
  Metrics::get().opCaptured();
  runIfLong();
}

void PendingGraph::dropNode() { graph_.nodes.pop_back(); }

ir::BufferId PendingGraph::addTemporary(const ir::BufferInfo& info) {
  entries_.emplace_back();
  return graph_.addBuffer(info);
}

void PendingGraph::appendNodes(std::vector<ir::Node> nodes) {
  graph_.nodes.reserve(graph_.nodes.size() + nodes.size());
  for (ir::Node& node : nodes) {
    TORCH_INTERNAL_ASSERT(node.guard == ir::Guard::kNone, "appended nodes hold no guard");
    node.source_index = static_cast<int32_t>(graph_.nodes.size());
    graph_.nodes.push_back(std::move(node));
  }
  runIfLong();
}

void PendingGraph::runIfLong() {
  if (whole_step_capture_) return;
  if (graph_.nodes.size() >= max_nodes_) {
    POPTORCH_LOG(kDebug) << "running the pending graph: it reached " << max_nodes_ << " nodes";
    flush();
  } else if (stream_nodes_ > 0 && graph_.nodes.size() >= stream_nodes_) {
    streamPendingNodes();
  }
}

std::unique_ptr<runtime::Program> PendingGraph::prepareLazily() {
  try {
    return prepare();
  } catch (const std::exception&) {
    runtime::Worker::get().noteError(std::current_exception());  // and its results are poisoned
    return nullptr;
  }
}

void PendingGraph::streamPendingNodes() {
  std::unique_ptr<runtime::Program> program = prepareLazily();
  if (!program) return;
  if (!program->needsCallingThread()) {
    runtime::Worker::get().submit(std::move(program));
    return;
  }
  runtime::Worker::get().waitIdle();
  if (std::exception_ptr error = program->tryRun()) runtime::Worker::get().noteError(error);
}

void PendingGraph::discard() {
  ++generation_;
  graph_ = ir::Graph();
  entries_.clear();
  ids_.clear();
}

std::unique_ptr<runtime::Program> PendingGraph::prepare(bool allow_empty) {
  // Take the state first, so that an error below leaves an empty graph behind.
  ir::Graph graph = std::move(graph_);
  std::vector<Entry> entries = std::move(entries_);
  discard();
  // The next graph is likely this one again (a training loop's step): room
  // for as many nodes, so that none moves as it grows (see beginNode), and
  // for as many buffers, so that their lists and index never grow meanwhile.
  graph_.nodes.reserve(graph.nodes.size());
  graph_.buffers.reserve(graph.buffers.size());
  entries_.reserve(entries.size());
  ids_.reserve(entries.size());
  if (graph.nodes.empty() && !allow_empty) return nullptr;

  try {
    std::vector<c10::Storage> storages(entries.size());
    for (size_t b = 0; b < entries.size(); ++b) {
      Entry& entry = entries[b];
      ir::BufferInfo& info = graph.buffers[b];
      c10::Storage storage;
      if (entry.strong) {
        info.live_after = runtime::Worker::get().referencedElsewhere(entry.strong, /*ours=*/1);
        storage = entry.strong;
      } else if (auto locked =
                     entry.weak ? entry.weak->lock() : c10::intrusive_ptr<c10::StorageImpl>()) {
        info.live_after = true;
        storage = c10::Storage(std::move(locked));
      }
      if (info.existed_before || info.live_after) {
        device::materialize(*storage.unsafeGetStorageImpl());
        info.nbytes = static_cast<int64_t>(storage.nbytes());
        storages[b] = std::move(storage);
      }
    }
    if (!whole_step_capture_) {
      // Nodes whose results nobody holds (a temporary of a statement that
      // raised, a result dropped unused) go before the lookup: the structure
      // must not depend on such leftovers of other code, or a replay of the
      // same ops misses the executable cache.
      graph = passes::eliminateDeadCode(std::move(graph));
      renumberNodes(graph);
      const std::vector<ir::BufferId> kept = graph.dropUnusedBuffers();
      entries = keptItems(std::move(entries), kept);
      storages = keptItems(std::move(storages), kept);
      if (graph.nodes.empty() && !allow_empty) return nullptr;
    }
    std::shared_ptr<const compiler::Executable> exe = compiler::executableFor(graph);
    return std::make_unique<runtime::Program>(std::move(exe), std::move(graph),
                                              std::move(storages));
  } catch (...) {
    // The graph will not run: what its nodes compute holds no value.
    const std::exception_ptr error = std::current_exception();
    auto poison = [&](ir::BufferId b) {
      const Entry& entry = entries[b];
      if (entry.strong) {
        device::poison(*entry.strong.unsafeGetStorageImpl(), error);
      } else if (auto locked =
                     entry.weak ? entry.weak->lock() : c10::intrusive_ptr<c10::StorageImpl>()) {
        device::poison(*locked, error);
      }
    };
    for (const ir::Node& node : graph.nodes) {
      for (ir::BufferId w : node.writes) poison(w);
      for (const ir::TensorRef& out : node.outputs) poison(out.buffer);
    }
    throw;
  }
}

std::vector<at::Tensor> PendingGraph::evaluate(const std::vector<at::Tensor>& tensors) {
  ir::Graph graph = graph_;
  std::vector<bool> changed(graph.buffers.size(), false);
  for (const ir::Node& node : graph.nodes) {
    for (ir::BufferId w : node.writes) changed[w] = true;
    for (const ir::TensorRef& out : node.outputs) changed[out.buffer] = true;
  }
  // Only the wanted buffers that pending nodes change need a run; the others
  // hold their value already.
  std::vector<ir::BufferId> wanted(tensors.size(), -1);
  bool run = false;
  for (size_t i = 0; i < tensors.size(); ++i) {
    auto it = ids_.find(tensors[i].storage().unsafeGetStorageImpl());
    if (it == ids_.end() || !changed[it->second]) continue;
    wanted[i] = it->second;
    graph.buffers[it->second].live_after = true;
    run = true;
  }
  std::vector<c10::Storage> storages(entries_.size());
  if (run) {
    for (size_t b = 0; b < entries_.size(); ++b) {
      ir::BufferInfo& info = graph.buffers[b];
      const c10::Storage& before = entries_[b].strong;
      if (before && !changed[b]) {
        storages[b] = before;  // read only
      } else if (before || info.live_after) {
        storages[b] = scratchStorage(info.nbytes, info.device, before ? &before : nullptr);
      }
    }
    std::shared_ptr<const compiler::Executable> exe = compiler::executableFor(graph);
    const HostReadEvaluation evaluation;
    runtime::Program(std::move(exe), std::move(graph), storages).run();
  }
  std::vector<at::Tensor> values;
  values.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    c10::Storage storage = wanted[i] >= 0 ? storages[wanted[i]] : t.storage();
    device::materialize(*storage.unsafeGetStorageImpl());
    at::Tensor view =
        device::ipuView(storage, t.sizes(), t.strides(), t.storage_offset(), t.scalar_type());
    values.push_back(runtime::hostAlias(view).clone(at::MemoryFormat::Contiguous));
  }
  return values;
}

std::exception_ptr PendingGraph::flush() {
  if (whole_step_capture_) {
    POPTORCH_LOG(kDebug) << "synchronize() while a step is captured whole: nothing runs";
    return nullptr;
  }
  std::unique_ptr<runtime::Program> program = prepareLazily();
  // Earlier chunks first; the last one runs here, without a hand-off.
  runtime::Worker& worker = runtime::Worker::get();
  worker.waitIdle();
  if (program) {
    if (std::exception_ptr error = program->tryRun()) worker.noteError(std::move(error));
  }
  return worker.takeFirstError();
}

void runPendingWork() {
  auto lock = PendingGraph::get().lock();
  if (std::exception_ptr error = PendingGraph::get().flush()) {
    runtime::Worker::get().noteError(std::move(error));
  }
}

bool queueIsIdle() {
  auto lock = PendingGraph::get().lock();
  return PendingGraph::get().size() == 0 && runtime::Worker::get().idle();
}

}  // namespace poptorch::capture
