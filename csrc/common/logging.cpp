#include "common/logging.h"

#include <glog/logging.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>
#include <mutex>
#include <unordered_set>

namespace poptorch::logging {
namespace {

Level levelFromEnvironment() {
  Level level = Level::kInfo;
  if (const char* env = std::getenv("POPTORCH_LOG_LEVEL")) {
    parseLevel(env, &level);
  }
  return level;
}

// The level is read on every log statement, from any thread.
std::atomic<Level>& currentLevel() {
  static std::atomic<Level> level{levelFromEnvironment()};
  return level;
}

void initGlogOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    FLAGS_logtostderr = true;
    FLAGS_minloglevel = 0;
    if (!google::IsGoogleLoggingInitialized()) {
      google::InitGoogleLogging("poptorch");
    }
  });
}

const char* levelName(Level level) {
  switch (level) {
    case Level::kTrace:
      return "TRACE";
    case Level::kDebug:
      return "DEBUG";
    case Level::kInfo:
      return "INFO";
    case Level::kWarn:
      return "WARN";
    case Level::kErr:
      return "ERR";
    case Level::kOff:
      return "OFF";
  }
  return "?";
}

}  // namespace

bool parseLevel(std::string_view text, Level* level) {
  std::string upper(text);
  std::transform(upper.begin(), upper.end(), upper.begin(),
                 [](unsigned char c) { return std::toupper(c); });
  if (upper == "OFF")
    *level = Level::kOff;
  else if (upper == "ERR")
    *level = Level::kErr;
  else if (upper == "WARN")
    *level = Level::kWarn;
  else if (upper == "INFO")
    *level = Level::kInfo;
  else if (upper == "DEBUG")
    *level = Level::kDebug;
  else if (upper == "TRACE" || upper == "TRACE_ALL")
    *level = Level::kTrace;
  else
    return false;
  return true;
}

void setLevel(Level level) { currentLevel().store(level); }
Level level() { return currentLevel().load(std::memory_order_relaxed); }

void write(Level level, const char* file, int line, const std::string& message) {
  initGlogOnce();
  // glog has no DEBUG or TRACE severities: those go out as INFO, tagged.
  google::LogSeverity severity = google::GLOG_INFO;
  if (level == Level::kWarn) severity = google::GLOG_WARNING;
  if (level == Level::kErr) severity = google::GLOG_ERROR;
  google::LogMessage(file, line, severity).stream()
      << "[poptorch:" << levelName(level) << "] " << message;
}

bool firstTime(const std::string& key) {
  static std::mutex mutex;
  static std::unordered_set<std::string> seen;
  std::lock_guard<std::mutex> lock(mutex);
  return seen.insert(key).second;
}

}  // namespace poptorch::logging
