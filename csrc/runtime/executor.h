// Runs compiled executables on the host, the emulated IPU: each node calls the
// operator's CPU kernel on CPU tensors that alias the ipu buffers' bytes.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "compiler/executable.h"

namespace poptorch::runtime {

// Runs `exe` with the runtime arguments of `captured` (a graph with the same
// structural hash as the one compiled). `storages[b]` is the materialised ipu
// storage behind external buffer b (null for the others).
void execute(const compiler::Executable& exe, const ir::Graph& captured,
             const std::vector<c10::StorageImpl*>& storages, uint64_t seed_salt = 0);

// A CPU storage over the bytes of a materialised ipu storage; it keeps the ipu
// storage alive while it exists.
c10::Storage hostStorageOf(c10::StorageImpl& ipu_storage);
// A CPU tensor with the sizes, strides and offset of `ipu_tensor`, aliasing its
// (materialised) bytes.
at::Tensor hostAlias(const at::Tensor& ipu_tensor);
// The bytes of a materialised ipu storage, as a 1-D uint8 CPU tensor aliasing them.
at::Tensor hostBytes(c10::StorageImpl& ipu_storage);

}  // namespace poptorch::runtime
