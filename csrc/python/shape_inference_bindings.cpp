// poptorch._C's part in how capture infers an op's shapes: Meta kernels
// written in Python, and inference on fake CPU tensors (poptorch/_fake_cpu.py).
#include <ATen/record_function.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/utils/pybind.h>

#include <string>
#include <vector>

#include "capture/meta_inference.h"
#include "common/ivalue_tensors.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace poptorch::python {
namespace {

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

}  // namespace

void bindShapeInference(py::module& m) {
  capture::setMetaErrorFilter(&metaErrorMustPropagate);
  m.def("meta_cache_size", &capture::metaCacheSize,
        "Signatures whose Meta results this thread has cached.");
  m.def("inferring_shapes", &capture::inferringShapes,
        "True while this thread runs a Meta kernel to infer an ipu op's shapes.");
  m.def(
      "set_fake_cpu_inference",
      [](const std::vector<std::string>& op_names, py::handle fake, py::handle run) {
        capture::setFakeCpuInference(op_names, fakeCpuRunner(fake, run));
      },
      "Ops (\"aten::add.out\") whose results capture infers on fake CPU tensors, with "
      "poptorch._fake_cpu's fake() and run().");
  m.def(
      "set_before_first_inference",
      [](py::handle prepare) {
        // The module's function, which lives as long as the module does.
        capture::setBeforeFirstInference([prepare] {
          py::gil_scoped_acquire gil;
          prepare();
        });
      },
      "A function capture calls before it first infers shapes.");
}

}  // namespace poptorch::python
