// Where the executable of a graph comes from: the in-memory ExecutableCache,
// then the executables a wrapped model brought from a precompiled file, then
// the disk cache, and only then the compiler (whose result is then written to
// the disk cache). Executables from a file or the disk are used only for a
// graph of exactly the structure they were compiled from.
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "compiler/executable.h"
#include "compiler/serialization.h"

namespace poptorch::compiler {

// The executables of one wrapped model: those loaded from a precompiled file
// and those its captures used, which compileAndExport writes.
class ExecutableSet {
 public:
  // Adds the entry in `bytes`. Throws c10::Error saying what is wrong when it
  // is not an entry of this build.
  void add(const std::string& bytes);
  // Every executable in the set, as entry bytes.
  std::vector<std::string> entries() const;
  size_t size() const;

  // The executable of `key` compiled from a graph of `structure`, or null.
  std::shared_ptr<const Executable> find(uint64_t key, const std::string& structure) const;
  void record(std::shared_ptr<const Executable> executable, const std::string& structure);

 private:
  mutable std::mutex mutex_;
  std::vector<Entry> entries_;
};

// While it lives, the graphs this thread prepares also look for their
// executables in `set` (if not null) and record there the ones they use, and
// use the disk cache in `directory` (empty: none) instead of POPTORCH_CACHE_DIR's.
// Scopes nest: the innermost applies.
class LookupScope {
 public:
  LookupScope(std::shared_ptr<ExecutableSet> set, std::optional<std::string> directory);
  ~LookupScope();
  LookupScope(const LookupScope&) = delete;
  LookupScope& operator=(const LookupScope&) = delete;

  static const LookupScope* current();
  ExecutableSet* set() const { return set_.get(); }
  const std::optional<std::string>& directory() const { return directory_; }

 private:
  std::shared_ptr<ExecutableSet> set_;
  std::optional<std::string> directory_;
  const LookupScope* previous_;
};

// The executable of `graph` (see above).
std::shared_ptr<const Executable> executableFor(const ir::Graph& graph);

}  // namespace poptorch::compiler
