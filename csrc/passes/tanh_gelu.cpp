#include <algorithm>
#include <optional>
#include <string_view>
#include <vector>

#include "passes/passes.h"
#include "passes/sole_readers.h"

namespace poptorch::passes {
namespace {

bool is(const ir::Node& node, std::string_view name, std::string_view overload) {
  const c10::OperatorName& op = node.op.operator_name();
  return op.name == name && op.overload_name == overload;
}

// The chain's nodes (see fuseTanhGelu), found from its tanh.
struct Chain {
  int32_t scale, power, times_kappa, inner, times_beta, tanh, plus_one, product;
};

class ChainFinder {
 public:
  explicit ChainFinder(const ir::Graph& graph)
      : graph_(graph), readers_(graph), producer_(graph.buffers.size(), -1) {
    for (size_t i = 0; i < graph.nodes.size(); ++i) {
      for (const ir::TensorRef& out : graph.nodes[i].outputs) {
        producer_[out.buffer] = static_cast<int32_t>(i);
      }
    }
  }

  std::optional<Chain> from(int32_t tanh) const {
    Chain c{};
    c.tanh = tanh;
    const ir::Node& t = node(tanh);
    if (!is(t, "aten::tanh", "") || t.inputs.size() != 1 || !plain(t)) return std::nullopt;
    // Backwards from the tanh: (x + x ** e * kappa) * beta.
    c.times_beta = producerOf(t.inputs[0], tanh);
    if (c.times_beta < 0 || !scalarOp(c.times_beta, "aten::mul", "Tensor", 2)) return std::nullopt;
    c.inner = producerOf(node(c.times_beta).inputs[0], c.times_beta);
    if (c.inner < 0 || !is(node(c.inner), "aten::add", "Tensor") || !plain(node(c.inner)) ||
        node(c.inner).args.size() != 3 || !tensorArgs(node(c.inner), 2) ||
        node(c.inner).args[2].kind != ir::ArgKind::kRuntime) {
      return std::nullopt;
    }
    const ir::TensorRef& x = node(c.inner).inputs[node(c.inner).args[0].refs[0]];
    const ir::TensorRef& kappa_term = node(c.inner).inputs[node(c.inner).args[1].refs[0]];
    c.times_kappa = producerOf(kappa_term, c.inner);
    if (c.times_kappa < 0 || !scalarOp(c.times_kappa, "aten::mul", "Tensor", 2)) {
      return std::nullopt;
    }
    c.power = producerOf(node(c.times_kappa).inputs[0], c.times_kappa);
    if (c.power < 0 || !scalarOp(c.power, "aten::pow", "Tensor_Scalar", 2) ||
        !(node(c.power).inputs[0] == x)) {
      return std::nullopt;
    }
    // Forwards from the tanh: (x * half) * (tanh + one).
    c.plus_one = readers_.soleReader(t.outputs[0].buffer);
    if (c.plus_one < 0 || !scalarOp(c.plus_one, "aten::add", "Tensor", 3) ||
        node(c.plus_one).args[2].kind != ir::ArgKind::kRuntime ||
        !intermediate(t.outputs[0], c.plus_one)) {
      return std::nullopt;
    }
    const ir::TensorRef& plus_one = node(c.plus_one).outputs[0];
    c.product = readers_.soleReader(plus_one.buffer);
    if (c.product < 0 || !is(node(c.product), "aten::mul", "Tensor") || !plain(node(c.product)) ||
        node(c.product).args.size() != 2 || !tensorArgs(node(c.product), 2) ||
        !intermediate(plus_one, c.product)) {
      return std::nullopt;
    }
    // The product's other operand: x * half.
    const ir::Node& product = node(c.product);
    const ir::TensorRef& a = product.inputs[product.args[0].refs[0]];
    const ir::TensorRef& b = product.inputs[product.args[1].refs[0]];
    if (a.buffer == b.buffer) return std::nullopt;
    c.scale = producerOf(a.buffer == plus_one.buffer ? b : a, c.product);
    if (c.scale < 0 || !scalarOp(c.scale, "aten::mul", "Tensor", 2) ||
        !(node(c.scale).inputs[0] == x)) {
      return std::nullopt;
    }
    const ir::TensorRef& result = product.outputs[0];
    if (x.dtype != c10::ScalarType::Float || result.dtype != c10::ScalarType::Float ||
        !c10::IntArrayRef(x.sizes).equals(result.sizes) ||
        !result.coversWhole(graph_.buffers[result.buffer].nbytes) || xChanges(c, x.buffer)) {
      return std::nullopt;
    }
    return c;
  }

