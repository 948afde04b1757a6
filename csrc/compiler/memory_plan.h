// Where and when a compiled program's temporaries live.
#pragma once

#include <cstdint>
#include <vector>

#include "compiler/executable.h"

namespace poptorch::compiler {

// Fills exe.release_after, exe.peak_temporary_bytes, exe.arena_offset and
// exe.arena_bytes from exe.program and exe.roles: each temporary is freed
// after its last use, and gets a place in the run's arena that no temporary
// alive at the same time shares.
void planMemory(Executable& exe);

// [node][ipu]: the bytes of temporaries alive while each node of a planned
// executable runs (a temporary from its first use to its last), per ipu index.
std::vector<std::vector<int64_t>> temporaryBytesByNode(const Executable& exe);

}  // namespace poptorch::compiler
