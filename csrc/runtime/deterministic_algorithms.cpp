#include "runtime/deterministic_algorithms.h"

#include <ATen/Context.h>
#include <c10/util/Exception.h>

#include <string>
#include <string_view>

namespace poptorch::runtime {
namespace {

bool named(const c10::OperatorHandle& op, std::initializer_list<std::string_view> names) {
  const std::string& name = op.operator_name().name;
  for (std::string_view n : names) {
    if (name == n) return true;
  }
  return false;
}

// Ops whose CPU kernel runs serially under the flag (any overload, out= too).
bool serialUnderTheFlag(const c10::OperatorHandle& op) {
  return named(op, {"aten::index_put_", "aten::index_put", "aten::_index_put_impl_",
                    "aten::_index_put_impl", "aten::_unsafe_index_put", "aten::put_", "aten::put",
                    "aten::index_copy_", "aten::index_copy"});
}

// Whether the CPU kernel of `op` raises under the flag, for `arguments`:
// put_ with accumulate=False, max_unpool2d/3d.
bool alertsUnderTheFlag(const c10::OperatorHandle& op, const torch::jit::Stack& arguments) {
  if (named(op, {"aten::put_", "aten::put"})) {
    return arguments.size() > 3 && arguments[3].isBool() && !arguments[3].toBool();
  }
  return named(op, {"aten::max_unpool2d", "aten::max_unpool3d"});
}

}  // namespace

DeterministicAlgorithmsAsCalled::DeterministicAlgorithmsAsCalled(
    const ir::Node& source, const c10::OperatorHandle& op, const torch::jit::Stack& arguments) {
  if (source.deterministic && serialUnderTheFlag(op)) serial_.emplace(1);
  // A call under the flag without warn_only raised: its node never runs.
  const at::Context& context = at::globalContext();
  TORCH_CHECK(!context.deterministicAlgorithms() || context.deterministicAlgorithmsWarnOnly() ||
                  !alertsUnderTheFlag(op, arguments),
              op.operator_name(),
              " was called without torch.use_deterministic_algorithms(True) (or with "
              "warn_only=True), which was set before its graph ran: its CPU kernel refuses to "
              "run under the setting it reads then. Synchronise (torch.ipu.synchronize(), or "
              "read a result) before changing the setting.");
}

}  // namespace poptorch::runtime
