// poptorch._C: thin bindings over the C++ core. Importing it registers the
// ipu device (allocator, guard, dispatcher kernels) with PyTorch.
#include <ATen/record_function.h>
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/utils/pybind.h>

#include "capture/capture.h"
#include "capture/graph_replay.h"
#include "capture/meta_inference.h"
#include "capture/pending_graph.h"
#include "capture/placement.h"
#include "capture/step_capture.h"
#include "common/ivalue_tensors.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/source_location.h"
#include "compiler/executable.h"
#include "compiler/executable_lookup.h"
#include "device/ipu_device.h"
#include "device/ipu_tensor.h"
#include "profiling/profiler.h"
#include "runtime/arena.h"
#include "runtime/executor.h"
#include "runtime/program.h"
#include "runtime/replica_buffers.h"
#include "runtime/result_blocks.h"
#include "runtime/step_runner.h"
#include "runtime/step_variants.h"
#include "runtime/update_variants.h"

namespace py = pybind11;

namespace poptorch {
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

std::string pendingGraph() {
  auto lock = capture::PendingGraph::get().lock();
  return capture::PendingGraph::get().toString();
}

// The kernel warnings a step's calls gave while it was captured, which each
// later call of the model gives again (see PendingGraph::noteWarning).
struct StepWarnings {
  std::vector<c10::Warning> warnings;

