// poptorch._C.profiling_*: the profiler's events and switches.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <utility>

#include "profiling/profiler.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace poptorch::python {

void bindProfiling(py::module& m) {
  m.def("profiling_set_enabled", &profiling::setEnabled);
  m.def("profiling_enabled", &profiling::enabled);
  m.def("profiling_now", &profiling::now, "Nanoseconds on the profiler's (monotonic) clock.");
  m.def("profiling_set_session", &profiling::setSession,
        "This thread's events belong to `session` from now on; returns the previous one.");
  m.def(
      "profiling_record",
      [](const std::string& name, int64_t start_ns, int64_t end_ns) {
        profiling::Event event;
        event.kind = profiling::Kind::kUser;
        event.name = name;
        event.start_ns = start_ns;
        event.end_ns = end_ns;
        profiling::record(std::move(event));
      },
      "Records a user span (a Channel tracepoint).");
  m.def(
      "profiling_take",
      [] {
        py::list events;
        for (const profiling::Event& e : profiling::take()) {
          events.append(py::make_tuple(static_cast<int>(e.kind), e.name, e.ipu, e.start_ns,
                                       e.end_ns, e.session, e.track, e.program, e.node, e.bytes,
                                       e.ipu_bytes, e.micro_batch));
        }
        return events;
      },
      "(kind, name, ipu, start_ns, end_ns, session, track, program, node, bytes, ipu_bytes, "
      "micro_batch) of the events recorded since the last take.");
  m.def("profiling_dropped", &profiling::dropped);
  m.def(
      "profiling_programs",
      [] {
        py::dict programs;
        for (const profiling::ProgramInfo& info : profiling::programs()) {
          programs[py::int_(info.key)] =
              py::make_tuple(info.node_names, info.temporary_bytes, info.peak_temporary_bytes);
        }
        return programs;
      },
      "key -> (node names, temporaries per node per ipu, peak per ipu) of each executable run "
      "while profiling.");
  m.def("push_name_scope", &profiling::pushScope);
  m.def("pop_name_scope", &profiling::popScope);
}

}  // namespace poptorch::python
