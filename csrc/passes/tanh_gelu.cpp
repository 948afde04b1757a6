#include <algorithm>
#include <array>
#include <optional>
#include <string_view>
#include <vector>

#include "passes/passes.h"

namespace poptorch::passes {
namespace {

bool is(const ir::Node& node, std::string_view name, std::string_view overload) {
  const c10::OperatorName& op = node.op.operator_name();
  return op.name == name && op.overload_name == overload;
}

// The nodes of the chain's gradient as autograd records it (see
// fuseTanhGelu), named after what each computes.
struct Backward {
  int32_t grad_plus_one;  // grad * scale
  int32_t grad_scaled;    // grad * plus_one
  int32_t grad_u;         // tanh_backward(grad_plus_one, tanh)
  int32_t grad_inner;     // grad_u * beta: the result's buffer
  int32_t grad_power;     // grad_inner * kappa
  int32_t power;          // x ** (exponent - 1)
  int32_t power_factor;   // power * exponent
  int32_t grad_x_power;   // grad_power * power_factor
  int32_t add_power;      // grad_inner + grad_x_power (in place or not)
  int32_t grad_x_scaled;  // grad_scaled * half
  int32_t add_scaled;     // ... + grad_x_scaled: the gradient of x
  ir::TensorRef result;   // the gradient of x, as the last add leaves it

  // The nodes the fused gradient replaces, which run where add_scaled did.
  std::array<int32_t, 10> replaced() const {
    return {grad_plus_one, grad_scaled,  grad_u,       grad_inner, grad_power,
            power,         power_factor, grad_x_power, add_power,  grad_x_scaled};
  }
};

// The chain's nodes (see fuseTanhGelu), found from its tanh, and in training
// its gradient's.
struct Chain {
  int32_t scale, power, times_kappa, inner, times_beta, tanh, plus_one, product;
  std::optional<Backward> backward;

