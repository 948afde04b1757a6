// Capturing ATen operator calls on ipu tensors into the pending graph.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/util/SmallVector.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "capture/device_queue.h"
#include "capture/meta_inference.h"
#include "capture/op_traits.h"
#include "ir/graph.h"

namespace poptorch::capture {

// The IPU key's boxed fallback: every operator without an explicit ipu kernel
// comes here. It captures the call, or runs it on the host when its output
// shape cannot be known before it runs.
void ipuFallback(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack);

// "aten::name.overload", as errors and logs name an op.
std::string opName(const c10::OperatorHandle& op);

// Quantized tensors cannot live on the ipu: refuses `op` saying what to do.
[[noreturn]] void refuseQuantized(const std::string& op);

// Ipu tensors are strided only: refuses (with what to do instead) the ops
// that make sparse tensors, or nested tensors of the strided layout, from
// ipu tensors (layouts.cpp; the sparse and nested ipu keys refuse the rest).
void checkResultIsStrided(const c10::OperatorHandle& op);

// An op's results as capture returns them, one per schema return: inline
// for the common op, as capture makes them at every call.
using CapturedResults = c10::SmallVector<c10::IValue, 3>;

// Records `op` on the stack's arguments as a node of the pending graph and
// replaces them with its (lazy) results. Returns false, leaving the stack
// alone, when the op's Meta kernel cannot infer its outputs. Tensors must all be
// on one ipu unless `allow_several_ipus` (copies between IPUs).
bool captureOp(const c10::OperatorHandle& op, torch::jit::Stack* stack,
               bool allow_several_ipus = false);

// The index of the argument that return `return_index` of `schema` is (an
// in-place op's self, an out= argument).
size_t writtenArgumentIndex(const c10::FunctionSchema& schema, size_t return_index);

// Captures `op` on `arguments` without changing them (an unboxed kernel's,
// borrowed: see unboxed.h) and returns its results. Returns nullopt, having
// recorded nothing, when the op must take the boxed path (ipuFallback): while
// a step is captured whole and for Tensor?[] arguments (preparing them
// replaces some), for ops never captured, and when the Meta kernel cannot
// infer the results. Returns that are written arguments are None there (see
// writtenArgumentIndex).
std::optional<CapturedResults> captureBorrowed(const c10::OperatorHandle& op,
                                               c10::ArrayRef<c10::IValue> arguments,
                                               bool allow_several_ipus = false);

// An operator an unboxed kernel captures (unboxed.h), looked up once: its
// handle, its traits, and whether it is capturable at all (it has a CPU kernel
// and a Meta kernel, and its output shape never depends on the data), which
// no later registration changes for the ATen operators that get such kernels.
struct UnboxedOp {
  UnboxedOp(const char* name, const char* overload);
  c10::OperatorHandle op;
  std::unique_ptr<OpTraits> traits;
  bool capturable;
};

// captureBorrowed for an unboxed kernel's operator.
std::optional<CapturedResults> captureBorrowed(const UnboxedOp& unboxed,
                                               c10::ArrayRef<c10::IValue> arguments);

// The ipu device `op` runs on (a factory: the one it asks for). Host tensors
// in its index lists are uploaded there, on the stack.
c10::Device prepareArguments(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                             bool allow_several_ipus = false);

// Appends `op` on the stack's arguments to the pending graph as a node whose
// results look like `meta`, and replaces the arguments by its results.
void recordNode(const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::Device device,
                const MetaResult& meta, ir::Guard guard);

// Runs `op` at once on the host (a graph break), counted and logged once per op.
void hostFallback(const c10::OperatorHandle& op, torch::jit::Stack* stack, const char* reason);

}  // namespace poptorch::capture
