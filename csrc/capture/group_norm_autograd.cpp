// The gradient of group_norm in the CPU's layout.
//
// PyTorch's derivative of native_group_norm (derivatives.yaml) hands its
// backward kernel the output gradient and the input in the input's layout on
// the CPU, and contiguous on every other device but XPU, so the ipu gave a
// channels-last input a contiguous input gradient where the CPU gives a
// channels-last one (with values equal, up to rounding: the kernels differ).
// The ipu runs the CPU's kernels, so it takes the CPU's branch: its autograd
// kernel runs PyTorch's (forward, forward-mode derivative, saved tensors), then
// puts a node in front of the NativeGroupNormBackward0 it made that runs the
// backward kernel as the CPU's branch does. With grad mode on (double backward)
// the formula is PyTorch's differentiable one, the same for every device: the
// node then runs PyTorch's.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/native_group_norm.h>
#include <ATen/ops/native_group_norm_backward.h>
#include <c10/core/GradMode.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/generated/Functions.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/library.h>

#include <array>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "capture/own_autograd_kernel.h"

namespace poptorch::capture {
namespace {

using torch::autograd::Edge;
using torch::autograd::Node;
using torch::autograd::variable_list;
using torch::autograd::generated::NativeGroupNormBackward0;

class GroupNormBackwardInInputLayout : public Node {
 public:
  explicit GroupNormBackwardInInputLayout(c10::intrusive_ptr<NativeGroupNormBackward0> formula)
      : Node(formula->sequence_nr(), torch::autograd::edge_list(formula->next_edges())),
        formula_(std::move(formula)) {
    for (uint32_t i = 0; i < formula_->num_inputs(); ++i) {
      input_metadata_.push_back(formula_->input_metadata(i));
    }
  }

  std::string name() const override { return formula_->name(); }

  variable_list apply(variable_list&& grads) override {
    if (c10::GradMode::is_enabled() || grads[1].defined() || grads[2].defined() ||
        !grads[0].defined()) {
      return formula_->apply(std::move(grads));
    }
    const at::Tensor input = formula_->input_.unpack();
    const at::Tensor weight = formula_->weight_.unpack();
    const at::Tensor mean = formula_->result1_.unpack(formula_);
    const at::Tensor rstd = formula_->result2_.unpack(formula_);
    const std::array<bool, 3> mask = {task_should_compute_output(0), task_should_compute_output(1),
                                      task_should_compute_output(2)};
    if (!mask[0] && !mask[1] && !mask[2]) return variable_list(3);
    const c10::MemoryFormat layout = input.suggest_memory_format();
    auto [grad_input, grad_weight, grad_bias] = at::native_group_norm_backward_symint(
        grads[0].contiguous(layout), input.contiguous(layout), mean, rstd,
        weight.defined() ? std::optional<at::Tensor>(weight) : std::nullopt, formula_->N,
        formula_->C, formula_->HxW, formula_->group, mask);
    return {mask[0] ? grad_input : at::Tensor(), mask[1] ? grad_weight : at::Tensor(),
            mask[2] ? grad_bias : at::Tensor()};
  }

  void release_variables() override { formula_->release_variables(); }

 private:
  c10::intrusive_ptr<NativeGroupNormBackward0> formula_;
};

std::tuple<at::Tensor, at::Tensor, at::Tensor> nativeGroupNorm(
    c10::DispatchKeySet keys, const at::Tensor& input, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, c10::SymInt n, c10::SymInt c, c10::SymInt hxw,
    int64_t group, double eps) {
  auto results =
      at::_ops::native_group_norm::redispatch(ownAutogradKernel(keys), input, weight, bias,
                                              std::move(n), std::move(c), std::move(hxw), group, eps);
  if (input.suggest_memory_format() == c10::MemoryFormat::Contiguous) return results;
  auto* made = dynamic_cast<NativeGroupNormBackward0*>(std::get<0>(results).grad_fn().get());
  if (made == nullptr) return results;
  const auto formula = c10::intrusive_ptr<NativeGroupNormBackward0>::reclaim_copy(made);
  auto in_input_layout = c10::make_intrusive<GroupNormBackwardInInputLayout>(formula);
  for (const at::Tensor* result :
       {&std::get<0>(results), &std::get<1>(results), &std::get<2>(results)}) {
    if (result->grad_fn().get() == made) {
      torch::autograd::impl::set_gradient_edge(*result,
                                               Edge(in_input_layout, result->output_nr()));
    }
  }
  return results;
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, AutogradIPU, m) {
  m.impl("native_group_norm", TORCH_FN(nativeGroupNorm));
}

}  // namespace poptorch::capture
