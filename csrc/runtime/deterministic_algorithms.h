// torch.use_deterministic_algorithms on the ipu: each node's kernel obeys the
// setting of its call, which capture records (ir::Node::deterministic), and
// the runtime never sets PyTorch's flag: at::Context keeps one for the whole
// process, so setting it around a kernel on the runtime thread changed it for
// the user's thread (its captures, its CPU ops, its reads) meanwhile.
//
// What the flag changes in the CPU kernels (PyTorch 2.13):
// * index_put_ (both modes), put_ (accumulate=True) and index_copy_ run over
//   the indices serially, in order (the last of repeated indices wins, sums
//   add in order), where they would split them over an OpenMP team. On a
//   thread whose team has one thread they take that same serial path: a node
//   called under the flag runs its kernel so. One called without it may run
//   either way (the order is unspecified then).
// * put_ (accumulate=False) and max_unpool2d/3d raise (or warn, warn_only):
//   capture runs the CPU kernel's checks at the call, under the call's
//   setting, so the run must not alert again; when the setting at the run
//   would raise, the run refuses with an error that says what to do.
// * New memory is filled (empty, resize_): capture fills it at the call.
// * oneDNN primitives get a deterministic attribute (bf16 matmul on CPUs with
//   AVX512-BF16/AMX): not re-applied per node (this host has neither).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <optional>

#include "ir/graph.h"
#include "runtime/kernel_threads.h"

namespace poptorch::runtime {

// While it lives, `op`'s kernel for the node `source` computes as it would
// under the deterministic-algorithms setting of the node's call.
class DeterministicAlgorithmsAsCalled {
 public:
  DeterministicAlgorithmsAsCalled(const ir::Node& source, const c10::OperatorHandle& op,
                                  const torch::jit::Stack& arguments);
  DeterministicAlgorithmsAsCalled(const DeterministicAlgorithmsAsCalled&) = delete;
  DeterministicAlgorithmsAsCalled& operator=(const DeterministicAlgorithmsAsCalled&) = delete;

 private:
  std::optional<KernelThreads> serial_;
};

}  // namespace poptorch::runtime