  // As Python warnings of the calling thread, the way PyTorch's bindings turn
  // a kernel's TORCH_WARN into one.
  void give() const {
    torch::PyWarningHandler handler;
    for (const c10::Warning& warning : warnings) c10::warn(warning);
  }
};

StepWarnings takeStepWarnings() {
  auto lock = capture::PendingGraph::get().lock();
  return StepWarnings{capture::PendingGraph::get().takeWarnings()};
}

std::shared_ptr<runtime::Program> prepareProgram() {
  auto lock = capture::PendingGraph::get().lock();
  return capture::PendingGraph::get().prepare(/*allow_empty=*/true);
}

// `output_gathers`: (output mode, return period) per device output, or empty
// for `output_mode` and `return_period` for all. `before_update` (may be None)
// runs before each update, holding the GIL (pybind11 takes it to call Python).
std::vector<at::Tensor> runSteps(runtime::StepVariants& micro_step, runtime::UpdateVariants* update,
                                 const std::vector<at::Tensor>& device_inputs,
                                 const std::vector<at::Tensor>& host_inputs,
                                 const std::vector<at::Tensor>& device_outputs, int64_t iterations,
                                 int64_t accumulation, int64_t replicas, int output_mode,
                                 int64_t return_period, uint64_t seed,
                                 const std::vector<std::pair<int, int64_t>>& output_gathers,
                                 runtime::ReplicaBuffers* replica_buffers,
                                 const std::function<void()>& before_update,
                                 runtime::StepTimeline* timeline, int stages) {
  runtime::StepShape shape;
  shape.stages = static_cast<runtime::StageSchedule>(stages);
  shape.iterations = iterations;
  shape.accumulation = accumulation;
  shape.replicas = replicas;
  shape.gather = {static_cast<runtime::OutputMode>(output_mode), return_period};
  for (const auto& [mode, period] : output_gathers) {
    shape.output_gathers.push_back({static_cast<runtime::OutputMode>(mode), period});
  }
  return runtime::runSteps(micro_step, update, device_inputs, host_inputs, device_outputs, shape,
                           seed, replica_buffers, before_update, timeline);
}

// Python may look at an ipu tensor's storage (serialization, data_ptr(),
// storage copies), and PyTorch refuses a storage with no bytes as "invalid":
// give it host memory now. Nothing runs; reading its values still syncs.
void backStorage(const at::Tensor& tensor) {
  TORCH_CHECK_VALUE(tensor.is_ipu(), "expected an ipu tensor, got one on ", tensor.device());
  if (!tensor.has_storage()) return;  // a wrapper subclass: nothing to back
  auto lock = capture::PendingGraph::get().lock();
  device::materialize(*tensor.storage().unsafeGetStorageImpl());
}

// Indices of the host tensors that no longer view the bytes of their device
// copies (given new data by `param.data = t` or `model.half()`): a wrapped
// model checks its weights before each run, in one call.
std::vector<int64_t> unaliased(const std::vector<at::Tensor>& hosts,
                               const std::vector<at::Tensor>& devices) {
  TORCH_CHECK_VALUE(hosts.size() == devices.size(), "unaliased: ", hosts.size(),
                    " host tensors but ", devices.size(), " device tensors");
  std::vector<int64_t> result;
  for (size_t i = 0; i < hosts.size(); ++i) {
    const at::Tensor& host = hosts[i];
    const at::Tensor& device = devices[i];
    if (host.data_ptr() != device.data_ptr() || host.sizes() != device.sizes() ||
        host.dtype() != device.dtype()) {
      result.push_back(static_cast<int64_t>(i));
    }
  }
  return result;
}

// The innermost frame of the calling Python code outside torch and poptorch:
// where a value read while capturing a step came from.
std::string pythonSourceLocation() {
  py::gil_scoped_acquire gil;
  for (PyFrameObject* frame = PyEval_GetFrame(); frame != nullptr;) {
    PyCodeObject* code = PyFrame_GetCode(frame);
    const std::string file = py::cast<std::string>(py::handle(code->co_filename));
    const std::string function = py::cast<std::string>(py::handle(code->co_name));
    Py_DECREF(code);
    const bool library = file.find("/torch/") != std::string::npos ||
                         file.find("/poptorch/") != std::string::npos ||
                         file.rfind("<frozen", 0) == 0;
    if (!library) {
      return file + ":" + std::to_string(PyFrame_GetLineNumber(frame)) + " (in " + function + ")";
    }
    frame = PyFrame_GetBack(frame);  // a new reference, but frames below ours stay alive
    Py_XDECREF(frame);
  }
  return "an unknown place";
}

// A step captured again when its guards fail: the Python function returns
// the new Program.
runtime::StepVariants makeStepVariants(std::shared_ptr<runtime::Program> first,
                                       py::function capture) {
  auto shared = std::make_shared<py::function>(std::move(capture));
  return runtime::StepVariants(std::move(first), [shared](const runtime::GuardFailure& failure) {
    py::gil_scoped_acquire gil;
    return (*shared)(failure.site, failure.what()).cast<std::shared_ptr<runtime::Program>>();
  });
}

// The update chosen by a Python function of the variants that ran.
runtime::UpdateVariants makeUpdateVariants(std::shared_ptr<runtime::Program> first,
                                           py::function choose, bool choose_every_time) {
  auto shared = std::make_shared<py::function>(std::move(choose));
  return runtime::UpdateVariants(
      std::move(first),
      [shared](const std::vector<size_t>& ran) {
        py::gil_scoped_acquire gil;
        return (*shared)(ran).cast<std::shared_ptr<runtime::Program>>();
      },
      choose_every_time);
}

// A Meta kernel written in Python that raised KeyboardInterrupt, SystemExit
// (not Exceptions) or MemoryError gave no answer about shapes: the error goes
// to the user rather than the op to the host. Python kernels raise either
// pybind11's error_already_set or torch's python_error, which may leave the
// error set in the interpreter: cleared when the op goes to the host instead.
bool metaErrorMustPropagate(const std::exception& error) {
  auto no_answer = [](PyObject* type) {
    return type != nullptr && (!PyErr_GivenExceptionMatches(type, PyExc_Exception) ||
                               PyErr_GivenExceptionMatches(type, PyExc_MemoryError));
  };
  if (const auto* pybind = dynamic_cast<const py::error_already_set*>(&error)) {
    py::gil_scoped_acquire gil;
    return no_answer(pybind->type().ptr());
  }
  if (const auto* torch_error = dynamic_cast<const python_error*>(&error)) {
    py::gil_scoped_acquire gil;
    PyObject* type = torch_error->type != nullptr ? torch_error->type : PyErr_Occurred();
    const bool propagate = no_answer(type);
    if (!propagate && torch_error->type == nullptr) PyErr_Clear();
    return propagate;
  }
  return false;
}

// `with _C.LookupScope(set, directory):` — see compiler::LookupScope.
class PyLookupScope {
 public:
  PyLookupScope(std::shared_ptr<compiler::ExecutableSet> set, std::optional<std::string> directory)
      : set_(std::move(set)), directory_(std::move(directory)) {}
  void enter() {
    TORCH_CHECK(!scope_, "this LookupScope is active already");
    scope_.emplace(set_, directory_);
  }
  void exit(const py::args&) { scope_.reset(); }

