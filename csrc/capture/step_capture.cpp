#include "capture/step_capture.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <torch/library.h>

#include <cstring>

#include "capture/capture.h"
#include "capture/meta_inference.h"
#include "capture/pending_graph.h"
#include "common/ivalue_tensors.h"
#include "common/user_errors.h"
#include "runtime/guard_failure.h"

namespace poptorch::capture {
namespace {

std::string describeMismatch(const at::Tensor& expected, const at::Tensor& actual) {
  if (expected.numel() == 1) {
    return "a value read on the host was " + c10::str(expected.item().toDouble()) +
           " when the step was captured and is now " + c10::str(actual.item().toDouble());
  }
  return "a tensor of shape " + c10::str(expected.sizes()) +
         " read on the host differs from its value when the step was captured";
}

// The guard of a value read while capturing: bitwise equality, so that what
// the host did with the value (a branch, a shape, a constant) still holds.
void guardEqual(const at::Tensor& self, const at::Tensor& expected) {
  const at::Tensor actual = self.contiguous();
  if (actual.sizes().equals(expected.sizes()) && actual.scalar_type() == expected.scalar_type() &&
      std::memcmp(actual.const_data_ptr(), expected.const_data_ptr(), actual.nbytes()) == 0) {
    return;
  }
  throw runtime::GuardFailure(describeMismatch(expected, actual));
}

TORCH_LIBRARY_FRAGMENT(poptorch, m) { m.def("guard_equal(Tensor self, Tensor expected) -> ()"); }

TORCH_LIBRARY_IMPL(poptorch, CPU, m) { m.impl("guard_equal", TORCH_FN(guardEqual)); }

const c10::OperatorHandle& guardEqualOp() {
  static const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow("poptorch::guard_equal", "");
  return op;
}

}  // namespace

namespace {
thread_local bool evaluating_for_host_read = false;
}  // namespace

bool capturingStep() { return PendingGraph::capturingStep(); }

bool evaluatingForHostRead() { return evaluating_for_host_read; }

HostReadEvaluation::HostReadEvaluation() : outer_(evaluating_for_host_read) {
  evaluating_for_host_read = true;
}

HostReadEvaluation::~HostReadEvaluation() { evaluating_for_host_read = outer_; }

at::Tensor readForHost(const at::Tensor& tensor) {
  PendingGraph& pending = PendingGraph::get();
  at::Tensor value = pending.evaluate({tensor})[0];
  ir::Node node(guardEqualOp());
  node.guard = ir::Guard::kValue;
  node.inputs.emplace_back().assign(tensor, pending.bufferOf(tensor));
  node.args.push_back(ir::Arg::tensor(0));
  node.args.push_back(ir::Arg::runtime(value));
  pending.append(std::move(node));
  return value;
}

void captureObservingResults(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const c10::Device device = prepareArguments(op, stack);
  const c10::FunctionSchema& schema = op.schema();
  const size_t num_args = schema.arguments().size();
  const c10::ArrayRef<c10::IValue> arguments = torch::jit::last(*stack, num_args);

  std::vector<at::Tensor> ipu;
  for (const c10::IValue& value : arguments) {
    forEachTensor(value, [&](const at::Tensor& t) {
      if (t.defined() && t.is_ipu()) ipu.push_back(t);
    });
  }
  std::vector<at::Tensor> values;
  {
    auto lock = PendingGraph::get().lock();
    values = PendingGraph::get().evaluate(ipu);
  }
  size_t next = 0;
  torch::jit::Stack host_args;
  for (const c10::IValue& value : arguments) {
    host_args.push_back(mapTensors(value, [&](const at::Tensor& t) {
      return t.defined() && t.is_ipu() ? values[next++] : t;
    }));
  }
  torch::jit::Stack host_stack = host_args;
  {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &host_stack);
  }

  MetaResult meta;
  for (size_t r = 0; r < host_stack.size(); ++r) {
    const c10::AliasInfo* alias = schema.returns()[r].alias_info();
    POPTORCH_CHECK_SUPPORTED(
        alias == nullptr || alias->isWrite(), op.operator_name(),
        " returns a view, and its output shape depends on the data: it cannot be part of a "
        "step captured whole (trainingModel/inferenceModel). Compute it outside the model.");
    ReturnInfo info;
    const c10::IValue& value = host_stack[r];
    if (value.isTensor()) {
      info.tensors.push_back(layoutOf(value.toTensor()));
    } else if (value.isTensorList()) {
      info.is_list = true;
      for (const at::Tensor& t : value.toTensorList()) info.tensors.push_back(layoutOf(t));
    } else {
      info.other = value;
    }
    meta.returns.push_back(std::move(info));
  }
  meta.written.resize(num_args);
  for (size_t i = 0; i < num_args; ++i) {
    const c10::AliasInfo* alias = schema.arguments()[i].alias_info();
    if (!alias || !alias->isWrite()) continue;
    forEachTensor(host_args[i],
                  [&](const at::Tensor& t) { meta.written[i].push_back(layoutOf(t)); });
  }
  meta.warnings_at_call = true;  // the host run gave them
  recordNode(op, stack, device, meta, ir::Guard::kShape);
}

}  // namespace poptorch::capture
