#include "compiler/out_variants.h"

#include <absl/container/flat_hash_map.h>

#include <algorithm>
#include <string>
#include <unordered_map>
#include <vector>

namespace poptorch::compiler {
namespace {

// Structured ops, functional overload ("add.Tensor") -> out= overload ("out"). Their out=
// kernel, given an empty out tensor, does exactly what the functional kernel does (one meta
// function sizes the result, one kernel fills it). Hand-written out= kernels promise no such
// thing: binary_cross_entropy.out uses its out tensor as scratch and, given a result-shaped
// one, returns a wrong value.
const absl::flat_hash_map<std::string, std::string>& structuredOutOverloads() {
  static const absl::flat_hash_map<std::string, std::string> table = {
#include "structured_out_variants.inc"
  };
  return table;
}

// poptorch's own ops -> out= overload, whose out= kernel behaves as a structured one's.
const absl::flat_hash_map<std::string, std::string>& ownOutOverloads() {
  static const absl::flat_hash_map<std::string, std::string> table = {
      {"poptorch::tanh", "out"},
      {"poptorch::tanh_gelu", "out"},
      {"poptorch::max_pool2d_with_indices_backward", "grad_input"}};
  return table;
}

// The out= overload name of `name`, or null.
const std::string* outOverloadName(const c10::OperatorName& name) {
  if (name.name.rfind("aten::", 0) != 0) {
    const auto own = ownOutOverloads().find(name.name);
    return own == ownOutOverloads().end() || !name.overload_name.empty() ? nullptr : &own->second;
  }
  std::string key = name.name.substr(6);
  if (!name.overload_name.empty()) key += "." + name.overload_name;
  const auto found = structuredOutOverloads().find(key);
  return found == structuredOutOverloads().end() ? nullptr : &found->second;
}

// True if `out` is `functional` with one trailing out= Tensor argument.
bool isOutFormOf(const c10::FunctionSchema& out, const c10::FunctionSchema& functional) {
  const auto& args = functional.arguments();
  const auto& out_args = out.arguments();
  if (out_args.size() != args.size() + 1 || !out_args.back().is_out() ||
      out_args.back().type()->kind() != c10::TypeKind::TensorType) {
    return false;
  }
  for (size_t i = 0; i < args.size(); ++i) {
    if (out_args[i].name() != args[i].name() || *out_args[i].type() != *args[i].type() ||
        out_args[i].is_out()) {
      return false;
    }
  }
  return true;
}

}  // namespace

std::optional<c10::OperatorHandle> outVariantOf(const c10::OperatorHandle& op) {
  const c10::FunctionSchema& schema = op.schema();
  const c10::OperatorName& name = op.operator_name();
  if (schema.is_mutable() || schema.returns().size() != 1 ||
      schema.returns()[0].type()->kind() != c10::TypeKind::TensorType) {
    return std::nullopt;
  }
  const std::string* overload = outOverloadName(name);
  if (overload == nullptr) return std::nullopt;
  auto handle = c10::Dispatcher::singleton().findSchema({name.name, *overload});
  if (handle && handle->hasKernelForDispatchKey(c10::DispatchKey::CPU) &&
      isOutFormOf(handle->schema(), schema)) {
    return handle;
  }
  return std::nullopt;
}

void chooseOutVariants(Executable& exe) {
  // Looking up an op's out= overload walks its schemas: once per op.
  std::unordered_map<const void*, std::optional<c10::OperatorHandle>> known;
  const ir::Graph& program = exe.program;
  exe.out_variant.assign(program.nodes.size(), std::nullopt);
  for (size_t i = 0; i < program.nodes.size(); ++i) {
    const ir::Node& node = program.nodes[i];
    // An op whose output shape depends on the data resizes an out= argument.
    if (node.outputs.size() != 1 || !node.writes.empty() || node.guard == ir::Guard::kShape) {
      continue;
    }
    const ir::TensorRef& out = node.outputs[0];
    // Channels-last plans rely on adopting the kernel's own layout.
    const bool planned_layout =
        exe.flexible_layout[out.buffer] ||
        std::any_of(node.args.begin(), node.args.end(),
                    [](const ir::Arg& arg) { return arg.layout != ir::Layout::kAsIs; });
    if (planned_layout || exe.roles[out.buffer] == BufferRole::kUnused ||
        !out.coversWhole(program.buffers[out.buffer].nbytes)) {
      continue;
    }
    auto [it, inserted] = known.try_emplace(&node.op.schema(), std::nullopt);
    if (inserted) it->second = outVariantOf(node.op);
    exe.out_variant[i] = it->second;
  }
}

}  // namespace poptorch::compiler
