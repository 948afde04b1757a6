#include <string_view>

#include "passes/passes.h"

namespace poptorch::passes {

ir::Graph useCounterBasedRandomFills(ir::Graph graph) {
  static const c10::OperatorHandle counter_based =
      c10::Dispatcher::singleton().findSchemaOrThrow("poptorch::bernoulli_", "");
  for (ir::Node& node : graph.nodes) {
    const c10::OperatorName& name = node.op.operator_name();
    if (name.name != "aten::bernoulli_" || name.overload_name != "float" || !node.seed ||
        node.generator_arg != 2 || node.inputs.size() != 1 ||
        !c10::isFloatingType(node.inputs[0].dtype)) {
      continue;
    }
    // Same arguments (self, p, generator): the runtime seeds the generator.
    node.op = counter_based;
  }
  return graph;
}

}  // namespace poptorch::passes