 private:
  const ir::Node& node(int32_t i) const { return graph_.nodes[i]; }

  // One result, no guard, no in-place write, called in the product's state.
  static bool plain(const ir::Node& n) {
    return n.guard == ir::Guard::kNone && n.outputs.size() == 1 && n.writes.empty() &&
           n.fresh_returns.size() == 1 && n.fresh_returns[0];
  }

  static bool tensorArgs(const ir::Node& n, size_t count) {
    for (size_t a = 0; a < count; ++a) {
      if (n.args[a].kind != ir::ArgKind::kTensor) return false;
    }
    return true;
  }

  // `op`(tensor, host scalar[, runtime alpha]) with `args` arguments.
  bool scalarOp(int32_t i, std::string_view op, std::string_view overload, size_t args) const {
    const ir::Node& n = node(i);
    return is(n, op, overload) && plain(n) && n.args.size() == args &&
           n.args[0].kind == ir::ArgKind::kTensor && n.args[1].kind == ir::ArgKind::kRuntime;
  }

  // A float32 temporary made whole by one node and read only by `reader`.
  bool intermediate(const ir::TensorRef& ref, int32_t reader) const {
    const ir::BufferInfo& buffer = graph_.buffers[ref.buffer];
    return !buffer.existed_before && !buffer.live_after && !readers_.written(ref.buffer) &&
           readers_.soleReader(ref.buffer) == reader && ref.dtype == c10::ScalarType::Float &&
           ref.coversWhole(buffer.nbytes);
  }

  // The node that made `ref`, an intermediate read only by `reader`, or -1.
  int32_t producerOf(const ir::TensorRef& ref, int32_t reader) const {
    const int32_t p = producer_[ref.buffer];
    if (p < 0 || !intermediate(ref, reader) || !(node(p).outputs[0] == ref)) return -1;
    return p;
  }

  // True if a node other than the chain's changes x while the chain reads it,
  // or the chain's nodes were called in other states.
  bool xChanges(const Chain& c, ir::BufferId x) const {
    const int32_t members[] = {c.scale,      c.power, c.times_kappa, c.inner,
                               c.times_beta, c.tanh,  c.plus_one,    c.product};
    const int32_t first = *std::min_element(std::begin(members), std::end(members));
    for (int32_t m : members) {
      if (!node(m).sameStateOfCall(node(c.product))) return true;
    }
    for (int32_t i = first; i < c.product; ++i) {
      if (graph_.nodes[i].changes(x)) return true;
    }
    return false;
  }

  const ir::Graph& graph_;
  SoleReaders readers_;
  std::vector<int32_t> producer_;  // per buffer, the node whose result it is
};

// Runtime argument `a` of `n`, read from the graph as captured.
ir::Arg captured(const ir::Node& n, size_t a) {
  ir::Arg arg = n.args[a];
  if (arg.refs.empty()) arg.refs = {n.source_index, static_cast<int32_t>(a)};
  return arg;
}

}  // namespace

ir::Graph fuseTanhGelu(ir::Graph graph) {
  static const c10::OperatorHandle fused_op =
      c10::Dispatcher::singleton().findSchemaOrThrow("poptorch::tanh_gelu", "");
  const ChainFinder finder(graph);
  std::vector<bool> keep(graph.nodes.size(), true);
  std::vector<std::pair<int32_t, ir::Node>> replacements;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const std::optional<Chain> c = finder.from(static_cast<int32_t>(i));
    if (!c) continue;
    const auto& n = graph.nodes;
    ir::Node fused(fused_op);
    fused.inputs = {n[c->scale].inputs[0]};
    fused.args = {ir::Arg::tensor(0),          captured(n[c->scale], 1),
                  captured(n[c->power], 1),    captured(n[c->times_kappa], 1),
                  captured(n[c->inner], 2),    captured(n[c->times_beta], 1),
                  captured(n[c->plus_one], 1), captured(n[c->plus_one], 2)};
    fused.outputs = n[c->product].outputs;
    fused.fresh_returns = {true};
    fused.source_index = n[c->product].source_index;
    fused.placement = n[c->product].placement;
    for (int32_t m :
         {c->scale, c->power, c->times_kappa, c->inner, c->times_beta, c->tanh, c->plus_one}) {
      keep[m] = false;
    }
    replacements.emplace_back(c->product, std::move(fused));
  }
  for (auto& [index, node] : replacements) graph.nodes[index] = std::move(node);
  graph.keepNodes(keep);
  return graph;
}

}  // namespace poptorch::passes