 private:
  std::shared_ptr<compiler::ExecutableSet> set_;
  std::optional<std::string> directory_;
  std::optional<compiler::LookupScope> scope_;
};
py::list nodePlacements(const runtime::Program& program) {
  py::list out;
  for (const ir::Node& node : program.compiledGraph().nodes) {
    const ir::Placement& at = node.placement;
    out.append(py::make_tuple(node.name(), at.block, at.stage, at.phase, at.ipu));
  }
  return out;
}

py::list forwardBlockUse() {
  py::list out;
  for (const capture::BlockUse& use : capture::forwardBlockUse()) {
    out.append(py::make_tuple(use.block, use.nodes, use.first_op));
  }
  return out;
}

size_t pendingNodes() {
  auto lock = capture::PendingGraph::get().lock();
  return capture::PendingGraph::get().size();
}

// Capture's inference on fake CPU tensors (capture::setFakeCpuInference),
// through poptorch/_fake_cpu.py: `fake` makes fake CPU tensors of the meta
// tensors on the stack, and the op runs on them under `run`'s FakeTensor mode.
// The handles are the module's functions, which live as long as it does.
capture::FakeCpuRunner fakeCpuRunner(py::handle fake, py::handle run) {
  return [fake, run](const c10::OperatorHandle& op, torch::jit::Stack* arguments,
                     torch::jit::Stack* returns) {
    py::gil_scoped_acquire gil;
    // A fake tensor also carries the CPU's dispatch key, below Python's: if
    // the caller excluded Python dispatch (torch.tensor(data, device="ipu")
    // copies its data so, and so does torch._C._DisableTorchDispatch), the
    // op would skip FakeTensor's mode and run the CPU kernel on a storage with
    // no memory (deterministic mode's fill of a new ipu tensor crashed so).
    c10::impl::LocalDispatchKeySet keys = c10::impl::tls_local_dispatch_key_set();
    keys.excluded_ = keys.excluded_ - c10::DispatchKeySet({c10::DispatchKey::Python,
                                                           c10::DispatchKey::PythonTLSSnapshot});
    const c10::impl::ForceDispatchKeyGuard python_dispatch(keys);
    std::vector<at::Tensor> metas;
    for (const c10::IValue& value : *arguments) {
      forEachTensor(value, [&](const at::Tensor& t) {
        if (t.defined() && t.is_meta()) metas.push_back(t);
      });
    }
    const auto fakes = fake(metas).cast<std::vector<at::Tensor>>();
    size_t next = 0;
    auto replace = [&](const at::Tensor& t) {
      return t.defined() && t.is_meta() ? fakes[next++] : t;
    };
    for (c10::IValue& value : *arguments) {
      if (value.isTensor()) {
        value = replace(value.toTensor());
      } else if (value.isTensorList()) {
        c10::List<at::Tensor> list;
        for (const at::Tensor& t : value.toTensorList()) list.push_back(replace(t));
        value = list;
      } else if (value.isList() && value.toList().elementType()->isSubtypeOf(
                                       *c10::OptionalType::ofTensor())) {  // Tensor?[]
        c10::List<std::optional<at::Tensor>> list;
        for (const c10::IValue& element : value.toListRef()) {
          list.push_back(element.isNone() ? std::nullopt
                                          : std::optional<at::Tensor>(replace(element.toTensor())));
        }
        value = list;
      }
    }
    *returns = *arguments;
    run(py::cpp_function([&] {
      // Inference is not the op running: keep it out of torch.profiler.
      at::DisableRecordFunctionGuard no_profiling;
      op.callBoxed(returns);
    }));
  };
}

// poptorch._C.profiling_*: the profiler's events and switches.
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

}  // namespace
}  // namespace poptorch

