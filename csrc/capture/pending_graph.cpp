#include "capture/pending_graph.h"

#include <algorithm>
#include <chrono>

#include "common/environment.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "compiler/executable.h"
#include "device/ipu_device.h"
#include "ir/hash.h"
#include "runtime/worker.h"

namespace poptorch::capture {
namespace {

double secondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

constexpr const char* kHostValueDuringCapture =
    "the model needs a value on the host while it is being compiled (.item(), .tolist(), "
    "printing, .cpu(), or an op whose output shape depends on the data, such as nonzero or "
    "boolean-mask indexing). PopTorch compiles the step into a static graph: move that "
    "computation out of the model, or make it shape-static (e.g. torch.where instead of "
    "masking).";

}  // namespace

PendingGraph& PendingGraph::get() {
  static PendingGraph pending;
  return pending;
}

PendingGraph::PendingGraph()
    : max_nodes_(integerFromEnvironment("POPTORCH_MAX_GRAPH_NODES", 20000, 1)),
      stream_nodes_(integerFromEnvironment("POPTORCH_STREAM_NODES", 0, 0)) {}

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

ir::TensorRef PendingGraph::refOf(const at::Tensor& tensor) {
  const c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
  auto it = ids_.find(storage);
  // A storage with no bytes yet (an uninitialised factory result) holds no
  // value the graph depends on.
  const ir::BufferId id =
      it != ids_.end() ? it->second : addBuffer(tensor, device::isMaterialized(*storage));
  return ir::TensorRef::of(tensor, id);
}

ir::TensorRef PendingGraph::refOfResult(const at::Tensor& tensor) {
  return ir::TensorRef::of(tensor, addBuffer(tensor, /*existed_before=*/false));
}

void PendingGraph::noteResize(const c10::StorageImpl* storage) {
  auto it = ids_.find(storage);
  if (it != ids_.end()) graph_.buffers[it->second].nbytes = static_cast<int64_t>(storage->nbytes());
}

void PendingGraph::append(ir::Node node) {
  node.source_index = static_cast<int32_t>(graph_.nodes.size());
  graph_.nodes.push_back(std::move(node));
  Metrics::get().opCaptured();
  if (whole_step_capture_) return;
  if (graph_.nodes.size() >= max_nodes_) {
    POPTORCH_LOG(kDebug) << "running the pending graph: it reached " << max_nodes_ << " nodes";
    flush();
  } else if (stream_nodes_ > 0 && graph_.nodes.size() >= stream_nodes_) {
    streamPendingNodes();
  }
}

void PendingGraph::streamPendingNodes() {
  std::unique_ptr<runtime::Program> program = prepare();
  if (!program->usesDefaultGenerator()) {
    runtime::Worker::get().submit(std::move(program));
    return;
  }
  runtime::Worker::get().waitIdle();
  program->run();
}

void PendingGraph::discard() {
  graph_ = ir::Graph();
  entries_.clear();
  ids_.clear();
}

std::unique_ptr<runtime::Program> PendingGraph::prepare() {
  // Take the state first, so that an error below leaves an empty graph behind.
  ir::Graph graph = std::move(graph_);
  std::vector<Entry> entries = std::move(entries_);
  discard();
  if (graph.nodes.empty()) return nullptr;

  std::vector<c10::Storage> storages(entries.size());
  for (size_t b = 0; b < entries.size(); ++b) {
    Entry& entry = entries[b];
    ir::BufferInfo& info = graph.buffers[b];
    c10::Storage storage;
    if (entry.strong) {
      info.live_after = runtime::Worker::get().referencedElsewhere(entry.strong, /*ours=*/1);
      storage = std::move(entry.strong);
    } else if (auto locked = entry.weak->lock()) {
      info.live_after = true;
      storage = c10::Storage(std::move(locked));
    }
    if (info.existed_before || info.live_after) {
      device::materialize(*storage.unsafeGetStorageImpl());
      info.nbytes = static_cast<int64_t>(storage.nbytes());
      storages[b] = std::move(storage);
    }
  }

  const uint64_t key = ir::structuralHash(graph);
  auto& cache = compiler::ExecutableCache::get();
  std::shared_ptr<const compiler::Executable> exe = cache.find(key);
  if (exe) {
    Metrics::get().cacheHit();
  } else {
    const auto start = std::chrono::steady_clock::now();
    POPTORCH_LOG(kDebug) << "compiling a graph of " << graph.nodes.size()
                         << " nodes: no executable with its structure is cached";
    exe = compiler::compile(graph, key);
    cache.insert(exe);
    Metrics::get().graphCompiled(secondsSince(start));
  }
  return std::make_unique<runtime::Program>(std::move(exe), std::move(graph), std::move(storages));
}

void PendingGraph::flush() {
  if (whole_step_capture_ && !graph_.nodes.empty()) {
    discard();  // the capture is abandoned
    TORCH_CHECK(false, kHostValueDuringCapture);
  }
  std::unique_ptr<runtime::Program> program = prepare();
  // Earlier chunks first; the last one runs here, without a hand-off.
  runtime::Worker::get().waitIdle();
  if (program) program->run();
}

}  // namespace poptorch::capture
