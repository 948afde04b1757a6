#include "profiling/profiler.h"

#include <absl/container/flat_hash_map.h>

#include <chrono>
#include <cstdio>
#include <mutex>
#include <utility>

#include "compiler/executable.h"
#include "compiler/memory_plan.h"
#include "device/ipu_device.h"
#include "ir/graph.h"

namespace poptorch::profiling {
namespace detail {
std::atomic<bool> enabled{false};
}  // namespace detail

namespace {

// Events, the executables they ran and the scope names, shared by every thread.
struct Store {
  std::mutex mutex;
  std::vector<Event> events;
  int64_t dropped = 0;
  absl::flat_hash_map<uint64_t, ProgramInfo> programs;
  std::vector<std::string> scopes;
  absl::flat_hash_map<std::string, int32_t> scope_ids;
};

Store& store() {
  static Store* instance = new Store();  // outlives threads that record at exit
  return *instance;
}

thread_local int64_t session = 0;
thread_local int32_t track = 0;
thread_local std::vector<int32_t> scope_stack;

// The IPU a node runs on: its block's in a model split over IPUs, else where
// its results (else its inputs) live.
int32_t ipuOf(const compiler::Executable& exe, const ir::Node& node) {
  if (!(node.placement == ir::Placement{})) return node.placement.ipu;
  const ir::TensorRef* ref = !node.outputs.empty()  ? &node.outputs[0]
                             : !node.inputs.empty() ? &node.inputs[0]
                                                    : nullptr;
  if (ref == nullptr) return 0;
  return exe.program.buffers[ref->buffer].device.index();
}

ProgramInfo infoOf(const compiler::Executable& exe) {
  ProgramInfo info;
  info.key = exe.key;
  for (const ir::Node& node : exe.program.nodes) info.node_names.push_back(node.name());
  info.temporary_bytes = compiler::temporaryBytesByNode(exe);
  info.peak_temporary_bytes = exe.peak_temporary_bytes;
  return info;
}

// An event about a whole executable, named `what` and its key (in hex, as the
// reports print keys).
Event programEvent(Kind kind, const char* what, const compiler::Executable& exe, int64_t start_ns,
                   int64_t end_ns) {
  Event event;
  event.kind = kind;
  char key[17];
  std::snprintf(key, sizeof(key), "%016llx", static_cast<unsigned long long>(exe.key));
  event.name = what + std::string(key);
  event.start_ns = start_ns;
  event.end_ns = end_ns;
  event.program = exe.key;
  return event;
}

// Keeps how `exe` uses memory, the first time it runs.
void noteProgram(const compiler::Executable& exe) {
  Store& s = store();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!s.programs.contains(exe.key)) s.programs.emplace(exe.key, infoOf(exe));
}

}  // namespace

void setEnabled(bool on) { detail::enabled.store(on, std::memory_order_relaxed); }

int64_t now() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void record(Event event) {
  event.session = session;
  event.track = track;
  Store& s = store();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.events.size() >= kMaxEvents) {
    ++s.dropped;
    return;
  }
  s.events.push_back(std::move(event));
}

std::vector<Event> take() {
  Store& s = store();
  std::lock_guard<std::mutex> lock(s.mutex);
  return std::exchange(s.events, {});
}

int64_t dropped() {
  Store& s = store();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.dropped;
}

std::vector<ProgramInfo> programs() {
  Store& s = store();
  std::lock_guard<std::mutex> lock(s.mutex);
  std::vector<ProgramInfo> result;
  result.reserve(s.programs.size());
  for (const auto& [key, info] : s.programs) result.push_back(info);
  return result;
}

void compiled(const compiler::Executable& exe, int64_t start_ns, int64_t end_ns) {
  Event event = programEvent(Kind::kCompile, "compile ", exe, start_ns, end_ns);
  event.bytes = static_cast<int64_t>(exe.program.nodes.size());
  record(std::move(event));
}

void programRan(const compiler::Executable& exe, int64_t start_ns, int64_t end_ns) {
  noteProgram(exe);
  Event event = programEvent(Kind::kProgram, "program ", exe, start_ns, end_ns);
  event.bytes = exe.arena_bytes;
  for (int d = 0; d < device::deviceCount(); ++d) {
    event.ipu_bytes.push_back(device::memoryAllocated(d));
  }
  record(std::move(event));
}

void nodeRan(const compiler::Executable& exe, size_t index, const ir::Node& captured,
             int64_t start_ns, int64_t end_ns) {
  const ir::Node& node = exe.program.nodes[index];
  Event event;
  event.kind = Kind::kNode;
  event.name = captured.scope >= 0 ? scopeName(captured.scope) + "/" + node.name() : node.name();
  event.ipu = ipuOf(exe, node);
  event.start_ns = start_ns;
  event.end_ns = end_ns;
  event.program = exe.key;
  event.node = static_cast<int32_t>(index);
  record(std::move(event));
}

void stageRan(const compiler::Executable& exe, int32_t stage, int32_t ipu, int64_t micro_batch,
              int64_t start_ns, int64_t end_ns) {
  noteProgram(exe);
  Event event;
  event.kind = Kind::kStage;
  event.name = "stage " + std::to_string(stage) + ", micro-batch " + std::to_string(micro_batch);
  event.ipu = ipu;
  event.start_ns = start_ns;
  event.end_ns = end_ns;
  event.program = exe.key;
  event.node = stage;
  event.micro_batch = micro_batch;
  record(std::move(event));
}

TransferSpan::TransferSpan(Kind kind, int64_t bytes, int32_t ipu)
    : kind_(kind), bytes_(bytes), ipu_(ipu), start_ns_(enabled() ? now() : 0) {}

TransferSpan::~TransferSpan() {
  if (start_ns_ == 0 || !enabled()) return;
  Event event;
  event.kind = kind_;
  event.name = kind_ == Kind::kToIpu ? "host to ipu" : "ipu to host";
  event.ipu = ipu_;
  event.start_ns = start_ns_;
  event.end_ns = now();
  event.bytes = bytes_;
  record(std::move(event));
}

int64_t setSession(int64_t id) { return std::exchange(session, id); }

int64_t currentSession() { return session; }

SessionScope::SessionScope(int64_t id, int32_t lane)
    : outer_session_(setSession(id)), outer_track_(std::exchange(track, lane)) {}

SessionScope::~SessionScope() {
  setSession(outer_session_);
  track = outer_track_;
}

void pushScope(const std::string& name) {
  const std::string full = scope_stack.empty() ? name : scopeName(scope_stack.back()) + "/" + name;
  Store& s = store();
  std::lock_guard<std::mutex> lock(s.mutex);
  auto [it, added] = s.scope_ids.try_emplace(full, static_cast<int32_t>(s.scopes.size()));
  if (added) s.scopes.push_back(full);
  scope_stack.push_back(it->second);
}

void popScope() {
  if (!scope_stack.empty()) scope_stack.pop_back();
}

int32_t currentScope() { return scope_stack.empty() ? -1 : scope_stack.back(); }

std::string scopeName(int32_t scope) {
  Store& s = store();
  std::lock_guard<std::mutex> lock(s.mutex);
  return scope >= 0 && static_cast<size_t>(scope) < s.scopes.size() ? s.scopes[scope] : "";
}

}  // namespace poptorch::profiling
