// poptorch._C's lazy capture: the pending graph, the step captures of wrapped
// models, where their ops run (blocks, matmul plans), and torch.compile's
// graph replays.
#include <Python.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "capture/capture.h"
#include "capture/graph_replay.h"
#include "capture/pending_graph.h"
#include "capture/placement.h"
#include "capture/step_capture.h"
#include "common/source_location.h"
#include "python/bindings.h"
#include "runtime/program.h"

namespace py = pybind11;

namespace poptorch::python {
namespace {

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

}  // namespace

void bindCapture(py::module& m) {
  setSourceLocationProvider(&pythonSourceLocation);
  m.def("synchronize", &capture::synchronize, py::call_guard<py::gil_scoped_release>(),
        "Runs every pending ipu operation.");
  m.def("pending_graph", &pendingGraph, "The pending graph, as text.");
  m.def("pending_nodes", &pendingNodes);
  m.def("discard_pending_graph", [] {
    auto lock = capture::PendingGraph::get().lock();
    capture::PendingGraph::get().discard();
  });
  m.def("prepare_program", &prepareProgram,
        "Takes the pending graph as a Program without running it (maybe empty).");
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
}

}  // namespace poptorch::python
