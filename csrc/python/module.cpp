// poptorch._C: thin bindings over the C++ core. Importing it registers the
// ipu device (allocator, guard, dispatcher kernels) with PyTorch.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "capture/capture.h"
#include "capture/pending_graph.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "compiler/executable.h"
#include "device/ipu_device.h"

namespace py = pybind11;

namespace poptorch {
namespace {

py::dict metricsDict() {
  const MetricsSnapshot s = Metrics::get().snapshot();
  py::dict d;
  d["ops_captured"] = s.ops_captured;
  d["graphs_compiled"] = s.graphs_compiled;
  d["cache_hits"] = s.cache_hits;
  d["executions"] = s.executions;
  d["host_fallbacks"] = s.host_fallbacks;
  d["fallback_ops"] = s.fallback_ops;
  d["compile_seconds"] = s.compile_seconds;
  d["execute_seconds"] = s.execute_seconds;
  d["bytes_to_ipu"] = s.bytes_to_ipu;
  d["bytes_from_ipu"] = s.bytes_from_ipu;
  return d;
}

void setLogLevel(const std::string& name) {
  logging::Level level;
  if (!logging::parseLevel(name, &level)) {
    throw py::value_error("unknown log level '" + name +
                          "': use one of OFF, ERR, WARN, INFO, DEBUG, TRACE, TRACE_ALL");
  }
  logging::setLevel(level);
}

std::string pendingGraph() {
  auto lock = capture::PendingGraph::get().lock();
  return capture::PendingGraph::get().toString();
}

size_t pendingNodes() {
  auto lock = capture::PendingGraph::get().lock();
  return capture::PendingGraph::get().size();
}

}  // namespace
}  // namespace poptorch

PYBIND11_MODULE(_C, m) {
  using namespace poptorch;
  m.doc() = "The C++ core of poptorch: the ipu device, lazy capture, compiler and runtime.";
  m.def("synchronize", &capture::synchronize, py::call_guard<py::gil_scoped_release>(),
        "Runs every pending ipu operation.");
  m.def("metrics", &metricsDict);
  m.def("reset_metrics", [] { Metrics::get().reset(); });
  m.def("pending_graph", &pendingGraph, "The pending graph, as text.");
  m.def("pending_nodes", &pendingNodes);
  m.def("clear_executable_cache", [] { compiler::ExecutableCache::get().clear(); });
  m.def("executable_cache_size", [] { return compiler::ExecutableCache::get().size(); });
  m.def("device_count", &device::deviceCount);
  m.def("current_device", &device::currentIndex);
  m.def("set_device", &device::setCurrentIndex);
  m.def("memory_allocated", &device::memoryAllocated);
  m.def("max_memory_allocated", &device::maxMemoryAllocated);
  m.def("reset_peak_memory_stats", &device::resetPeakMemoryAllocated);
  m.def("memory_capacity", &device::memoryCapacity);
  m.def("configure_ipus", &device::configure, py::arg("num_ipus"), py::arg("memory_per_ipu"));
  m.def("set_log_level", &setLogLevel);
}
