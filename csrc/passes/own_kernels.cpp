#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "kernels/narrow_convolution.h"
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

// The integers of a constant int[] argument, or nullopt.
std::optional<std::vector<int64_t>> intList(const ir::Arg& arg) {
  if (arg.kind != ir::ArgKind::kConstant || !arg.value.isIntList()) return std::nullopt;
  return arg.value.toIntVector();
}

// Whether a convolution (its forward, or with `backward` its gradient, whose
// arguments follow grad_output) is one poptorch's kernels take
// (kernels::isNarrowConvolution), its float32 tensors planned NCHW.
bool narrowConvolution(const ir::Node& node, bool backward) {
  const size_t first = backward ? 1 : 0;  // input, weight, bias, stride...
  if (node.args.size() != (backward ? 11 : 9)) return false;
  // planLayouts lays out the activations and the weight.
  for (size_t a = 0; a <= first + 1; ++a) {
    if (node.args[a].layout != ir::Layout::kContiguous) return false;
  }
  for (const ir::TensorRef& in : node.inputs) {
    if (in.dtype != c10::ScalarType::Float) return false;
  }
  const ir::Arg& input = node.args[first];
  const ir::Arg& weight = node.args[first + 1];
  const auto stride = intList(node.args[first + 3]), padding = intList(node.args[first + 4]),
             dilation = intList(node.args[first + 5]),
             output_padding = intList(node.args[first + 7]);
  const c10::IValue& transposed = node.args[first + 6].value;
  const c10::IValue& groups = node.args[first + 8].value;
  if (input.kind != ir::ArgKind::kTensor || weight.kind != ir::ArgKind::kTensor || !stride ||
      !padding || !dilation || !output_padding || !transposed.isBool() || !groups.isInt()) {
    return false;
  }
  return kernels::isNarrowConvolution({node.inputs[input.refs[0]].sizes,
                                       node.inputs[weight.refs[0]].sizes, *stride, *padding,
                                       *dilation, transposed.toBool(), *output_padding,
                                       groups.toInt()});
}

// Whether `node` (whose aten op `kernel` stands for) is one the kernel takes:
// convolutions only where it beats oneDNN's, everything else always.
bool takes(const OwnKernelFor& kernel, const ir::Node& node) {
  if (kernel.aten == "aten::convolution") return narrowConvolution(node, false);
  if (kernel.aten == "aten::convolution_backward") return narrowConvolution(node, true);
  return true;
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
    if (kernel != substitutes.end() && takes(*kernel, node)) node.op = kernel->own;
  }
  return graph;
}

}  // namespace poptorch::passes
