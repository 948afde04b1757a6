// What the emulated IPU did, for the profile reports (poptorch.profiling,
// Options.enableProfiling, POPLAR_ENGINE_OPTIONS' autoReport, PVTI_OPTIONS):
// compilations, program runs, each node's time on its IPU, host transfers and
// the memory of each IPU over a program, as timed events that Python turns
// into a Chrome/Perfetto trace and an HTML page. Off unless a report asks for
// it: the runtime then pays one relaxed atomic load per program run.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace poptorch::compiler {
struct Executable;
}
namespace poptorch::ir {
struct Node;
}

namespace poptorch::profiling {

enum class Kind : uint8_t {
  kNode,     // one node of a program, on its IPU
  kProgram,  // one run of a compiled program
  kCompile,  // a graph compiled (bytes: its number of nodes)
  kToIpu,    // host -> IPU copy (bytes)
  kFromIpu,  // IPU -> host copy (bytes)
  kUser,     // a poptorch.profiling.Channel tracepoint
  kStage,    // one pipeline stage of one micro-batch, on its IPU
};

struct Event {
  Kind kind = Kind::kUser;
  std::string name;
  int32_t ipu = -1;  // -1: the host
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  int64_t session = 0;   // the recording thread's session (a wrapped model), 0: none
  int32_t track = 0;     // the recording thread's lane (see SessionScope)
  uint64_t program = 0;  // the executable's structural hash (nodes, programs, compiles)
  int32_t node = -1;     // kNode: its position in the program; kStage: the pipeline stage
  int64_t bytes = 0;
  int64_t micro_batch = -1;  // kStage: of the call
  // kProgram: the memory allocated on each IPU when the run started.
  std::vector<int64_t> ipu_bytes;
};

// How one executable uses memory, recorded at its first run while profiling.
struct ProgramInfo {
  uint64_t key = 0;
  std::vector<std::string> node_names;  // op names, in program order
  // [node][ipu]: temporaries live while each node runs (see compiler::planMemory).
  std::vector<std::vector<int64_t>> temporary_bytes;
  std::vector<int64_t> peak_temporary_bytes;  // per ipu
};

namespace detail {
extern std::atomic<bool> enabled;
}  // namespace detail

inline bool enabled() { return detail::enabled.load(std::memory_order_relaxed); }
void setEnabled(bool on);
// Nanoseconds on the monotonic clock (Python's time.perf_counter_ns).
int64_t now();

void record(Event event);
// The events recorded since the last take, oldest first.
std::vector<Event> take();
// Events not kept since start: at most kMaxEvents are held between takes.
int64_t dropped();
constexpr size_t kMaxEvents = 1'000'000;

// Each executable run while profiling, once.
std::vector<ProgramInfo> programs();

// Called by the compiler and the runtime while profiling.
void compiled(const compiler::Executable& exe, int64_t start_ns, int64_t end_ns);
void programRan(const compiler::Executable& exe, int64_t start_ns, int64_t end_ns);
void nodeRan(const compiler::Executable& exe, size_t index, const ir::Node& captured,
             int64_t start_ns, int64_t end_ns);
// Pipeline stage `stage` of micro-batch `micro_batch` ran on `ipu`.
void stageRan(const compiler::Executable& exe, int32_t stage, int32_t ipu, int64_t micro_batch,
              int64_t start_ns, int64_t end_ns);

// A host transfer: recorded when the span ends, if profiling.
class TransferSpan {
 public:
  TransferSpan(Kind kind, int64_t bytes, int32_t ipu);
  ~TransferSpan();
  TransferSpan(const TransferSpan&) = delete;
  TransferSpan& operator=(const TransferSpan&) = delete;

 private:
  Kind kind_;
  int64_t bytes_;
  int32_t ipu_;
  int64_t start_ns_;
};

// The session this thread's events belong to from now on (a wrapped model's
// id; 0: none). Returns the previous one, to restore.
int64_t setSession(int64_t session);
int64_t currentSession();

// While it lives, this thread's events belong to `session` and lie on
// `track`: the lane of a call that runs micro-batches on several threads at
// once, so that reports never overlap two spans on one track.
class SessionScope {
 public:
  SessionScope(int64_t session, int32_t track);
  ~SessionScope();
  SessionScope(const SessionScope&) = delete;
  SessionScope& operator=(const SessionScope&) = delete;

 private:
  int64_t outer_session_;
  int32_t outer_track_;
};

// Name scopes (poptorch.NameScope, and the modules of a wrapped model): nodes
// captured inside are named "scope/op" in reports.
void pushScope(const std::string& name);
void popScope();
// This thread's current scope (-1: none), and its full name.
int32_t currentScope();
std::string scopeName(int32_t scope);

}  // namespace poptorch::profiling
