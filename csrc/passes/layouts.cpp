#include <string_view>

#include "passes/passes.h"

namespace poptorch::passes {
namespace {

// The arguments of convolution and convolution_backward that planLayouts reads.
struct ConvolutionArgs {
  std::vector<size_t> tensors;  // activations and weight, all laid out alike
  size_t stride;
  size_t transposed;
  size_t groups;
};
const ConvolutionArgs kForward{/*input, weight*/ {0, 1}, 3, 6, 8};
const ConvolutionArgs kBackward{/*grad_output, input, weight*/ {0, 1, 2}, 4, 7, 9};

// oneDNN runs channels-last 2-D convolutions faster than NCHW ones, except
// for the cases left in NCHW:
// - transposed and grouped convolutions, which take other code paths;
// - convolutions with fewer than 16 output channels: the ops that read their
//   result (pooling, normalisation, activations) vectorise a channels-last
//   tensor over its channels, eight floats at a time, so a few channels run
//   mostly scalar tails (the seed CNN's 5-channel max_pool2d took a third of
//   an inference step's instructions, against NCHW's loop over pixels);
// - strided 1x1 convolutions of inputs with fewer than 8 channels: oneDNN's
//   channels-last weight gradient for them (PyTorch 2.13) reads uninitialised
//   memory and can hang, in eager PyTorch as well (measured with 2 to 7
//   channels; 8 to 33 are exact).
bool runsChannelsLast(const ir::Node& node, const ConvolutionArgs& conv) {
  const ir::Arg& input = node.args[conv.tensors[0]];
  const ir::Arg& weight = node.args[conv.tensors.back()];
  if (weight.kind != ir::ArgKind::kTensor) return false;
  const ir::TensorRef& input_ref = node.inputs[input.refs[0]];
  const ir::TensorRef& weight_ref = node.inputs[weight.refs[0]];
  if (!c10::isFloatingType(input_ref.dtype)) return false;
  const c10::IValue& transposed = node.args[conv.transposed].value;
  const c10::IValue& groups = node.args[conv.groups].value;
  if (!transposed.isBool() || transposed.toBool() || !groups.isInt() || groups.toInt() != 1) {
    return false;
  }
  const bool one_by_one = weight_ref.sizes[2] == 1 && weight_ref.sizes[3] == 1;
  const c10::IValue& stride = node.args[conv.stride].value;
  const bool strided =
      !stride.isIntList() || c10::IntArrayRef(stride.toIntVector()) != c10::IntArrayRef({1, 1});
  constexpr int64_t kVectorChannels = 16;
  if (weight_ref.sizes[0] < kVectorChannels) return false;
  constexpr int64_t kSafeChannels = 8;
  return !(one_by_one && strided && weight_ref.sizes[1] < kSafeChannels);
}

bool is2d(const ir::Node& node, const ConvolutionArgs& conv) {
  const ir::Arg& input = node.args[conv.tensors[0]];
  return input.kind == ir::ArgKind::kTensor && node.inputs[input.refs[0]].sizes.size() == 4;
}

// Other ranks have no channels-last temporaries to avoid (see
// compiler::Executable::flexible_layout): they stay as they are.
void plan(ir::Node& node, const ConvolutionArgs& conv) {
  if (!is2d(node, conv)) return;
  const ir::Layout layout =
      runsChannelsLast(node, conv) ? ir::Layout::kChannelsLast : ir::Layout::kContiguous;
  for (size_t a : conv.tensors) {
    if (node.args[a].kind == ir::ArgKind::kTensor) node.args[a].layout = layout;
  }
}

}  // namespace

ir::Graph planLayouts(ir::Graph graph) {
  for (ir::Node& node : graph.nodes) {
    const std::string_view name = node.op.operator_name().name;
    if (name == "aten::convolution") {
      plan(node, kForward);
    } else if (name == "aten::convolution_backward") {
      plan(node, kBackward);
    }
  }
  return graph;
}

}  // namespace poptorch::passes
