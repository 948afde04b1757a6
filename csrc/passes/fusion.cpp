#include <algorithm>
#include <optional>
#include <string_view>
#include <vector>

#include "passes/passes.h"
#include "passes/sole_readers.h"

namespace poptorch::passes {
namespace {

bool is(const ir::Node& node, std::string_view name, std::string_view overload = "") {
  const c10::OperatorName& op = node.op.operator_name();
  return op.name == name && op.overload_name == overload;
}

bool writesAny(const ir::Node& node, c10::ArrayRef<ir::TensorRef> refs) {
  return std::any_of(refs.begin(), refs.end(),
                     [&](const ir::TensorRef& ref) { return node.writesInPlace(ref.buffer); });
}

// The tensor argument `a` of `node`, or null if it is not one.
const ir::TensorRef* tensorArg(const ir::Node& node, size_t a) {
  if (a >= node.args.size() || node.args[a].kind != ir::ArgKind::kTensor) return nullptr;
  return &node.inputs[node.args[a].refs[0]];
}

// The addmm that replaces `mm` (of `product`) and the add_ of `bias` after it,
// if `add` is such an add_: product + alpha * bias = addmm(bias, mat1, mat2,
// beta=alpha, alpha=1), with add_'s alpha read from the captured add_.
std::optional<ir::Node> biasedProduct(const ir::Node& mm, const ir::Node& add,
                                      const ir::TensorRef& product, int64_t nbytes) {
  const ir::TensorRef* self = tensorArg(add, 0);
  const ir::TensorRef* bias = tensorArg(add, 1);
  if (!is(add, "aten::add_", "Tensor") || add.guard != ir::Guard::kNone || add.args.size() != 3 ||
      !add.sameStateOfCall(mm) || self == nullptr || bias == nullptr ||
      add.args[2].kind != ir::ArgKind::kRuntime ||
      add.writes != ir::BufferIds{product.buffer} || self->buffer != product.buffer ||
      !self->coversWhole(nbytes) || self->sizes.empty() || self->sizes.back() != product.sizes[1] ||
      bias->buffer == product.buffer || bias->dtype != product.dtype || bias->sizes.size() != 1 ||
      bias->sizes[0] != product.sizes[1]) {
    return std::nullopt;
  }
  static const c10::OperatorHandle addmm =
      c10::Dispatcher::singleton().findSchemaOrThrow("aten::addmm", "");
  ir::Node fused(addmm);
  fused.inputs = {*bias, mm.inputs[mm.args[0].refs[0]], mm.inputs[mm.args[1].refs[0]]};
  ir::Arg beta = add.args[2];
  beta.refs = {add.source_index, 2};
  fused.args = {ir::Arg::tensor(0), ir::Arg::tensor(1), ir::Arg::tensor(2), std::move(beta),
                ir::Arg::constant(int64_t{1})};
  fused.outputs = {product};
  fused.fresh_returns = {true};
  fused.source_index = mm.source_index;
  fused.placement = mm.placement;
  return fused;
}

// What _addmm_activation's use_gelu is for `node`'s activation: false for a
// relu, true for an exact (erf) gelu, which the CPU's _addmm_activation applies
// with gelu_ on the product; none for other nodes.
std::optional<bool> activationOf(const ir::Node& node) {
  if (is(node, "aten::relu")) return false;
  if (is(node, "aten::gelu") && node.args.size() == 2 &&
      node.args[1].kind == ir::ArgKind::kConstant && node.args[1].value.isString() &&
      node.args[1].value.toStringRef() == "none") {
    return true;
  }
  return std::nullopt;
}

}  // namespace

ir::Graph fuseMatmulBias(ir::Graph graph) {
  std::vector<bool> keep(graph.nodes.size(), true);
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const ir::Node& mm = graph.nodes[i];
    if (!is(mm, "aten::mm") || mm.guard != ir::Guard::kNone || mm.outputs.size() != 1 ||
        mm.args.size() != 2 || mm.args[0].kind != ir::ArgKind::kTensor ||
        mm.args[1].kind != ir::ArgKind::kTensor) {
      continue;
    }
    const ir::TensorRef& product = mm.outputs[0];
    const int64_t nbytes = graph.buffers[product.buffer].nbytes;
    if (product.sizes.size() != 2 || !product.coversWhole(nbytes)) continue;
    // The CPU rounds the product to its dtype before adding the bias, addmm
    // once: for float32 within the product's own rounding, for 16-bit floats
    // an ulp of the result, amplified where the bias cancels the product.
    if (product.dtype != c10::ScalarType::Float) continue;
    // The next node that touches the product; the fused node runs there, so
    // the nodes before it must leave the matrices alone.
    size_t j = i + 1;
    while (j < graph.nodes.size() && !graph.nodes[j].touches(product.buffer) &&
           !writesAny(graph.nodes[j], mm.inputs)) {
      ++j;
    }
    if (j == graph.nodes.size()) continue;
    std::optional<ir::Node> fused = biasedProduct(mm, graph.nodes[j], product, nbytes);
    if (!fused) continue;
    graph.nodes[j] = std::move(*fused);
    keep[i] = false;
  }
  graph.keepNodes(keep);
  return graph;
}

ir::Graph fuseMatmulActivations(ir::Graph graph) {
  const SoleReaders readers(graph);

  static const c10::OperatorHandle addmm_activation =
      c10::Dispatcher::singleton().findSchemaOrThrow("aten::_addmm_activation", "");
  std::vector<bool> keep(graph.nodes.size(), true);
  for (ir::Node& node : graph.nodes) {
    if (!is(node, "aten::addmm") || node.outputs.size() != 1) continue;
    const ir::TensorRef& product = node.outputs[0];
    const ir::BufferInfo& product_buffer = graph.buffers[product.buffer];
    const int32_t r = readers.soleReader(product.buffer);
    if (product_buffer.existed_before || product_buffer.live_after ||
        readers.written(product.buffer) || r < 0 || !product.coversWhole(product_buffer.nbytes)) {
      continue;
    }
    const ir::Node& activation = graph.nodes[r];
    const std::optional<bool> gelu = activationOf(activation);
    // The fused kernel computes in the product's state of the call.
    if (!gelu || activation.outputs.size() != 1 || !activation.sameStateOfCall(node) ||
        !activation.inputs[0].coversWhole(product_buffer.nbytes)) {
      continue;
    }
    const ir::TensorRef& activated = activation.outputs[0];
    if (activated.dtype != product.dtype ||
        !activated.coversWhole(graph.buffers[activated.buffer].nbytes)) {
      continue;
    }
    // The activation's result, shaped as the product: readers keep their own views.
    ir::TensorRef result = product;
    result.buffer = activated.buffer;
    ir::Node fused(addmm_activation);
    fused.args = node.args;  // self, mat1, mat2, beta, alpha: the addmm's, in place
    fused.args.push_back(ir::Arg::constant(*gelu));  // use_gelu
    fused.inputs = node.inputs;
    fused.outputs = {result};
    fused.fresh_returns = {true};
    fused.source_index = node.source_index;
    fused.placement = node.placement;
    fused.matmul = node.matmul;
    node = std::move(fused);
    keep[r] = false;  // the activation, now part of the fused node
  }

  graph.keepNodes(keep);
  return graph;
}

}  // namespace poptorch::passes
