// Kernels that write into planned memory: an op's out= overload.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>

#include "compiler/executable.h"

namespace poptorch::compiler {

// The out= overload of a functional op with one Tensor result, when the op is
// structured (both forms are one CPU kernel) and the CPU has a kernel for it.
std::optional<c10::OperatorHandle> outVariantOf(const c10::OperatorHandle& op);

// Fills exe.out_variant: the nodes whose result the runtime has the kernel
// write straight into its buffer instead of copying or adopting it.
void chooseOutVariants(Executable& exe);

}  // namespace poptorch::compiler
