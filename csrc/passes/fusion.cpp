#include <string_view>

#include "passes/passes.h"

namespace poptorch::passes {
namespace {

bool is(const ir::Node& node, std::string_view name) {
  const c10::OperatorName& op = node.op.operator_name();
  return op.name == name && op.overload_name.empty();
}

}  // namespace

ir::Graph fuseMatmulActivations(ir::Graph graph) {
  // Per buffer: the one node that reads it (-1: none yet, -2: several), and
  // whether any node writes it in place.
  std::vector<int32_t> reader(graph.buffers.size(), -1);
  std::vector<bool> written(graph.buffers.size(), false);
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const auto index = static_cast<int32_t>(i);
    for (const ir::TensorRef& in : graph.nodes[i].inputs) {
      int32_t& r = reader[in.buffer];
      r = (r == -1 || r == index) ? index : -2;
    }
    for (ir::BufferId w : graph.nodes[i].writes) written[w] = true;
  }

  static const c10::OperatorHandle addmm_activation =
      c10::Dispatcher::singleton().findSchemaOrThrow("aten::_addmm_activation", "");
  std::vector<bool> keep(graph.nodes.size(), true);
  for (ir::Node& node : graph.nodes) {
    if (!is(node, "aten::addmm") || node.outputs.size() != 1) continue;
    const ir::TensorRef& product = node.outputs[0];
    const ir::BufferInfo& product_buffer = graph.buffers[product.buffer];
    const int32_t r = reader[product.buffer];
    if (product_buffer.existed_before || product_buffer.live_after || written[product.buffer] ||
        r < 0 || !product.coversWhole(product_buffer.nbytes)) {
      continue;
    }
    const ir::Node& relu = graph.nodes[r];
    if (!is(relu, "aten::relu") || relu.outputs.size() != 1 ||
        !relu.inputs[0].coversWhole(product_buffer.nbytes)) {
      continue;
    }
    const ir::TensorRef& activated = relu.outputs[0];
    if (activated.dtype != product.dtype ||
        !activated.coversWhole(graph.buffers[activated.buffer].nbytes)) {
      continue;
    }
    // The relu's result, shaped as the product: readers keep their own views.
    ir::TensorRef result = product;
    result.buffer = activated.buffer;
    ir::Node fused(addmm_activation);
    fused.args = node.args;  // self, mat1, mat2, beta, alpha: the addmm's, in place
    fused.args.push_back(ir::Arg::constant(false));  // use_gelu
    fused.inputs = node.inputs;
    fused.outputs = {result};
    fused.fresh_returns = {true};
    fused.source_index = node.source_index;
    fused.placement = node.placement;
    node = std::move(fused);
    keep[r] = false;  // the relu, now part of the fused node
  }

  graph.keepNodes(keep);
  return graph;
}

}  // namespace poptorch::passes
