#include "capture/op_traits.h"

#include <absl/container/flat_hash_map.h>

#include <memory>

namespace poptorch::capture {
namespace {

c10::TypePtr withoutOptional(c10::TypePtr type) {
  if (auto optional = type->cast<c10::OptionalType>()) return optional->getElementType();
  return type;
}

ArgTraits argTraits(const c10::Argument& argument) {
  ArgTraits traits;
  traits.optional_tensor_list = argument.type()->isSubtypeOf(*c10::ListType::ofOptionalTensors()) &&
                                !argument.type()->isSubtypeOf(*c10::ListType::ofTensors());
  const c10::TypeKind kind = withoutOptional(argument.type())->kind();
  traits.runtime_number = kind == c10::TypeKind::NumberType || kind == c10::TypeKind::FloatType;
  const c10::AliasInfo* alias = argument.alias_info();
  traits.writes = alias != nullptr && alias->isWrite();
  traits.is_out = argument.is_out();
  // real_type(): type() shows a ScalarType as the int it is passed as.
  traits.scalar_type =
      withoutOptional(argument.real_type())->kind() == c10::TypeKind::ScalarTypeType;
  return traits;
}

}  // namespace

std::unique_ptr<OpTraits> computeTraits(const c10::OperatorHandle& op) {
  auto traits = std::make_unique<OpTraits>(op.operator_name());
  const c10::FunctionSchema& schema = op.schema();
  for (size_t i = 0; i < schema.arguments().size(); ++i) {
    const c10::Argument& argument = schema.arguments()[i];
    traits->args.push_back(argTraits(argument));
    traits->any_optional_tensor_list |= traits->args.back().optional_tensor_list;
    const c10::TypeKind kind = withoutOptional(argument.type())->kind();
    if (kind == c10::TypeKind::TensorType) ++traits->tensor_args;
    if (kind == c10::TypeKind::GeneratorType) {
      traits->generator_arg = static_cast<int32_t>(i);
    }
  }
  traits->pointwise = op.hasTag(at::Tag::pointwise);
  if (traits->name.name == "aten::native_batch_norm") {
    traits->unannotated_writes = UnannotatedWrites::kBatchNorm;
  } else if (traits->name.name == "aten::batch_norm_update_stats") {
    traits->unannotated_writes = UnannotatedWrites::kBatchNormUpdateStats;
  }
  return traits;
}

const OpTraits& traitsOf(const c10::OperatorHandle& op) {
  // Keyed by the schema's address, which lives as long as the operator's
  // registration; the name guards against another operator registered at the
  // same address after one was removed (torch.library in tests).
  thread_local absl::flat_hash_map<const c10::FunctionSchema*, std::unique_ptr<OpTraits>> table;
  std::unique_ptr<OpTraits>& traits = table[&op.schema()];
  if (!traits || traits->name != op.operator_name()) traits = computeTraits(op);
  return *traits;
}

}  // namespace poptorch::capture
