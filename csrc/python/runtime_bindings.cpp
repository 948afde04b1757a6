// poptorch._C's runtime: the programs of wrapped models and their steps (the
// variants captured for values read on the host, the update, replicas), the
// host aliases of device tensors (and those lent to a collective's threads)
// and the memory the runtime keeps.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <functional>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "python/bindings.h"
#include "runtime/arena.h"
#include "runtime/executor.h"
#include "runtime/program.h"
#include "runtime/replica_buffers.h"
#include "runtime/result_blocks.h"
#include "runtime/step_runner.h"
#include "runtime/step_variants.h"
#include "runtime/update_variants.h"

namespace py = pybind11;

namespace poptorch::python {
namespace {

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

// Host tensors lent to gloo's worker threads for a collective. A worker drops
// its references after the collective completes, possibly after the caller has
// moved on; if its drop left only the tensor's Python object, PyTorch would
// take the GIL on that thread to release it, and a thread that takes the GIL
// while the interpreter finalises is ended by unwinding through noexcept code:
// the process aborts at exit ("terminate called without an active
// exception"). Holding one more reference until only it and the Python object
// remain makes the last releases happen here, with the GIL held; what is still
// lent at exit is never released.
class LentTensors {
 public:
  static LentTensors& get() {
    static LentTensors& lent = *new LentTensors();  // never destroyed: see above
    return lent;
  }

  // Drops what was lent before and is back (the GIL held), then keeps `tensors`.
  void lend(const std::vector<at::Tensor>& tensors) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<at::Tensor> still_lent;
    for (at::Tensor& tensor : lent_) {
      if (!isBack(tensor)) still_lent.push_back(std::move(tensor));
    }
    lent_ = std::move(still_lent);
    lent_.insert(lent_.end(), tensors.begin(), tensors.end());
  }

  size_t size() {
    std::lock_guard<std::mutex> lock(mutex_);
    return lent_.size();
  }

 private:
  LentTensors() = default;

  // Only this reference and the one of the tensor's Python object, if any.
  static bool isBack(const at::Tensor& tensor) {
    const bool has_python_object =
        tensor.unsafeGetTensorImpl()->pyobj_slot()->load_pyobj() != nullptr;
    return tensor.use_count() <= (has_python_object ? 2u : 1u);
  }

  std::mutex mutex_;  // collectives may be called from several threads
  std::vector<at::Tensor> lent_;
};

py::list nodePlacements(const runtime::Program& program) {
  py::list out;
  for (const ir::Node& node : program.compiledGraph().nodes) {
    const ir::Placement& at = node.placement;
    out.append(py::make_tuple(node.name(), at.block, at.stage, at.phase, at.ipu));
  }
  return out;
}

}  // namespace

void bindRuntime(py::module& m) {
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
  m.def("run_steps", &runSteps, py::arg("micro_step"), py::arg("update"), py::arg("device_inputs"),
        py::arg("host_inputs"), py::arg("device_outputs"), py::arg("iterations"),
        py::arg("accumulation"), py::arg("replicas"), py::arg("output_mode"),
        py::arg("return_period"), py::arg("seed"),
        py::arg("output_gathers") = std::vector<std::pair<int, int64_t>>{},
        py::arg("replica_buffers") = nullptr, py::arg("before_update") = std::function<void()>{},
        py::arg("timeline") = nullptr, py::arg("stages") = 0,
        py::call_guard<py::gil_scoped_release>());
  py::class_<runtime::StepTimeline, std::shared_ptr<runtime::StepTimeline>>(
      m, "StepTimeline", "When each micro-batch of a call moved its data and ran (ns).")
      .def(py::init<>())
      .def_readonly("input", &runtime::StepTimeline::input)
      .def_readonly("input_complete", &runtime::StepTimeline::input_complete)
      .def_readonly("launch", &runtime::StepTimeline::launch)
      .def_readonly("launch_complete", &runtime::StepTimeline::launch_complete)
      .def_readonly("output", &runtime::StepTimeline::output)
      .def_readonly("output_complete", &runtime::StepTimeline::output_complete);
  py::class_<runtime::ReplicaBuffers, std::shared_ptr<runtime::ReplicaBuffers>>(
      m, "ReplicaBuffers", "Each replica's own values of the buffers a step updates.")
      .def(py::init<std::vector<at::Tensor>, int64_t>(), py::arg("buffers"), py::arg("replicas"))
      .def("reset", &runtime::ReplicaBuffers::reset,
           "Every replica takes the buffers' current values.");
  m.def("host_alias", &runtime::hostAlias,
        "A cpu tensor over the bytes of a materialised ipu tensor.");
  m.def(
      "lend_to_collective",
      [](const std::vector<at::Tensor>& tensors) { LentTensors::get().lend(tensors); },
      py::arg("tensors"),
      "Keeps host tensors handed to a collective's threads until they let them go (so that "
      "their last release takes the GIL here, never on those threads at interpreter exit).");
  m.def(
      "lent_to_collectives", [] { return LentTensors::get().size(); },
      "How many tensors lent to collectives are kept (those not yet seen back).");
  m.def("unaliased", &unaliased, py::arg("hosts"), py::arg("devices"),
        "Indices of the host tensors that no longer view their device copies' bytes.");
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
}

}  // namespace poptorch::python
