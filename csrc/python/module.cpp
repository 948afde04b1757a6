// poptorch._C: thin bindings over the C++ core. Importing it registers the
// ipu device (allocator, guard, dispatcher kernels) with PyTorch. Each
// subsystem's bindings are in their own file (bindings.h); metrics and
// logging, which every subsystem feeds, are here.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/Exceptions.h>

#include <string>

#include "common/logging.h"
#include "common/metrics.h"
#include "common/user_errors.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace poptorch::python {
namespace {

py::dict metricsDict() {
  const MetricsSnapshot s = Metrics::get().snapshot();
  py::dict d;
  d["ops_captured"] = s.ops_captured;
  d["graphs_compiled"] = s.graphs_compiled;
  d["cache_hits"] = s.cache_hits;
  d["cache_evictions"] = s.cache_evictions;
  d["executables_loaded"] = s.executables_loaded;
  d["executions"] = s.executions;
  d["host_fallbacks"] = s.host_fallbacks;
  d["guard_failures"] = s.guard_failures;
  d["fallback_ops"] = s.fallback_ops;
  d["compile_seconds"] = s.compile_seconds;
  d["execute_seconds"] = s.execute_seconds;
  d["bytes_to_ipu"] = s.bytes_to_ipu;
  d["bytes_from_ipu"] = s.bytes_from_ipu;
  d["bytes_between_ipus"] = s.bytes_between_ipus;
  d["dynamo_graphs"] = s.dynamo_graphs;
  d["dynamo_recompiles"] = s.dynamo_recompiles;
  d["dynamo_replays"] = s.dynamo_replays;
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

// Raises the poptorch.Error of `kind` through torch's bindings, which restore
// the Python error a python_error carries. Only on a thread Python runs on:
// another (a worker's) taking the GIL could wait for a thread that waits for
// it; there the core raises c10's error.
void raiseUserError(UserError kind, const std::string& message) {
  if (!Py_IsInitialized() || PyGILState_GetThisThreadState() == nullptr) return;
  py::gil_scoped_acquire gil;
  const py::object error = py::module_::import("poptorch._errors")
                               .attr(kind == UserError::kValue ? "ValueCompatibleError"
                                                               : "UnsupportedError");
  PyErr_SetObject(error.ptr(), error(message).ptr());
  python_error raised;
  raised.persist();
  throw raised;
}

}  // namespace
}  // namespace poptorch::python

PYBIND11_MODULE(_C, m) {
  using namespace poptorch;
  m.doc() = "The C++ core of poptorch: the ipu device, lazy capture, compiler and runtime.";
  m.def("metrics", &python::metricsDict);
  m.def("reset_metrics", [] { Metrics::get().reset(); });
  m.def(
      "count_dynamo_graph", [](bool recompile) { Metrics::get().dynamoGraph(recompile); },
      py::arg("recompile"));
  m.def("set_log_level", &python::setLogLevel);
  setUserErrorRaiser(&python::raiseUserError);
  python::bindDevice(m);
  python::bindShapeInference(m);
  python::bindCapture(m);
  python::bindCompiler(m);
  python::bindRuntime(m);
  python::bindProfiling(m);
}
