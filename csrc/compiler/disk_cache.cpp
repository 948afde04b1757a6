#include "compiler/disk_cache.h"

#include <absl/strings/str_format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <vector>

#include "common/logging.h"
#include "compiler/serialization.h"
#include "ir/hash.h"

namespace poptorch::compiler {
namespace {

// Logs a failure to write the cache once per directory: a read-only or full
// disk must not flood the log with one message per graph.
void warnOnce(const std::string& directory, const std::string& what) {
  if (logging::firstTime("disk cache write " + directory)) {
    POPTORCH_LOG(kWarn) << "executable cache: cannot write to " << directory << " (" << what
                        << "); executables are compiled but not cached there";
  }
}

// Writes all of `bytes` to `fd`; false (with errno set) if it could not.
bool writeAll(int fd, const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

const std::string& DiskCache::defaultDirectory() {
  static const std::string directory = [] {
    const char* value = std::getenv("POPTORCH_CACHE_DIR");
    return std::string(value != nullptr ? value : "");
  }();
  return directory;
}

std::string DiskCache::pathOf(uint64_t key) const {
  static const uint64_t build = std::hash<std::string>{}(buildIdentity());
  return absl::StrFormat("%s/%016x.poptorch_exe", directory_, ir::hashCombine(key, build));
}

std::optional<std::string> DiskCache::read(uint64_t key) const {
  std::ifstream file(pathOf(key), std::ios::binary);
  if (!file) return std::nullopt;
  std::ostringstream bytes;
  bytes << file.rdbuf();
  return std::move(bytes).str();
}

bool DiskCache::contains(uint64_t key) const {
  std::error_code error;
  return std::filesystem::exists(pathOf(key), error);
}

void DiskCache::write(uint64_t key, const std::string& bytes) const {
  std::error_code error;
  std::filesystem::create_directories(directory_, error);
  if (error) return warnOnce(directory_, error.message());
  const std::string path = pathOf(key);
  // A name of our own in the same directory (rename is atomic within a file system).
  std::string temporary = path + ".XXXXXX";
  std::vector<char> name(temporary.begin(), temporary.end());
  name.push_back('\0');
  const int fd = mkstemp(name.data());
  if (fd < 0) return warnOnce(directory_, std::strerror(errno));
  temporary = name.data();
  // mkstemp makes the file private; entries are readable like other files.
  // No fsync: it cost ~6 ms an entry here (compiling a graph takes ~0.1 ms),
  // and an entry torn by a crash fails its checksum when read, which is then
  // logged and compiled again. Renaming is what keeps processes apart.
  const bool written = fchmod(fd, 0644) == 0 && writeAll(fd, bytes);
  const int saved_errno = errno;
  ::close(fd);
  if (!written || std::rename(temporary.c_str(), path.c_str()) != 0) {
    const std::string what = std::strerror(written ? errno : saved_errno);
    std::remove(temporary.c_str());
    return warnOnce(directory_, what);
  }
  POPTORCH_LOG(kDebug) << "executable cache: wrote " << path;
}

}  // namespace poptorch::compiler
