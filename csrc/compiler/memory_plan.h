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

// True for a buffer the run makes and frees (kProduced, kScratch).
bool isTemporary(const Executable& exe, ir::BufferId b);

// The IPU whose memory holds buffer `b` when `node` makes or uses it: its
// block's in a model split over IPUs, else the buffer's device.
int32_t ipuOfUse(const ir::Graph& program, const ir::Node& node, ir::BufferId b);

// Calls visit(b) for each buffer `node` reads, writes or makes.
template <typename Visit>
void forEachBuffer(const ir::Node& node, Visit&& visit) {
  for (const ir::TensorRef& in : node.inputs) visit(in.buffer);
  for (ir::BufferId w : node.writes) visit(w);
  for (const ir::TensorRef& out : node.outputs) visit(out.buffer);
}

// [node][ipu]: the bytes of temporaries alive while each node of a planned
// executable runs (a temporary from its first use to its last), per ipu index.
std::vector<std::vector<int64_t>> temporaryBytesByNode(const Executable& exe);

}  // namespace poptorch::compiler
