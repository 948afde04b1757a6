#include "compiler/executable_lookup.h"

#include <chrono>
#include <functional>
#include <unordered_set>

#include "common/logging.h"
#include "common/metrics.h"
#include "compiler/disk_cache.h"
#include "ir/hash.h"
#include "profiling/profiler.h"

namespace poptorch::compiler {
namespace {

thread_local const LookupScope* current_scope = nullptr;

double secondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The structure of the graph being looked up, made once and only if needed.
class LazyStructure {
 public:
  explicit LazyStructure(const ir::Graph& graph) : graph_(graph) {}

  // Null when the graph has something no entry can hold (it is then never
  // stored, and compiled in every process).
  const std::string* get() {
    if (!done_) {
      done_ = true;
      try {
        structure_ = structureOf(graph_);
      } catch (const NotSerializable& reason) {
        POPTORCH_LOG(kDebug) << "a graph that cannot be stored as an executable entry: "
                             << reason.what();
      }
    }
    return structure_ ? &*structure_ : nullptr;
  }

 private:
  const ir::Graph& graph_;
  bool done_ = false;
  std::optional<std::string> structure_;
};

// The executable of an entry, if it was compiled from `graph`'s structure and
// fits it.
std::shared_ptr<const Executable> usable(const Entry& entry, uint64_t key,
                                         const std::string& structure, const ir::Graph& graph) {
  TORCH_CHECK(entry.executable->key == key && entry.structure == structure,
              "it holds the executable of another graph");
  checkFits(*entry.executable, graph);
  return entry.executable;
}

std::shared_ptr<const Executable> fromDisk(const DiskCache& disk, uint64_t key,
                                           const std::string& structure, const ir::Graph& graph) {
  std::optional<std::string> bytes = disk.read(key);
  if (!bytes) return nullptr;
  try {
    return usable(decodeEntry(*bytes), key, structure, graph);
  } catch (const std::exception& error) {
    POPTORCH_LOG(kWarn) << "executable cache: " << disk.pathOf(key) << " is unusable ("
                        << error.what() << "): compiling the graph again";
    return nullptr;
  }
}

// The entries this process knows a cache directory to hold (it wrote, read
// or found them there), by (directory, key): an executable found in memory is
// written to a directory at most once, and a steady loop checks no file.
class EntriesOnDisk {
 public:
  static EntriesOnDisk& get() {
    static EntriesOnDisk entries;
    return entries;
  }

  // True the first time (directory, key) is given. Two directories whose
  // hashes meet lose a write, never a result: the cache is an optimisation.
  bool firstTime(const std::string& directory, uint64_t key) {
    const uint64_t id = ir::hashCombine(std::hash<std::string>{}(directory), key);
    std::lock_guard<std::mutex> lock(mutex_);
    return known_.insert(id).second;
  }

 private:
  std::mutex mutex_;
  std::unordered_set<uint64_t> known_;
};

// Writes the entry of `exe` to `disk`, unless the directory is known to hold
// it or (without `replace`) holds a file of its key. An executable may come
// from memory or a precompiled set, compiled for a graph of another directory:
// the model whose options name this one still gets its executables there.
void store(const DiskCache& disk, uint64_t key, const std::shared_ptr<const Executable>& exe,
           LazyStructure& structure, bool replace) {
  const bool first = EntriesOnDisk::get().firstTime(disk.directory(), key);
  if (!replace && (!first || disk.contains(key))) return;
  if (structure.get() == nullptr) return;
  try {
    disk.write(key, encodeEntry({exe, *structure.get()}));
  } catch (const NotSerializable& reason) {
    POPTORCH_LOG(kDebug) << "executable cache: not writing a graph: " << reason.what();
  }
}

}  // namespace

void ExecutableSet::add(const std::string& bytes) {
  Entry entry = decodeEntry(bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  entries_.push_back(std::move(entry));
}

std::vector<std::string> ExecutableSet::entries() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::string> bytes;
  bytes.reserve(entries_.size());
  for (const Entry& entry : entries_) bytes.push_back(encodeEntry(entry));
  return bytes;
}

size_t ExecutableSet::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_.size();
}

std::shared_ptr<const Executable> ExecutableSet::find(uint64_t key,
                                                      const std::string& structure) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const Entry& entry : entries_) {
    if (entry.executable->key == key && entry.structure == structure) return entry.executable;
  }
  return nullptr;
}

void ExecutableSet::record(std::shared_ptr<const Executable> executable,
                           const std::string& structure) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const Entry& entry : entries_) {
    if (entry.executable->key == executable->key && entry.structure == structure) return;
  }
  entries_.push_back({std::move(executable), structure});
}

LookupScope::LookupScope(std::shared_ptr<ExecutableSet> set, std::optional<std::string> directory)
    : set_(std::move(set)), directory_(std::move(directory)), previous_(current_scope) {
  current_scope = this;
}

LookupScope::~LookupScope() { current_scope = previous_; }

const LookupScope* LookupScope::current() { return current_scope; }

std::shared_ptr<const Executable> executableFor(const ir::Graph& graph) {
  const uint64_t key = ir::structuralHash(graph);
  const LookupScope* scope = LookupScope::current();
  ExecutableSet* set = scope != nullptr ? scope->set() : nullptr;
  const std::string& directory =
      scope != nullptr && scope->directory() ? *scope->directory() : DiskCache::defaultDirectory();
  LazyStructure structure(graph);
  const DiskCache disk(directory);
  auto& cache = ExecutableCache::get();
  std::shared_ptr<const Executable> exe = cache.find(key);
  if (exe) {
    Metrics::get().cacheHit();
    // It may come from a graph of another directory (or of none).
    if (!directory.empty()) store(disk, key, exe, structure, /*replace=*/false);
  } else {
    if (set != nullptr && structure.get() != nullptr) {
      exe = set->find(key, *structure.get());
      if (exe) {
        try {
          checkFits(*exe, graph);
        } catch (const std::exception& error) {
          POPTORCH_LOG(kWarn) << "a precompiled executable does not fit its graph (" << error.what()
                              << "): compiling the graph again";
          exe = nullptr;
        }
      }
      if (exe && !directory.empty()) store(disk, key, exe, structure, /*replace=*/false);
    }
    if (!exe && !directory.empty() && structure.get() != nullptr) {
      exe = fromDisk(disk, key, *structure.get(), graph);
      if (exe) EntriesOnDisk::get().firstTime(directory, key);
    }
    if (exe) {
      Metrics::get().executableLoaded();
    } else {
      const auto start = std::chrono::steady_clock::now();
      const int64_t start_ns = profiling::enabled() ? profiling::now() : 0;
      POPTORCH_LOG(kDebug) << "compiling a graph of " << graph.nodes.size()
                           << " nodes: no executable with its structure is cached";
      exe = compile(graph, key);
      Metrics::get().graphCompiled(secondsSince(start));
      if (start_ns != 0) profiling::compiled(*exe, start_ns, profiling::now());
      // Over an entry that failed to load, if there was one.
      if (!directory.empty()) store(disk, key, exe, structure, /*replace=*/true);
    }
    cache.insert(exe);
  }
  if (set != nullptr && structure.get() != nullptr) set->record(exe, *structure.get());
  return exe;
}

}  // namespace poptorch::compiler
