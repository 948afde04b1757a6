// Host reads while a step is captured whole for trainingModel/inferenceModel.
// The step is not run while it is captured, so a value the host reads
// (`.item()`, `.cpu()`, printing, an op whose output shape depends on the data)
// is computed on the side from the pending graph, without its side effects,
// and the step is specialised on it: a guard node checks on every run that
// the value recurs (runtime::StepVariants captures another variant when not).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace poptorch::capture {

// True while a step is captured whole.
bool capturingStep();

// True while this thread runs the pending graph on the side to answer a host
// read (PendingGraph::evaluate): ops with host effects (printing) compute their
// results then without acting, as the step has not run yet.
bool evaluatingForHostRead();

// Marks this thread as evaluating for a host read while it lives.
class HostReadEvaluation {
 public:
  HostReadEvaluation();
  ~HostReadEvaluation();
  HostReadEvaluation(const HostReadEvaluation&) = delete;
  HostReadEvaluation& operator=(const HostReadEvaluation&) = delete;

 private:
  bool outer_;
};

// The value of `tensor` (an ipu tensor) as a contiguous CPU tensor, and a
// guard that it recurs. The caller holds PendingGraph's lock.
at::Tensor readForHost(const at::Tensor& tensor);

// Captures `op`, whose results cannot be inferred before it runs, by running
// it on the host on the values its arguments will have; its result shapes
// (and non-tensor results) are guarded.
void captureObservingResults(const c10::OperatorHandle& op, torch::jit::Stack* stack);

}  // namespace poptorch::capture
