// Builds small IR graphs by hand for the unit tests.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "compiler/node_dependencies.h"
#include "ir/graph.h"

namespace poptorch::testing {

inline c10::OperatorHandle aten(const char* name, const char* overload = "") {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
}

// Ranges of nodes [begin, end) as pairs, which tests compare and print.
using Ranges = std::vector<std::pair<int32_t, int32_t>>;
inline Ranges pairsOf(const std::vector<compiler::NodeDependencies::Segment>& ranges) {
  Ranges pairs;
  for (const auto& r : ranges) pairs.emplace_back(r.begin, r.end);
  return pairs;
}

class GraphBuilder {
 public:
  // A float32 buffer of `numel` elements; `input` if it existed before the graph.
  ir::BufferId buffer(int64_t numel, bool input = false, bool live = false) {
    ir::BufferInfo info;
    info.nbytes = numel * 4;
    info.existed_before = input;
    info.live_after = live;
    return graph.addBuffer(info);
  }

  static ir::TensorRef ref(ir::BufferId buffer, std::initializer_list<int64_t> sizes) {
    ir::TensorRef r;
    r.buffer = buffer;
    r.dtype = c10::ScalarType::Float;
    r.sizes.assign(sizes);
    int64_t stride = 1;
    r.strides.resize(r.sizes.size());
    for (size_t i = r.sizes.size(); i-- > 0;) {
      r.strides[i] = stride;
      stride *= r.sizes[i];
    }
    return r;
  }

  // out = op(a, b) for a binary functional op such as aten::mul.Tensor.
  ir::Node& binary(const c10::OperatorHandle& op, ir::TensorRef a, ir::TensorRef b,
                   ir::TensorRef out) {
    ir::Node node(op);
    node.inputs = {a, b};
    node.args = {ir::Arg::tensor(0), ir::Arg::tensor(1)};
    node.outputs = {out};
    node.fresh_returns = {true};
    return append(std::move(node));
  }

  // Shorthands on vectors of 4 floats: out = x * x, out = a + b.
  static ir::TensorRef vec(ir::BufferId buffer) { return ref(buffer, {4}); }
  ir::Node& square(ir::BufferId x, ir::BufferId out) {
    return binary(aten("aten::mul", "Tensor"), vec(x), vec(x), vec(out));
  }
  ir::Node& add(ir::BufferId a, ir::BufferId b, ir::BufferId out) {
    return binary(aten("aten::add", "Tensor"), vec(a), vec(b), vec(out));
  }

  // self.add_(other, alpha) with a runtime alpha.
  ir::Node& addInPlace(ir::TensorRef self, ir::TensorRef other, double alpha) {
    ir::Node node(aten("aten::add_", "Tensor"));
    node.inputs = {self, other};
    node.args = {ir::Arg::tensor(0), ir::Arg::tensor(1), ir::Arg::runtime(alpha)};
    node.writes = {self.buffer};
    node.fresh_returns = {false};
    return append(std::move(node));
  }

  // convolution(input, weight, bias=None, stride 1, padding 0, dilation 1,
  // transposed, output_padding 0, groups 1); `out` its result.
  ir::Node& convolution(ir::TensorRef input, ir::TensorRef weight, ir::TensorRef out,
                        bool transposed = false) {
    ir::Node node(aten("aten::convolution"));
    node.inputs = {input, weight};
    const auto [ones, zeros] = spatialParameters(input);
    node.args = {ir::Arg::tensor(0),
                 ir::Arg::tensor(1),
                 ir::Arg::constant({}),
                 ir::Arg::constant(ones),
                 ir::Arg::constant(zeros),
                 ir::Arg::constant(ones),
                 ir::Arg::constant(transposed),
                 ir::Arg::constant(zeros),
                 ir::Arg::constant(int64_t{1})};
    node.outputs = {out};
    node.fresh_returns = {true};
    return append(std::move(node));
  }

  // The gradients of convolution(input, weight) for the same parameters.
  ir::Node& convolutionBackward(ir::TensorRef grad_output, ir::TensorRef input,
                                ir::TensorRef weight, ir::TensorRef grad_input,
                                ir::TensorRef grad_weight) {
    ir::Node node(aten("aten::convolution_backward"));
    node.inputs = {grad_output, input, weight};
    const auto [ones, zeros] = spatialParameters(input);
    node.args = {ir::Arg::tensor(0),
                 ir::Arg::tensor(1),
                 ir::Arg::tensor(2),
                 ir::Arg::constant({}),
                 ir::Arg::constant(ones),
                 ir::Arg::constant(zeros),
                 ir::Arg::constant(ones),
                 ir::Arg::constant(false),
                 ir::Arg::constant(zeros),
                 ir::Arg::constant(int64_t{1}),
                 ir::Arg::constant(std::vector<bool>{true, true, false})};
    node.outputs = {grad_input, grad_weight};
    node.fresh_returns = {true, true, true};
    return append(std::move(node));
  }

  ir::Node& append(ir::Node node) {
    node.source_index = static_cast<int32_t>(graph.nodes.size());
    graph.nodes.push_back(std::move(node));
    return graph.nodes.back();
  }

  ir::Graph graph;

 private:
  // Per spatial dimension of a convolution's input: ones and zeros.
  static std::pair<std::vector<int64_t>, std::vector<int64_t>> spatialParameters(
      const ir::TensorRef& input) {
    const size_t spatial = input.sizes.size() - 2;
    return {std::vector<int64_t>(spatial, 1), std::vector<int64_t>(spatial, 0)};
  }
};

}  // namespace poptorch::testing
