// Runs compiled executables on the host, the emulated IPU: each node calls the
// operator's CPU kernel on CPU tensors that alias the ipu buffers' bytes.
#pragma once

#include <ATen/core/Tensor.h>

#include <exception>
#include <memory>
#include <vector>

#include "compiler/executable.h"

namespace poptorch::runtime {

// What a run does when a node fails (its kernel raises, or it reads a
// buffer an earlier failure left without a value).
enum class OnError {
  // The nodes that depend on it compute nothing either; the others run. For
  // lazy graphs: their errors surface where a tensor is read.
  kPoisonDependents,
  // No later node runs, as on the CPU, where the error stops the program: for
  // runs whose error is raised to the caller at once.
  kStop,
};

// Runs `exe` with the runtime arguments of `captured` (a graph with the same
// structural hash as the one compiled). `storages[b]` is the materialised ipu
// storage behind external buffer b (null for the others). The ipu storages
// that failed nodes would write are poisoned with their error
// (device::poison); those the run computes whole again are cured. Returns the
// first error, or null. A GuardFailure propagates, and then nothing is poisoned.
// The nodes of each range of `two_thread_ranges` (ranges of the segments of
// exe.dependencies, in order; null: none) run on two threads, independent
// nodes at the same time (see runtime/inter_op.h), the others in program
// order: the caller vouches that no node of those ranges needs to run alone
// (nodes with host effects, random ops drawing from the default generator, a
// deterministic-algorithms setting other than the current one). With kStop,
// nodes independent of the failing one may then have run although they come
// after it in program order.
using Ranges = std::vector<compiler::NodeDependencies::Segment>;
std::exception_ptr execute(const compiler::Executable& exe, const ir::Graph& captured,
                           const std::vector<c10::StorageImpl*>& storages, uint64_t seed_salt,
                           OnError on_error, const Ranges* two_thread_ranges);

// One run of `exe` made in parts, each a range of its nodes in program order
// (a pipeline's stages), possibly each on another thread but never two at
// once. Stops at the first node that fails, as OnError::kStop. The caller
// keeps `captured` and the storages alive while it lives.
class StagedRun {
 public:
  StagedRun(const compiler::Executable& exe, const ir::Graph& captured,
            const std::vector<c10::StorageImpl*>& storages, uint64_t seed_salt);
  ~StagedRun();
  StagedRun(StagedRun&&) noexcept;
  StagedRun& operator=(StagedRun&&) noexcept;

  // Runs nodes [begin, end); returns false when one failed (or an earlier
  // part did): the run's later parts must not run.
  bool runNodes(size_t begin, size_t end);
  // After the last part, or a failed one: poisons the storages the run could
  // not compute (see execute) and returns its first error.
  std::exception_ptr finish();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

// A CPU storage over the bytes of a materialised ipu storage; it keeps the ipu
// storage alive while it exists.
c10::Storage hostStorageOf(c10::StorageImpl& ipu_storage);
// A CPU tensor with the sizes, strides and offset of `ipu_tensor`, aliasing its
// (materialised) bytes: how the host reads an ipu tensor, so a poisoned one
// raises its error here.
at::Tensor hostAlias(const at::Tensor& ipu_tensor);
// The bytes of a materialised ipu storage, as a 1-D uint8 CPU tensor aliasing them.
at::Tensor hostBytes(c10::StorageImpl& ipu_storage);

}  // namespace poptorch::runtime
