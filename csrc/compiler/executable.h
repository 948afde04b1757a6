// What the compiler produces: an optimised program plus the plan the runtime
// follows to run it (where each buffer lives, and when temporaries are freed).
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "compiler/node_dependencies.h"
#include "ir/graph.h"

namespace poptorch::compiler {

enum class BufferRole : uint8_t {
  kUnused,    // no node of the optimised program touches it
  kExternal,  // lives in an ipu storage: read before, or kept after, the run
  kProduced,  // a temporary made by the node that first writes it
  kScratch,   // a temporary with no producing node (an uninitialised factory)
};

struct Executable {
  uint64_t key = 0;
  ir::Graph program;
  std::vector<BufferRole> roles;
  // Per buffer: a 4-D temporary that every node reads and writes whole in its
  // captured (contiguous) layout. The runtime may hold it in channels-last
  // layout instead when its producer returns it so, rather than copy it back.
  std::vector<bool> flexible_layout;
  // release_after[i]: temporaries whose last use is node i of `program`.
  std::vector<std::vector<ir::BufferId>> release_after;
  // Modelled peak of temporary memory, per ipu device index.
  std::vector<int64_t> peak_temporary_bytes;
  // Per buffer: where a temporary lives in the run's arena (bytes; -1 for the
  // others). Temporaries alive at the same time never overlap.
  std::vector<int64_t> arena_offset;
  int64_t arena_bytes = 0;
  // Per node of `program`: the out= overload that writes its result straight
  // into the result's buffer, for nodes that can use one.
  std::vector<std::optional<c10::OperatorHandle>> out_variant;
  // The program is specialised on values read while capturing (it has guard
  // nodes). A run whose guard fails restores `guarded_writes`, the external
  // buffers that nodes up to the last guard write in place.
  bool has_guards = false;
  std::vector<ir::BufferId> guarded_writes;
  // Which nodes may run at the same time (derived from the above, not stored
  // in serialised executables).
  NodeDependencies dependencies;
};

// Optimises `graph` and plans it. `key` is its structural hash.
std::shared_ptr<const Executable> compile(const ir::Graph& graph, uint64_t key);

// Executables by structural hash, least recently used first out: at most
// capacity() of them (POPTORCH_EXECUTABLE_CACHE_SIZE), so a program of many
// graph shapes does not keep every executable it ever compiled. An evicted
// executable lives on in the Programs that hold it.
class ExecutableCache {
 public:
  static ExecutableCache& get();
  // Null when absent; a hit makes the executable the most recently used.
  std::shared_ptr<const Executable> find(uint64_t key);
  void insert(std::shared_ptr<const Executable> executable);
  void clear();
  size_t size() const;
  size_t capacity() const;
  // Evicts the least recently used executables beyond `capacity` (0: keep none).
  void setCapacity(size_t capacity);

 private:
  ExecutableCache();
  void evictBeyondCapacity();  // expects mutex_ held

  mutable std::mutex mutex_;
  size_t capacity_;
  std::list<std::shared_ptr<const Executable>> by_use_;  // most recently used first
  std::unordered_map<uint64_t, std::list<std::shared_ptr<const Executable>>::iterator> index_;
};

}  // namespace poptorch::compiler
