// The bindings of poptorch._C, one function per subsystem, each in its own
// file; module.cpp's PYBIND11_MODULE calls them.
#pragma once

#include <pybind11/pybind11.h>

namespace poptorch::python {

// The ipu devices: count, current, memory, storages.
void bindDevice(pybind11::module& m);
// Lazy capture: the pending graph, step captures, placements, matmul plans,
// torch.compile's graph replays.
void bindCapture(pybind11::module& m);
// How capture infers an op's shapes: Meta kernels in Python, fake CPU tensors.
void bindShapeInference(pybind11::module& m);
// Executables: the in-memory cache, a wrapped model's set, the disk cache's scope.
void bindCompiler(pybind11::module& m);
// Running programs: a wrapped model's steps, replicas, host aliases, arenas.
void bindRuntime(pybind11::module& m);
// poptorch._C.profiling_*: the profiler's events and switches.
void bindProfiling(pybind11::module& m);

}  // namespace poptorch::python
