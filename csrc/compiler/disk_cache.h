// Executables on disk (POPTORCH_CACHE_DIR, Options.enableExecutableCaching):
// one file per graph structure and build, so that a process compiles nothing
// that another one compiled before. Several processes may share a directory:
// a file is written whole under a temporary name, then renamed into place, so a
// reader sees an old entry, a new one, or none (and one torn by a crash fails its
// checksum: it is compiled again).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace poptorch::compiler {

class DiskCache {
 public:
  explicit DiskCache(std::string directory) : directory_(std::move(directory)) {}

  // POPTORCH_CACHE_DIR, read once (empty when unset).
  static const std::string& defaultDirectory();

  // Where the entry of `key` (a graph's structural hash) lives: the name
  // also covers this build, so that builds sharing a directory keep apart.
  std::string pathOf(uint64_t key) const;
  // The bytes of the entry of `key`, if there is one.
  std::optional<std::string> read(uint64_t key) const;
  // Whether a file of `key`'s entry is there (usable or not).
  bool contains(uint64_t key) const;
  // Stores `bytes` as the entry of `key`, atomically. A directory that cannot
  // be written is logged (once), never an error: the cache is an optimisation.
  void write(uint64_t key, const std::string& bytes) const;

  const std::string& directory() const { return directory_; }

 private:
  std::string directory_;
};

}  // namespace poptorch::compiler
