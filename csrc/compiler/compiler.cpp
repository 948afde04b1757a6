#include <algorithm>

#include "common/environment.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "compiler/executable.h"
#include "compiler/memory_plan.h"
#include "compiler/out_variants.h"
#include "compiler/pipeline_stages.h"
#include "passes/passes.h"

namespace poptorch::compiler {
namespace {

std::vector<BufferRole> assignRoles(const ir::Graph& program) {
  std::vector<BufferRole> roles(program.buffers.size(), BufferRole::kUnused);
  std::vector<bool> produced(program.buffers.size(), false);
  for (const ir::Node& node : program.nodes) {
    for (const ir::TensorRef& out : node.outputs) produced[out.buffer] = true;
    auto touch = [&](ir::BufferId b) {
      const ir::BufferInfo& info = program.buffers[b];
      if (info.existed_before || info.live_after) {
        roles[b] = BufferRole::kExternal;
      } else if (roles[b] == BufferRole::kUnused) {
        roles[b] = produced[b] ? BufferRole::kProduced : BufferRole::kScratch;
      }
    };
    // Inputs first: a buffer read before any node produced it is scratch.
    for (const ir::TensorRef& in : node.inputs) touch(in.buffer);
    for (ir::BufferId w : node.writes) touch(w);
    for (const ir::TensorRef& out : node.outputs) touch(out.buffer);
  }
  return roles;
}

std::vector<bool> findFlexibleLayouts(const ir::Graph& program,
                                      const std::vector<BufferRole>& roles) {
  std::vector<bool> flexible(program.buffers.size());
  std::vector<const ir::TensorRef*> seen(program.buffers.size(), nullptr);
  for (size_t b = 0; b < flexible.size(); ++b) flexible[b] = roles[b] == BufferRole::kProduced;
  auto visit = [&](const ir::TensorRef& ref) {
    const ir::BufferId b = ref.buffer;
    if (!flexible[b]) return;
    if (seen[b] != nullptr) {
      flexible[b] = ref == *seen[b];
      return;
    }
    seen[b] = &ref;
    flexible[b] = ref.sizes.size() == 4 && ref.coversWhole(program.buffers[b].nbytes);
  };
  for (const ir::Node& node : program.nodes) {
    for (const ir::TensorRef& in : node.inputs) visit(in);
    for (const ir::TensorRef& out : node.outputs) visit(out);
  }
  return flexible;
}

void findGuardedWrites(Executable& exe) {
  const auto& nodes = exe.program.nodes;
  size_t end = 0;  // one past the last guard
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (nodes[i].guard != ir::Guard::kNone) end = i + 1;
  }
  exe.has_guards = end > 0;
  std::vector<bool> seen(exe.program.buffers.size(), false);
  for (size_t i = 0; i < end; ++i) {
    for (ir::BufferId w : nodes[i].writes) {
      if (exe.roles[w] == BufferRole::kExternal && !seen[w]) {
        seen[w] = true;
        exe.guarded_writes.push_back(w);
      }
    }
  }
}

}  // namespace

std::shared_ptr<const Executable> compile(const ir::Graph& graph, uint64_t key) {
  auto exe = std::make_shared<Executable>();
  exe->key = key;
  // Ordered by pipeline stage before memory is planned: a pipeline runs each
  // stage's nodes as one range, and temporaries are planned in that order.
  exe->program = orderByPipelineStage(passes::useOwnKernels(
      passes::useCounterBasedRandomFills(passes::planLayouts(passes::forwardCopies(
          passes::fuseTanhGelu(passes::fuseMatmulActivations(passes::fuseMatmulBias(
              passes::eliminateCommonSubexpressions(passes::eliminateDeadCode(graph))))))))));
  exe->roles = assignRoles(exe->program);
  exe->flexible_layout = findFlexibleLayouts(exe->program, exe->roles);

  findGuardedWrites(*exe);
  planMemory(*exe);
  chooseOutVariants(*exe);
  exe->dependencies = nodeDependencies(*exe);
  POPTORCH_LOG(kDebug) << "compiled graph " << std::hex << key << std::dec << ": "
                       << graph.nodes.size() << " nodes captured, " << exe->program.nodes.size()
                       << " after optimisation";
  POPTORCH_LOG(kTrace) << "optimised program:\n" << exe->program.toString();
  return exe;
}

ExecutableCache& ExecutableCache::get() {
  static ExecutableCache cache;
  return cache;
}

ExecutableCache::ExecutableCache()
    : capacity_(integerFromEnvironment("POPTORCH_EXECUTABLE_CACHE_SIZE", 256, 0)) {}

std::shared_ptr<const Executable> ExecutableCache::find(uint64_t key) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = index_.find(key);
  if (it == index_.end()) return nullptr;
  by_use_.splice(by_use_.begin(), by_use_, it->second);
  return *it->second;
}

void ExecutableCache::insert(std::shared_ptr<const Executable> executable) {
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t key = executable->key;
  auto it = index_.find(key);
  if (it != index_.end()) by_use_.erase(it->second);
  by_use_.push_front(std::move(executable));
  index_[key] = by_use_.begin();
  evictBeyondCapacity();
}

void ExecutableCache::evictBeyondCapacity() {
  while (by_use_.size() > capacity_) {
    POPTORCH_LOG(kDebug) << "executable cache: evicting graph " << std::hex << by_use_.back()->key
                         << std::dec << ", the least recently used of " << by_use_.size();
    index_.erase(by_use_.back()->key);
    by_use_.pop_back();
    Metrics::get().cacheEviction();
  }
}

void ExecutableCache::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  index_.clear();
  by_use_.clear();
}

size_t ExecutableCache::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return by_use_.size();
}

size_t ExecutableCache::capacity() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return capacity_;
}

void ExecutableCache::setCapacity(size_t capacity) {
  std::lock_guard<std::mutex> lock(mutex_);
  capacity_ = capacity;
  evictBeyondCapacity();
}

}  // namespace poptorch::compiler
