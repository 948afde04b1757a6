// Process-wide counters behind poptorch.metrics(): what capture, the compiler
// and the runtime did. Counters are atomics; the per-op fallback table has a lock.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

namespace poptorch {

struct MetricsSnapshot {
  int64_t ops_captured = 0;
  int64_t graphs_compiled = 0;
  int64_t cache_hits = 0;
  int64_t cache_evictions = 0;
  int64_t executables_loaded = 0;
  int64_t executions = 0;
  int64_t host_fallbacks = 0;
  int64_t guard_failures = 0;
  int64_t bytes_to_ipu = 0;
  int64_t bytes_from_ipu = 0;
  int64_t bytes_between_ipus = 0;  // tensors a model split over IPUs moved between them
  int64_t dynamo_graphs = 0;       // graphs torch.compile(backend="ipu") was given
  int64_t dynamo_recompiles = 0;   // of which dynamo compiled again after a guard failed
  int64_t dynamo_replays = 0;      // calls of compiled graphs replayed from C++
  double compile_seconds = 0;
  double execute_seconds = 0;
  std::map<std::string, int64_t> fallback_ops;
};

class Metrics {
 public:
  static Metrics& get();

  void opCaptured() { ops_captured_.fetch_add(1, std::memory_order_relaxed); }
  void graphCompiled(double seconds);
  void cacheHit() { cache_hits_.fetch_add(1, std::memory_order_relaxed); }
  void cacheEviction() { cache_evictions_.fetch_add(1, std::memory_order_relaxed); }
  // An executable read from the disk cache or a precompiled file instead of compiled.
  void executableLoaded() { executables_loaded_.fetch_add(1, std::memory_order_relaxed); }
  void executed(double seconds);
  // Returns true the first time `op` falls back, so callers can log it once.
  bool hostFallback(const std::string& op);
  void guardFailed() { guard_failures_.fetch_add(1, std::memory_order_relaxed); }
  void bytesToIpu(int64_t n) { bytes_to_ipu_.fetch_add(n, std::memory_order_relaxed); }
  void bytesFromIpu(int64_t n) { bytes_from_ipu_.fetch_add(n, std::memory_order_relaxed); }
  void bytesBetweenIpus(int64_t n) { bytes_between_ipus_.fetch_add(n, std::memory_order_relaxed); }
  void dynamoGraph(bool recompile);
  void dynamoReplay() { dynamo_replays_.fetch_add(1, std::memory_order_relaxed); }

  MetricsSnapshot snapshot() const;
  void reset();

 private:
  std::atomic<int64_t> ops_captured_{0};
  std::atomic<int64_t> graphs_compiled_{0};
  std::atomic<int64_t> cache_hits_{0};
  std::atomic<int64_t> cache_evictions_{0};
  std::atomic<int64_t> executables_loaded_{0};
  std::atomic<int64_t> executions_{0};
  std::atomic<int64_t> host_fallbacks_{0};
  std::atomic<int64_t> guard_failures_{0};
  std::atomic<int64_t> bytes_to_ipu_{0};
  std::atomic<int64_t> bytes_from_ipu_{0};
  std::atomic<int64_t> bytes_between_ipus_{0};
  std::atomic<int64_t> dynamo_graphs_{0};
  std::atomic<int64_t> dynamo_recompiles_{0};
  std::atomic<int64_t> dynamo_replays_{0};
  std::atomic<double> compile_seconds_{0};
  std::atomic<double> execute_seconds_{0};
  mutable std::mutex fallback_mutex_;
  std::map<std::string, int64_t> fallback_ops_;
};

}  // namespace poptorch