PYBIND11_MODULE(_C, m) {
  using namespace poptorch;
  m.doc() = "The C++ core of poptorch: the ipu device, lazy capture, compiler and runtime.";
  capture::setMetaErrorFilter(&metaErrorMustPropagate);
  // torch.Stream takes the device type as a number.
  m.attr("IPU_DEVICE_TYPE") = static_cast<int>(c10::DeviceType::IPU);
  m.def("synchronize", &capture::synchronize, py::call_guard<py::gil_scoped_release>(),
        "Runs every pending ipu operation.");
  m.def("metrics", &metricsDict);
  m.def("reset_metrics", [] { Metrics::get().reset(); });
  m.def("pending_graph", &pendingGraph, "The pending graph, as text.");
  m.def("pending_nodes", &pendingNodes);
  m.def("meta_cache_size", &capture::metaCacheSize,
        "Signatures whose Meta results this thread has cached.");
  m.def("inferring_shapes", &capture::inferringShapes,
        "True while this thread runs a Meta kernel to infer an ipu op's shapes.");
  m.def("clear_executable_cache", [] { compiler::ExecutableCache::get().clear(); });
  m.def("executable_cache_size", [] { return compiler::ExecutableCache::get().size(); });
  m.def("executable_cache_capacity", [] { return compiler::ExecutableCache::get().capacity(); });
  m.def("set_executable_cache_capacity",
        [](size_t capacity) { compiler::ExecutableCache::get().setCapacity(capacity); });
  m.def("device_count", &device::deviceCount);
  m.def("current_device", &device::currentIndex);
  m.def("set_device", &device::setCurrentIndex);
  m.def("check_device", &device::checkIndex, "Raises an IndexError if `index` is not an ipu.");
  m.def("memory_allocated", &device::memoryAllocated);
  m.def("max_memory_allocated", &device::maxMemoryAllocated);
  m.def("reset_peak_memory_stats", &device::resetPeakMemoryAllocated);
  m.def("memory_capacity", &device::memoryCapacity);
  m.def(
      "idle_arena_bytes",
      [] { return runtime::ArenaPool::get().idleBytes() + runtime::result_blocks::idleBytes(); },
      "Host bytes the runtime keeps for the temporaries of later runs.");
  m.def(
      "empty_cache",
      [] {
        runtime::ArenaPool::get().clear();
        runtime::result_blocks::clear();
      },
      "Frees the host memory the runtime keeps for the temporaries of later runs.");
  m.def("configure_ipus", &device::configure, py::arg("num_ipus"), py::arg("memory_per_ipu"));
  m.def("set_log_level", &setLogLevel);
  m.def("set_float64_scalars_allowed", &device::setFloat64ScalarsAllowed,
        "Whether this thread may make 0-dim float64 ipu tensors; returns the previous setting.");
  m.def("back_storage", &backStorage,
        "Gives an ipu tensor's storage host memory (without running anything).");
  m.def("host_alias", &runtime::hostAlias,
        "A cpu tensor over the bytes of a materialised ipu tensor.");
  m.def("unaliased", &unaliased, py::arg("hosts"), py::arg("devices"),
        "Indices of the host tensors that no longer view their device copies' bytes.");

  py::class_<runtime::Program, std::shared_ptr<runtime::Program>>(
      m, "Program", "A captured, compiled graph bound to its ipu storages.")
      .def("run", &runtime::Program::run, py::arg("seed_salt") = 0,
           py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("num_nodes", &runtime::Program::numNodes)
      .def("placements", &nodePlacements,
           "(op, block, stage, phase, ipu) of each node of the compiled program.")
      .def("temporary_peaks", &runtime::Program::peakTemporaryBytes,
           "Modelled peak bytes of temporaries, per IPU.")
      .def("sequential_peaks", &runtime::Program::sequentialPeakBytes, py::arg("available_memory"),
           "Modelled peak bytes of temporaries per IPU of a run (with matmuls' working "
           "memory, bounded by the available memory proportion of each IPU).")
      .def("pipelined_peaks", &runtime::Program::pipelinedPeakBytes, py::arg("available_memory"),
           "Modelled peak bytes of temporaries per IPU of a pipelined run (with the "
           "activations of every micro-batch in flight).")
      .def(
          "phased_peaks",
          [](const runtime::Program& program, int liveness,
             const std::vector<double>& available_memory) {
            TORCH_CHECK_VALUE(liveness >= 0 && liveness <= 3, "no poptorch.Liveness has value ",
                              liveness);
            return program.phasedPeakBytes(static_cast<compiler::Liveness>(liveness),
                                           available_memory);
          },
          py::arg("liveness"), py::arg("available_memory"),
          "Modelled peak bytes per IPU of a phased run (streamed weights and activations).")
      .def(
          "ipu_of_first_use",
          [](const runtime::Program& program, const at::Tensor& tensor) {
            return program.ipuOfFirstUse(tensor.storage().unsafeGetStorageImpl());
          },
          "The IPU of the first node using the tensor's storage (-1: unused).");
  m.def(
      "account_on",
      [](const at::Tensor& tensor, int ipu, bool streamed) {
        device::accountOn(*tensor.storage().unsafeGetStorageImpl(), ipu, streamed);
      },
      py::arg("tensor"), py::arg("ipu"), py::arg("streamed") = false,
      "Counts the tensor's storage in the memory of ipu `ipu`, or in the streaming memory "
      "attached to it (its device is unchanged).");
  m.def(
      "serialize_matmul",
      [](const at::Tensor& result, int split, int factor) {
        TORCH_CHECK_VALUE(split >= 0 && split <= 3 && factor >= 1, "invalid matmul split");
        capture::PendingGraph& graph = capture::PendingGraph::get();
        auto lock = graph.lock();
        return graph.planMatMul(result, [&](ir::MatMulPlan& plan) {
          plan.split = static_cast<ir::MatMulPlan::Split>(split);
          plan.factor = factor;
        });
      },
      py::arg("result"), py::arg("split"), py::arg("factor"),
      "The pending matmul that made `result` is computed in `factor` parts along `split` "
      "(poptorch.serializedMatMul); False if no pending matmul made it.");
  m.def(
      "set_matmul_available_memory",
      [](const at::Tensor& result, double proportion) {
        TORCH_CHECK_VALUE(proportion >= 0 && proportion <= 1, "invalid proportion");
        capture::PendingGraph& graph = capture::PendingGraph::get();
        auto lock = graph.lock();
        return graph.planMatMul(result, [&](ir::MatMulPlan& plan) {
          // Above 0: ir::MatMulPlan's unset values are not (0 bounds as this does).
          plan.available_memory =
              std::max(static_cast<float>(proportion), std::numeric_limits<float>::denorm_min());
        });
      },
      py::arg("result"), py::arg("proportion"),
      "The pending matmul that made `result` keeps its temporaries within `proportion` of "
      "its IPU's memory (poptorch.set_available_memory); False if no pending matmul made it.");
  m.def("streaming_memory_allocated", &device::streamingMemoryAllocated, py::arg("ipu"),
        "Bytes in the streaming memory attached to ipu `ipu` (phased execution's weights).");
  m.def("defer_capacity_check", &device::deferCapacityCheck, py::arg("deferred"),
        "Whether this thread's ipu allocations may exceed an IPU's capacity; returns the "
        "previous setting.");
  m.def("begin_placements", &capture::beginPlacements,
        "Records the block of each op this thread captures (a multi-IPU model's step).");
  m.def(
      "set_block",
      [](int32_t block, int32_t stage, int32_t phase, int32_t ipu) {
        capture::setBlock({block, stage, phase, ipu});
      },
      py::arg("block"), py::arg("stage"), py::arg("phase"), py::arg("ipu"),
      "This thread's next forward ops belong to this block.");
  m.def("end_forward", &capture::endForward, "The forward of the captured step has ended.");
  m.def("end_placements", &capture::endPlacements);
  m.def("begin_recompute", &capture::beginRecompute,
        "This thread recomputes a checkpointed part of the forward: ops take set_block's block.");
  m.def("end_recompute", &capture::endRecompute);
  m.def("forward_block_use", &forwardBlockUse,
        "(block, nodes, first op) of the forward captured since begin_placements.");
  m.def("discard_pending_graph", [] {
    auto lock = capture::PendingGraph::get().lock();
    capture::PendingGraph::get().discard();
  });
  m.def("evaluating_for_host_read", &capture::evaluatingForHostRead,
        "True while the pending graph runs on the side to answer a host read.");
  m.def("begin_step_capture", &capture::PendingGraph::beginStepCapture,
        "Ops of this thread are captured into a step of their own, run as a whole.");
  m.def("capturing_step", &capture::PendingGraph::capturingStep,
        "True while this thread captures the step of a trainingModel/inferenceModel.");
  m.def("end_step_capture", &capture::PendingGraph::endStepCapture,
        "Ends the step capture of this thread, discarding what was not prepared.");
  py::class_<StepWarnings>(m, "StepWarnings",
                           "The kernel warnings of a captured step, given again at each call.")
      .def("__len__", [](const StepWarnings& w) { return w.warnings.size(); })
      .def("give", &StepWarnings::give, "Gives them as Python warnings.");
  m.def("take_step_warnings", &takeStepWarnings,
        "The kernel warnings given while this thread captured its step, since the last take.");
  m.def("prepare_program", &prepareProgram,
        "Takes the pending graph as a Program without running it (maybe empty).");
  py::class_<runtime::StepVariants, std::shared_ptr<runtime::StepVariants>>(
      m, "StepVariants",
      "A micro-step as programs specialised on the values the host read while capturing it.")
      .def(py::init(&makeStepVariants), py::arg("first"), py::arg("capture"))
      .def("__len__", &runtime::StepVariants::size)
      .def(
          "writes",
          [](const runtime::StepVariants& step, const at::Tensor& tensor) {
            return step.writes(tensor.storage().unsafeGetStorageImpl());
          },
          "True if a variant writes the storage of `tensor` in place.");
  py::class_<runtime::UpdateVariants, std::shared_ptr<runtime::UpdateVariants>>(
      m, "UpdateVariants",
      "The optimiser update after an iteration, per set of micro-step variants that ran in it: "
      "`choose(ran)` returns the program for the variants `ran` (capture indices).")
      .def(py::init(&makeUpdateVariants), py::arg("first"), py::arg("choose"),
           py::arg("choose_every_time"));
  py::class_<compiler::ExecutableSet, std::shared_ptr<compiler::ExecutableSet>>(
      m, "ExecutableSet",
      "The executables of a wrapped model: loaded from a precompiled file, and used by its "
      "captures (what compileAndExport writes).")
      .def(py::init<>())
      .def(
          "add", [](compiler::ExecutableSet& set, const py::bytes& entry) { set.add(entry); },
          "Adds an entry (bytes); raises if it is not an entry of this build.")
      .def(
          "entries",
          [](const compiler::ExecutableSet& set) {
            py::list entries;
            for (const std::string& entry : set.entries()) entries.append(py::bytes(entry));
            return entries;
          },
          "Every executable of the set, as entry bytes.")
      .def("__len__", &compiler::ExecutableSet::size);
  py::class_<PyLookupScope>(m, "LookupScope",
                            "While active, this thread's graphs also find executables in `set` "
                            "and record there those they use; `directory` replaces "
                            "POPTORCH_CACHE_DIR ('' for no disk cache, None to keep it).")
      .def(py::init<std::shared_ptr<compiler::ExecutableSet>, std::optional<std::string>>(),
           py::arg("set"), py::arg("directory"))
      .def("__enter__", &PyLookupScope::enter)
      .def("__exit__", &PyLookupScope::exit);
  m.def("build_identity", &compiler::buildIdentity,
        "The executable format, torch's version and this build: what entries must match.");
  m.def("run_steps", &runSteps, py::arg("micro_step"), py::arg("update"), py::arg("device_inputs"),
        py::arg("host_inputs"), py::arg("device_outputs"), py::arg("iterations"),
        py::arg("accumulation"), py::arg("replicas"), py::arg("output_mode"),
        py::arg("return_period"), py::arg("seed"),
        py::arg("output_gathers") = std::vector<std::pair<int, int64_t>>{},
        py::arg("replica_buffers") = nullptr, py::arg("before_update") = std::function<void()>{},
        py::arg("timeline") = nullptr, py::arg("stages") = 0,
        py::call_guard<py::gil_scoped_release>());
  py::class_<capture::GraphReplay, std::shared_ptr<capture::GraphReplay>>(
      m, "GraphReplay",
      "A graph of torch.compile(backend='ipu'), captured once per input layout and replayed.")
      .def(py::init<bool>(), py::arg("joins_step") = false)
      .def_static("capture_inputs", &capture::GraphReplay::captureInputs,
                  py::call_guard<py::gil_scoped_release>())
      .def("add", &capture::GraphReplay::add, py::arg("program"), py::arg("inputs"),
           py::arg("outputs"))
      .def("run", &capture::GraphReplay::run, py::call_guard<py::gil_scoped_release>())
      .def("__len__", &capture::GraphReplay::size);
  m.def(
      "count_dynamo_graph", [](bool recompile) { Metrics::get().dynamoGraph(recompile); },
      py::arg("recompile"));
  py::class_<runtime::StepTimeline, std::shared_ptr<runtime::StepTimeline>>(
      m, "StepTimeline", "When each micro-batch of a call moved its data and ran (ns).")
      .def(py::init<>())
      .def_readonly("input", &runtime::StepTimeline::input)
      .def_readonly("input_complete", &runtime::StepTimeline::input_complete)
      .def_readonly("launch", &runtime::StepTimeline::launch)
      .def_readonly("launch_complete", &runtime::StepTimeline::launch_complete)
      .def_readonly("output", &runtime::StepTimeline::output)
      .def_readonly("output_complete", &runtime::StepTimeline::output_complete);
  bindProfiling(m);
  py::class_<runtime::ReplicaBuffers, std::shared_ptr<runtime::ReplicaBuffers>>(
      m, "ReplicaBuffers", "Each replica's own values of the buffers a step updates.")
      .def(py::init<std::vector<at::Tensor>, int64_t>(), py::arg("buffers"), py::arg("replicas"))
      .def("reset", &runtime::ReplicaBuffers::reset,
           "Every replica takes the buffers' current values.");
  setSourceLocationProvider(&pythonSourceLocation);
  m.def(
      "set_fake_cpu_inference",
      [](const std::vector<std::string>& op_names, py::handle fake, py::handle run) {
        capture::setFakeCpuInference(op_names, fakeCpuRunner(fake, run));
      },
      "Ops (\"aten::add.out\") whose results capture infers on fake CPU tensors, with "
      "poptorch._fake_cpu's fake() and run().");
}
