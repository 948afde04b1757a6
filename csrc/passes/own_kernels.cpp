#include <algorithm>
#include <string>
#include <vector>

#include "passes/passes.h"

namespace poptorch::passes {
namespace {

// An aten op (its overload "") and poptorch's kernel for it (csrc/kernels), an
// op with the same arguments and results.
struct OwnKernel {
  std::string aten;
  c10::OperatorHandle own;
};

const std::vector<OwnKernel>& ownKernels() {
  static const std::vector<OwnKernel> kernels = [] {
    std::vector<OwnKernel> table;
    for (const char* name :
         {"tanh", "max_pool2d_with_indices", "max_pool2d_with_indices_backward", "_safe_softmax"}) {
      table.push_back({std::string("aten::") + name,
                       c10::Dispatcher::singleton().findSchemaOrThrow(
                           (std::string("poptorch::") + name).c_str(), "")});
    }
    return table;
  }();
  return kernels;
}

}  // namespace

ir::Graph useOwnKernels(ir::Graph graph) {
  const std::vector<OwnKernel>& kernels = ownKernels();
  for (ir::Node& node : graph.nodes) {
    const c10::OperatorName& name = node.op.operator_name();
    // Their fast paths are float32 only; other dtypes stay aten's.
    if (!name.overload_name.empty() || node.guard != ir::Guard::kNone || node.inputs.empty() ||
        node.inputs[0].dtype != c10::ScalarType::Float) {
      continue;
    }
    const auto kernel = std::find_if(kernels.begin(), kernels.end(),
                                     [&](const OwnKernel& k) { return k.aten == name.name; });
    if (kernel != kernels.end()) node.op = kernel->own;
  }
  return graph;
}

}  // namespace poptorch::passes
