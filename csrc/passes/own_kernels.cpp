#include <string>
#include <utility>
#include <vector>

#include "passes/passes.h"

namespace poptorch::passes {
namespace {

// aten op (its overload "") -> poptorch's kernel for it (csrc/kernels), an op
// with the same arguments and results.
const std::vector<std::pair<std::string, c10::OperatorHandle>>& ownKernels() {
  static const auto* table = [] {
    auto* kernels = new std::vector<std::pair<std::string, c10::OperatorHandle>>();
    for (const char* name :
         {"tanh", "max_pool2d_with_indices", "max_pool2d_with_indices_backward"}) {
      kernels->emplace_back(std::string("aten::") + name,
                            c10::Dispatcher::singleton().findSchemaOrThrow(
                                (std::string("poptorch::") + name).c_str(), ""));
    }
    return kernels;
  }();
  return *table;
}

}  // namespace

ir::Graph useOwnKernels(ir::Graph graph) {
  for (ir::Node& node : graph.nodes) {
    const c10::OperatorName& name = node.op.operator_name();
    // Their fast paths are float32 only; other dtypes stay aten's.
    if (!name.overload_name.empty() || node.guard != ir::Guard::kNone || node.inputs.empty() ||
        node.inputs[0].dtype != c10::ScalarType::Float) {
      continue;
    }
    for (const auto& [aten, own] : ownKernels()) {
      if (name.name == aten) node.op = own;
    }
  }
  return graph;
}

}  // namespace poptorch::passes