  // The nodes the fused chain replaces, which runs where product did.
  std::array<int32_t, 7> replaced() const {
    return {scale, power, times_kappa, inner, times_beta, tanh, plus_one};
  }
};

// Readers of a saved intermediate besides the chain's next node: the one
// node of the gradient that reads it (or -1, none: inference).
struct SavedReaders {
  int32_t scale = -1, tanh = -1, plus_one = -1;
};

class ChainFinder {
 public:
  explicit ChainFinder(const ir::Graph& graph)
      : graph_(graph),
        producer_(graph.buffers.size(), -1),
        readers_(graph.buffers.size()),
        written_(graph.buffers.size(), false) {
    for (size_t i = 0; i < graph.nodes.size(); ++i) {
      const auto index = static_cast<int32_t>(i);
      for (const ir::TensorRef& out : graph.nodes[i].outputs) producer_[out.buffer] = index;
      for (const ir::TensorRef& in : graph.nodes[i].inputs) {
        auto& readers = readers_[in.buffer];
        if (readers.empty() || readers.back() != index) readers.push_back(index);
      }
      for (ir::BufferId w : graph.nodes[i].writes) written_[w] = true;
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
    if (!scaledPower(kappa_term, c.inner, x, c.times_kappa, c.power)) return std::nullopt;
    // Forwards from the tanh: (x * half) * (tanh + one). In training the
    // gradient reads the tanh, the sum and x * half too, after the chain.
    SavedReaders saved;
    const ir::TensorRef& tanh_out = t.outputs[0];
    c.plus_one = firstReader(tanh_out.buffer);
    if (c.plus_one < 0 || !scalarOp(c.plus_one, "aten::add", "Tensor", 3) ||
        node(c.plus_one).args[2].kind != ir::ArgKind::kRuntime ||
        !intermediate(tanh_out, c.plus_one, &saved.tanh)) {
      return std::nullopt;
    }
    const ir::TensorRef& plus_one = node(c.plus_one).outputs[0];
    c.product = firstReader(plus_one.buffer);
    if (c.product < 0 || !is(node(c.product), "aten::mul", "Tensor") || !plain(node(c.product)) ||
        node(c.product).args.size() != 2 || !tensorArgs(node(c.product), 2) ||
        !intermediate(plus_one, c.product, &saved.plus_one)) {
      return std::nullopt;
    }
    // The product's other operand: x * half.
    const ir::Node& product = node(c.product);
    const ir::TensorRef& a = product.inputs[product.args[0].refs[0]];
    const ir::TensorRef& b = product.inputs[product.args[1].refs[0]];
    if (a.buffer == b.buffer) return std::nullopt;
    const ir::TensorRef& scale = a.buffer == plus_one.buffer ? b : a;
    c.scale = producerOf(scale, c.product, &saved.scale);
    if (c.scale < 0 || !scalarOp(c.scale, "aten::mul", "Tensor", 2) ||
        !(node(c.scale).inputs[0] == x)) {
      return std::nullopt;
    }
    const ir::TensorRef& result = product.outputs[0];
    if (x.dtype != c10::ScalarType::Float || result.dtype != c10::ScalarType::Float ||
        !c10::IntArrayRef(x.sizes).equals(result.sizes) ||
        !result.coversWhole(graph_.buffers[result.buffer].nbytes)) {
      return std::nullopt;
    }
    const bool training = saved.scale >= 0 || saved.tanh >= 0 || saved.plus_one >= 0;
    if (training) {
      c.backward = backwardOf(saved, scale, tanh_out, plus_one, x);
      if (!c.backward) return std::nullopt;
    }
    if (xChanges(c, x.buffer)) return std::nullopt;
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

  // The first node that reads `buffer`, or -1.
  int32_t firstReader(ir::BufferId buffer) const {
    const auto& readers = readers_[buffer];
    return readers.empty() ? -1 : readers.front();
  }

  // The one node that reads `buffer`, or -1 (none or several).
  int32_t soleReader(ir::BufferId buffer) const {
    const auto& readers = readers_[buffer];
    return readers.size() == 1 ? readers.front() : -1;
  }

  // A float32 temporary made whole by one node and read by `reader` alone,
  // or, given `other`, by `reader` and at most one later node, returned there
  // (-1 if none).
  bool intermediate(const ir::TensorRef& ref, int32_t reader, int32_t* other = nullptr) const {
    const ir::BufferInfo& buffer = graph_.buffers[ref.buffer];
    const auto& readers = readers_[ref.buffer];
    if (buffer.existed_before || buffer.live_after || written_[ref.buffer] ||
        ref.dtype != c10::ScalarType::Float || !ref.coversWhole(buffer.nbytes) ||
        readers.empty() || readers.front() != reader) {
      return false;
    }
    if (other == nullptr) return readers.size() == 1;
    *other = readers.size() == 2 ? readers[1] : -1;
    return readers.size() <= 2;
  }

  // The node that made `ref`, an intermediate read by `reader` (and `other`,
  // as intermediate says), or -1.
  int32_t producerOf(const ir::TensorRef& ref, int32_t reader, int32_t* other = nullptr) const {
    const int32_t p = producer_[ref.buffer];
    if (p < 0 || !intermediate(ref, reader, other) || !(node(p).outputs[0] == ref)) return -1;
    return p;
  }

  // Whether `ref`, an intermediate read by `reader` alone, is made by
  // mul(pow(x, host scalar), host scalar) (`times`, `power`), each an
  // intermediate too.
  bool scaledPower(const ir::TensorRef& ref, int32_t reader, const ir::TensorRef& x,
                   int32_t& times, int32_t& power) const {
    times = producerOf(ref, reader);
    if (times < 0 || !scalarOp(times, "aten::mul", "Tensor", 2)) return false;
    power = producerOf(node(times).inputs[0], times);
    return power >= 0 && scalarOp(power, "aten::pow", "Tensor_Scalar", 2) &&
           node(power).inputs[0] == x;
  }

  // The tensor argument `a` of node `n`, or null if it is not one.
  const ir::TensorRef* tensorArg(int32_t n, size_t a) const {
    const ir::Node& x = node(n);
    if (a >= x.args.size() || x.args[a].kind != ir::ArgKind::kTensor) return nullptr;
    return &x.inputs[x.args[a].refs[0]];
  }

  // `op`.Tensor(lhs, rhs) of two tensors, rhs == `rhs`; its lhs, or null.
  const ir::TensorRef* productWith(int32_t n, const ir::TensorRef& rhs) const {
    if (n < 0 || !is(node(n), "aten::mul", "Tensor") || !plain(node(n)) ||
        node(n).args.size() != 2 || !tensorArgs(node(n), 2) || !(*tensorArg(n, 1) == rhs)) {
      return nullptr;
    }
    return tensorArg(n, 0);
  }

  // `sum`.add_(addend, alpha) with a runtime alpha, writing sum alone.
  bool accumulates(int32_t n, const ir::TensorRef& sum, const ir::TensorRef& addend) const {
    if (n < 0) return false;
    const ir::Node& a = node(n);
    return is(a, "aten::add_", "Tensor") && a.guard == ir::Guard::kNone && a.outputs.empty() &&
           a.args.size() == 3 && tensorArgs(a, 2) && a.args[2].kind == ir::ArgKind::kRuntime &&
           *tensorArg(n, 0) == sum && *tensorArg(n, 1) == addend &&
           a.writes == ir::BufferIds{sum.buffer};
  }

  // add.Tensor(lhs, rhs, alpha) with a runtime alpha, a fresh result.
  bool adds(int32_t n, const ir::TensorRef& lhs, const ir::TensorRef& rhs) const {
    if (n < 0) return false;
    const ir::Node& a = node(n);
    return is(a, "aten::add", "Tensor") && plain(a) && a.args.size() == 3 && tensorArgs(a, 2) &&
           a.args[2].kind == ir::ArgKind::kRuntime && *tensorArg(n, 0) == lhs &&
           *tensorArg(n, 1) == rhs && a.outputs[0].dtype == c10::ScalarType::Float;
  }

  // The chain's gradient as autograd records it, from the nodes that read the
  // saved intermediates: grad * scale and grad * plus_one (the product's
  // backward), tanh_backward, the products by beta and kappa, pow's backward
  // (x ** (e - 1) * e), x * half's backward, the two contributions added to
  // the first. Every intermediate is read by the next node alone.
  std::optional<Backward> backwardOf(const SavedReaders& saved, const ir::TensorRef& scale,
                                     const ir::TensorRef& tanh, const ir::TensorRef& plus_one,
                                     const ir::TensorRef& x) const {
    Backward b{};
    b.grad_plus_one = saved.scale;
    b.grad_scaled = saved.plus_one;
    const ir::TensorRef* grad = productWith(b.grad_plus_one, scale);
    const ir::TensorRef* grad_too = productWith(b.grad_scaled, plus_one);
    if (grad == nullptr || grad_too == nullptr || !(*grad == *grad_too) ||
        grad->dtype != c10::ScalarType::Float || !c10::IntArrayRef(grad->sizes).equals(x.sizes)) {
      return std::nullopt;
    }
    b.grad_u = saved.tanh;
    const ir::TensorRef& grad_plus_one = node(b.grad_plus_one).outputs[0];
    if (b.grad_u < 0 || !is(node(b.grad_u), "aten::tanh_backward", "") || !plain(node(b.grad_u)) ||
        node(b.grad_u).args.size() != 2 || !tensorArgs(node(b.grad_u), 2) ||
        !(*tensorArg(b.grad_u, 0) == grad_plus_one) || !(*tensorArg(b.grad_u, 1) == tanh) ||
        !intermediate(grad_plus_one, b.grad_u)) {
      return std::nullopt;
    }
    const ir::TensorRef& grad_u = node(b.grad_u).outputs[0];
    b.grad_inner = soleReader(grad_u.buffer);
    if (b.grad_inner < 0 || !scalarOp(b.grad_inner, "aten::mul", "Tensor", 2) ||
        !intermediate(grad_u, b.grad_inner)) {
      return std::nullopt;
    }
    // The sum grad_inner + grad_x_power + grad_x_scaled, added in place to
    // grad_inner's result (autograd's input buffers, as lazy capture records
    // them) or as fresh results (AOTAutograd's graphs). grad_power reads
    // grad_inner's result first, before it changes.
    const ir::TensorRef& inner = node(b.grad_inner).outputs[0];
    const auto& inner_readers = readers_[inner.buffer];
    if (graph_.buffers[inner.buffer].existed_before ||
        !inner.coversWhole(graph_.buffers[inner.buffer].nbytes) || inner_readers.size() < 2) {
      return std::nullopt;
    }
    b.grad_power = inner_readers[0];
    b.add_power = inner_readers[1];
    if (!scalarOp(b.grad_power, "aten::mul", "Tensor", 2)) return std::nullopt;
    const ir::TensorRef& grad_power = node(b.grad_power).outputs[0];
    b.grad_x_power = soleReader(grad_power.buffer);
    if (b.grad_x_power < 0 || !intermediate(grad_power, b.grad_x_power)) return std::nullopt;
    const ir::TensorRef* power_factor = tensorArg(b.grad_x_power, 1);
    if (power_factor == nullptr || productWith(b.grad_x_power, *power_factor) == nullptr ||
        !(*tensorArg(b.grad_x_power, 0) == grad_power)) {
      return std::nullopt;
    }
    if (!scaledPower(*power_factor, b.grad_x_power, x, b.power_factor, b.power)) {
      return std::nullopt;
    }
    const ir::TensorRef& grad_x_power = node(b.grad_x_power).outputs[0];
    const ir::TensorRef& grad_scaled = node(b.grad_scaled).outputs[0];
    b.grad_x_scaled = soleReader(grad_scaled.buffer);
    if (!intermediate(grad_x_power, b.add_power) || b.grad_x_scaled < 0 ||
        !scalarOp(b.grad_x_scaled, "aten::mul", "Tensor", 2) ||
        !intermediate(grad_scaled, b.grad_x_scaled)) {
      return std::nullopt;
    }
    const ir::TensorRef& grad_x_scaled = node(b.grad_x_scaled).outputs[0];
    if (accumulates(b.add_power, inner, grad_x_power)) {
      if (inner_readers.size() < 3) return std::nullopt;
      b.add_scaled = inner_readers[2];
      if (!accumulates(b.add_scaled, inner, grad_x_scaled)) return std::nullopt;
      b.result = inner;
    } else {
      int32_t other = -1;
      if (!adds(b.add_power, inner, grad_x_power) ||
          !intermediate(inner, b.grad_power, &other) || other != b.add_power) {
        return std::nullopt;
      }
      const ir::TensorRef& partial = node(b.add_power).outputs[0];
      b.add_scaled = soleReader(partial.buffer);
      if (b.add_scaled < 0 || !intermediate(partial, b.add_scaled) ||
          !adds(b.add_scaled, partial, grad_x_scaled)) {
        return std::nullopt;
      }
      b.result = node(b.add_scaled).outputs[0];
      if (!b.result.coversWhole(graph_.buffers[b.result.buffer].nbytes)) return std::nullopt;
    }
    if (!intermediate(grad_x_scaled, b.add_scaled)) return std::nullopt;
    // The fused node runs at the last add: nothing before it may see the sum
    // half made, nor change the gradient it reads.
    const int32_t first = std::min(b.grad_plus_one, b.grad_scaled);
    for (int32_t i = first; i < b.add_scaled; ++i) {
      const ir::Node& n = graph_.nodes[i];
      if (n.changes(grad->buffer) ||
          (n.touches(inner.buffer) && i != b.grad_inner && i != b.grad_power &&
           i != b.add_power)) {
        return std::nullopt;
      }
    }
    for (int32_t m : b.replaced()) {
      if (!node(m).sameStateOfCall(node(b.add_scaled))) return std::nullopt;
    }
    return b;
  }

  // True if a node other than the chain's changes x while the chain (and its
  // gradient) reads it, or the chain's nodes were called in other states.
  bool xChanges(const Chain& c, ir::BufferId x) const {
    const std::array<int32_t, 7> members = c.replaced();
    const int32_t first = std::min(*std::min_element(members.begin(), members.end()), c.product);
    for (int32_t m : members) {
      if (!node(m).sameStateOfCall(node(c.product))) return true;
    }
    const int32_t last = c.backward ? c.backward->add_scaled : c.product;
    for (int32_t i = first; i < last; ++i) {
      if (graph_.nodes[i].changes(x)) return true;
    }
    return false;
  }

  const ir::Graph& graph_;
  std::vector<int32_t> producer_;  // per buffer, the node whose result it is
  // per buffer, the nodes that read it, in program order
  std::vector<c10::SmallVector<int32_t, 2>> readers_;
  std::vector<bool> written_;  // per buffer, whether a node writes it in place
};

// Runtime argument `a` of `n`, read from the graph as captured.
ir::Arg captured(const ir::Node& n, size_t a) {
  ir::Arg arg = n.args[a];
  if (arg.refs.empty()) arg.refs = {n.source_index, static_cast<int32_t>(a)};
  return arg;
}

// Appends the chain's scalars, as poptorch::tanh_gelu takes them after self.
void appendChainScalars(ir::Args& args, const std::vector<ir::Node>& n, const Chain& c) {
  for (const ir::Arg& arg :
       {captured(n[c.scale], 1), captured(n[c.power], 1), captured(n[c.times_kappa], 1),
        captured(n[c.inner], 2), captured(n[c.times_beta], 1), captured(n[c.plus_one], 1),
        captured(n[c.plus_one], 2)}) {
    args.push_back(arg);
  }
}

// The fused gradient of chain `c` (see poptorch::tanh_gelu_backward), which
// runs where its last add did and makes the result's buffer.
ir::Node fusedBackward(const std::vector<ir::Node>& n, const Chain& c) {
  static const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow("poptorch::tanh_gelu_backward", "");
  const Backward& b = *c.backward;
  const ir::Node& grad_plus_one = n[b.grad_plus_one];
  ir::Node fused(op);
  fused.inputs = {grad_plus_one.inputs[grad_plus_one.args[0].refs[0]], n[c.scale].inputs[0]};
  fused.args = {ir::Arg::tensor(0), ir::Arg::tensor(1)};
  appendChainScalars(fused.args, n, c);
  for (const ir::Arg& arg :
       {captured(n[b.grad_inner], 1), captured(n[b.grad_power], 1), captured(n[b.power], 1),
        captured(n[b.power_factor], 1), captured(n[b.add_power], 2),
        captured(n[b.grad_x_scaled], 1), captured(n[b.add_scaled], 2)}) {
    fused.args.push_back(arg);
  }
  fused.outputs = {b.result};
  fused.fresh_returns = {true};
  fused.source_index = n[b.add_scaled].source_index;
  fused.placement = n[b.add_scaled].placement;
  return fused;
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
    fused.args = {ir::Arg::tensor(0)};
    appendChainScalars(fused.args, n, *c);
    fused.outputs = n[c->product].outputs;
    fused.fresh_returns = {true};
    fused.source_index = n[c->product].source_index;
    fused.placement = n[c->product].placement;
    for (int32_t m : c->replaced()) keep[m] = false;
    replacements.emplace_back(c->product, std::move(fused));
    if (c->backward) {
      for (int32_t m : c->backward->replaced()) keep[m] = false;
      replacements.emplace_back(c->backward->add_scaled, fusedBackward(n, *c));
    }
  }
  for (auto& [index, node] : replacements) graph.nodes[index] = std::move(node);
  graph.keepNodes(keep);
  return graph;
}

}  // namespace poptorch::passes
