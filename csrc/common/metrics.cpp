#include "common/metrics.h"

namespace poptorch {

Metrics& Metrics::get() {
  static Metrics metrics;
  return metrics;
}

void Metrics::graphCompiled(double seconds) {
  graphs_compiled_.fetch_add(1, std::memory_order_relaxed);
  compile_seconds_.fetch_add(seconds, std::memory_order_relaxed);
}

void Metrics::executed(double seconds) {
  executions_.fetch_add(1, std::memory_order_relaxed);
  execute_seconds_.fetch_add(seconds, std::memory_order_relaxed);
}

void Metrics::dynamoGraph(bool recompile) {
  dynamo_graphs_.fetch_add(1, std::memory_order_relaxed);
  if (recompile) dynamo_recompiles_.fetch_add(1, std::memory_order_relaxed);
}

bool Metrics::hostFallback(const std::string& op) {
  host_fallbacks_.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(fallback_mutex_);
  return ++fallback_ops_[op] == 1;
}

MetricsSnapshot Metrics::snapshot() const {
  MetricsSnapshot s;
  s.ops_captured = ops_captured_.load();
  s.graphs_compiled = graphs_compiled_.load();
  s.cache_hits = cache_hits_.load();
  s.cache_evictions = cache_evictions_.load();
  s.executables_loaded = executables_loaded_.load();
  s.executions = executions_.load();
  s.host_fallbacks = host_fallbacks_.load();
  s.guard_failures = guard_failures_.load();
  s.bytes_to_ipu = bytes_to_ipu_.load();
  s.bytes_from_ipu = bytes_from_ipu_.load();
  s.bytes_between_ipus = bytes_between_ipus_.load();
  s.dynamo_graphs = dynamo_graphs_.load();
  s.dynamo_recompiles = dynamo_recompiles_.load();
  s.dynamo_replays = dynamo_replays_.load();
  s.compile_seconds = compile_seconds_.load();
  s.execute_seconds = execute_seconds_.load();
  std::lock_guard<std::mutex> lock(fallback_mutex_);
  s.fallback_ops = fallback_ops_;
  return s;
}

void Metrics::reset() {
  ops_captured_ = 0;
  graphs_compiled_ = 0;
  cache_hits_ = 0;
  cache_evictions_ = 0;
  executables_loaded_ = 0;
  executions_ = 0;
  host_fallbacks_ = 0;
  guard_failures_ = 0;
  bytes_to_ipu_ = 0;
  bytes_from_ipu_ = 0;
  bytes_between_ipus_ = 0;
  dynamo_graphs_ = 0;
  dynamo_recompiles_ = 0;
  dynamo_replays_ = 0;
  compile_seconds_ = 0;
  execute_seconds_ = 0;
  std::lock_guard<std::mutex> lock(fallback_mutex_);
  fallback_ops_.clear();
}

}  // namespace poptorch
