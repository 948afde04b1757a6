#include <algorithm>
#include <string>
#include <vector>

#include "kernels/own_kernels.h"
#include "passes/passes.h"

namespace poptorch::passes {
namespace {

// An aten op (its overload "") and poptorch's kernel for it (csrc/kernels), an
// op with the same arguments and results.
struct OwnKernelFor {
  std::string aten;
  c10::OperatorHandle own;
};

const std::vector<OwnKernelFor>& ownKernels() {
  static const std::vector<OwnKernelFor> substitutes = [] {
    std::vector<OwnKernelFor> table;
    for (const kernels::OwnKernel& kernel : kernels::kOwnKernels) {
      if (kernel.stands_for.empty()) continue;
      const std::string own = "poptorch::" + std::string(kernel.name);
      table.push_back({"aten::" + std::string(kernel.stands_for),
                       c10::Dispatcher::singleton().findSchemaOrThrow(own.c_str(), "")});
    }
    return table;
  }();
  return substitutes;
}

}  // namespace

ir::Graph useOwnKernels(ir::Graph graph) {
  const std::vector<OwnKernelFor>& substitutes = ownKernels();
  for (ir::Node& node : graph.nodes) {
    const c10::OperatorName& name = node.op.operator_name();
    // Their fast paths are float32 only; other dtypes stay aten's.
    if (!name.overload_name.empty() || node.guard != ir::Guard::kNone || node.inputs.empty() ||
        node.inputs[0].dtype != c10::ScalarType::Float) {
      continue;
    }
    const auto kernel = std::find_if(substitutes.begin(), substitutes.end(),
                                     [&](const OwnKernelFor& k) { return k.aten == name.name; });
    if (kernel != substitutes.end()) node.op = kernel->own;
  }
  return graph;
}

}  // namespace poptorch::passes
