#include "compiler/out_variants.h"

#include <algorithm>
#include <string>
#include <unordered_map>
#include <vector>

namespace poptorch::compiler {
namespace {

// The overload names of every registered op, by op name. The dispatcher
// lists operators only as a whole, so this index is built once, at the first
// lookup (the aten ops are all registered by then).
const std::unordered_map<std::string, std::vector<std::string>>& overloadsByName() {
  static const auto index = [] {
    std::unordered_map<std::string, std::vector<std::string>> overloads;
    for (const c10::OperatorName& name : c10::Dispatcher::singleton().getAllOpNames()) {
      overloads[name.name].push_back(name.overload_name);
    }
    return overloads;
  }();
  return index;
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
  if (schema.is_mutable() || schema.returns().size() != 1 ||
      schema.returns()[0].type()->kind() != c10::TypeKind::TensorType) {
    return std::nullopt;
  }
  const auto& index = overloadsByName();
  const auto overloads = index.find(schema.name());
  if (overloads == index.end()) return std::nullopt;
  for (const std::string& overload : overloads->second) {
    auto handle = c10::Dispatcher::singleton().findSchema({schema.name(), overload});
    if (handle && handle->hasKernelForDispatchKey(c10::DispatchKey::CPU) &&
        isOutFormOf(handle->schema(), schema)) {
      return handle;
    }
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
