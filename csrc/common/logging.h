// PopTorch's logging: levels as the user guide names them (POPTORCH_LOG_LEVEL),
// written through glog. Only logging.cpp includes glog, so c10's own LOG/CHECK
// macros never meet glog's in one translation unit.
#pragma once

#include <sstream>
#include <string>
#include <string_view>

namespace poptorch::logging {

enum class Level { kTrace = 0, kDebug = 1, kInfo = 2, kWarn = 3, kErr = 4, kOff = 5 };

// Parses OFF, ERR, WARN, INFO, DEBUG, TRACE or TRACE_ALL (any case).
// Returns false and leaves `level` alone for anything else.
bool parseLevel(std::string_view text, Level* level);
void setLevel(Level level);
Level level();
inline bool enabled(Level l) { return l >= level() && l != Level::kOff; }

void write(Level level, const char* file, int line, const std::string& message);

// Logs `message` the first time `key` is seen, and never again in this process.
bool firstTime(const std::string& key);

class Message {
 public:
  Message(Level level, const char* file, int line) : level_(level), file_(file), line_(line) {}
  ~Message() { write(level_, file_, line_, stream_.str()); }
  std::ostringstream& stream() { return stream_; }

 private:
  Level level_;
  const char* file_;
  int line_;
  std::ostringstream stream_;
};

}  // namespace poptorch::logging

#define POPTORCH_LOG(LEVEL)                                               \
  if (!::poptorch::logging::enabled(::poptorch::logging::Level::LEVEL)) { \
  } else                                                                  \
    ::poptorch::logging::Message(::poptorch::logging::Level::LEVEL, __FILE__, __LINE__).stream()
