// Executables as bytes, for the disk cache and precompiled files. An
// executable becomes a tree of IValues (operators by name and overload,
// TensorRefs as tuples, constants as they are) pickled with PyTorch's own
// machinery (torch::jit::pickle_save: a zip archive that torch.load reads too).
//
// What varies from one run of an executable to the next (runtime arguments,
// seeds, the deterministic-algorithms setting of each call, values observed
// while capturing, where guards read their values, each node's name scope for
// profiles) is read from the graph as captured and is not part of an entry:
// Executable::program keeps placeholders for it when decoded.
#pragma once

#include <memory>
#include <string>

#include "compiler/executable.h"

namespace poptorch::compiler {

// The entry format, torch's version and this build of poptorch (its build
// id): an entry is used only by the build that wrote it.
const std::string& buildIdentity();

// The structure of a captured graph as bytes: everything its structural hash
// covers, and more. Graphs with equal structures run the same executable.
// Throws NotSerializable for a graph with a constant that has no encoding.
std::string structureOf(const ir::Graph& graph);

struct NotSerializable : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// An executable with the structure of the graph it was compiled from.
struct Entry {
  std::shared_ptr<const Executable> executable;
  std::string structure;
};

// The bytes of an entry. Throws NotSerializable as structureOf does.
std::string encodeEntry(const Entry& entry);
// The entry in `bytes`. Throws c10::Error saying what is wrong when they do
// not hold an entry of this build: another version, or a truncated or
// damaged file. Everything is checked, so that a decoded executable never
// indexes out of its buffers or nodes.
Entry decodeEntry(const std::string& bytes);
// Throws c10::Error unless a decoded `exe` can run with the buffers and
// runtime arguments of `captured` (a graph whose structure is the entry's).
void checkFits(const Executable& exe, const ir::Graph& captured);

// The trees of an executable (for the unit tests).
c10::IValue executableToIValue(const Executable& exe);
// Throws c10::Error when `tree` is not a valid executable.
std::shared_ptr<const Executable> executableFromIValue(const c10::IValue& tree);

}  // namespace poptorch::compiler
