// Views of ipu tensors get the autograd view metadata the CPU gives them.
//
// c10's Device::supports_as_strided() is hard-coded false for DeviceType::IPU
// (it was written for a backend without strided storage), so PyTorch's
// ADInplaceOrView kernels give every view of an ipu tensor a view function, and
// after an in-place write autograd rebuilds a view's grad_fn by replaying the
// chain of view ops from the root base, where the CPU uses one as_strided (an
// AsStridedBackward0). The replay fails where the CPU does not: on a base whose
// metadata changed in place since (squeeze_), on a base detach_()ed since, on
// an integer tensor that autograd tracks after a write from a tensor that
// requires grad. Our tensors are strided like the CPU's, so after the autograd
// kernel of each view op the view's metadata is made the CPU's: a view function
// only where the CPU has one, views that change what as_strided cannot express
// (view_as_real, _conj, ...) and the views made from those, built as
// torch/csrc/autograd/variable.cpp's ViewInfo::chain builds it for the CPU.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/_conj.h>
#include <ATen/ops/_neg_view.h>
#include <ATen/ops/view_as_complex.h>
#include <ATen/ops/view_as_real.h>
#include <c10/core/AutogradState.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/library.h>

#include <string_view>

#include "capture/own_autograd_kernel.h"

namespace poptorch::capture {
namespace {

using torch::autograd::DifferentiableViewMeta;
using torch::autograd::ViewFunc;
using torch::autograd::ViewInfo;

// The views whose metadata as_strided cannot express, which have a view
// function on the CPU too (torchgen's VIEW_FUNCTIONS_WITH_METADATA_CHANGE,
// less the nested-tensor ones), with the inverse that undoes each
// (aten/src/ATen/FunctionalInverses.cpp, the view-returning mode).
using Inverse = at::Tensor (*)(const at::Tensor&);
Inverse inverseOfMetadataView(std::string_view op) {
  if (op == "aten::view_as_real") return [](const at::Tensor& v) { return at::view_as_complex(v); };
  if (op == "aten::view_as_complex") {
    return [](const at::Tensor& v) { return at::view_as_real(v.resolve_conj()); };
  }
  if (op == "aten::_conj") return [](const at::Tensor& v) { return at::_conj(v); };
  if (op == "aten::_neg_view") return [](const at::Tensor& v) { return at::_neg_view(v); };
  return nullptr;
}

struct Geometry {
  explicit Geometry(const at::Tensor& t)
      : sizes(t.sym_sizes().vec()),
        strides(t.sym_strides().vec()),
        offset(t.sym_storage_offset()) {}
  at::Tensor of(const at::Tensor& t) const { return t.as_strided_symint(sizes, strides, offset); }
  std::vector<c10::SymInt> sizes;
  std::vector<c10::SymInt> strides;
  c10::SymInt offset;
};

// A metadata view of a view that has no view function: as_strided to the
// base's geometry, then the op (boxed, with its other arguments), as the CPU's
// chain of an as_strided matching the base and the op's own view function.
class StridedThenOp final : public ViewFunc {
 public:
  StridedThenOp(const at::Tensor& base, c10::OperatorHandle op, std::vector<c10::IValue> args)
      : base_(base), op_(std::move(op)), args_(std::move(args)) {}

  at::Tensor operator()(const at::Tensor& root) const override {
    torch::jit::Stack stack{base_.of(root)};
    stack.insert(stack.end(), args_.begin(), args_.end());
    op_.callBoxed(stack);
    return stack.front().toTensor();
  }

  std::unique_ptr<ViewFunc> clone_and_set(
      std::optional<std::vector<c10::SymInt>> /*symints*/,
      std::optional<std::vector<at::Tensor>> /*tensors*/) const override {
    return std::make_unique<StridedThenOp>(*this);
  }

 private:
  Geometry base_;
  c10::OperatorHandle op_;
  std::vector<c10::IValue> args_;  // the op's arguments after its base
};

const ViewInfo* viewInfo(const at::Tensor& t, bool forward) {
  const DifferentiableViewMeta* meta = torch::autograd::impl::get_view_autograd_meta(t);
  if (meta == nullptr) return nullptr;
  if (forward) return meta->has_fw_view() ? &meta->get_forward_view() : nullptr;
  return meta->has_bw_view() ? &meta->get_backward_view() : nullptr;
}

// Makes `view`'s (forward or backward) view info what ViewInfo::chain gives on
// the CPU for `view` made by `op` from `base`. The info is the view's own, made
// by this thread's call that returned it, so nothing else reads it yet (the
// accessors are const only to keep other code from changing it).
void matchTheCpu(const at::Tensor& base, const at::Tensor& view, bool forward,
                 const c10::OperatorHandle& op, const std::vector<c10::IValue>& args) {
  const ViewInfo* own = viewInfo(view, forward);
  if (own == nullptr) return;
  auto& info = const_cast<ViewInfo&>(*own);
  const ViewInfo* parent = viewInfo(base, forward);
  const Inverse inverse = inverseOfMetadataView(op.schema().name());
  if (inverse != nullptr) {
    // Without a parent, or with a parent that has a view function, the ipu's
    // info is the CPU's already.
    if (parent == nullptr || parent->has_view_fn()) return;
    info.view_fn_ = std::make_unique<StridedThenOp>(base, op, args);
    info.rev_view_fn_ = [inverse, root = Geometry(parent->base_)](const at::Tensor& v) {
      return root.of(inverse(v));
    };
  } else if (parent != nullptr && parent->has_view_fn()) {
    ViewInfo chained = parent->chain(base, view);
    info.view_fn_ = std::move(chained.view_fn_);
    info.rev_view_fn_ = std::move(chained.rev_view_fn_);
  } else {
    info.view_fn_ = nullptr;
    info.rev_view_fn_ = nullptr;
  }
}

void matchTheCpu(const at::Tensor& base, const at::Tensor& view, const c10::OperatorHandle& op,
                 const std::vector<c10::IValue>& args) {
  const DifferentiableViewMeta* meta = torch::autograd::impl::get_view_autograd_meta(view);
  // With view replay on (torch.autograd._force_original_view_tracking), the CPU
  // gives every view its view functions too: the ipu's are the CPU's already.
  if (meta == nullptr || c10::AutogradState::get_tls_state().get_view_replay_enabled()) return;
  matchTheCpu(base, view, /*forward=*/false, op, args);
  // A shared info serves both directions.
  if (!meta->shared_view_info()) matchTheCpu(base, view, /*forward=*/true, op, args);
}

// The AutogradIPU kernel of a view op: the op's own autograd kernel (reached
// through AutogradOther, which every backend without a key of its own shares),
// then the CPU's view metadata on its outputs.
void viewWithTheCpusMetadata(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                             torch::jit::Stack* stack) {
  const size_t num_args = op.schema().arguments().size();
  const at::Tensor base = (*stack)[stack->size() - num_args].toTensor();
  std::vector<c10::IValue> args;
  if (inverseOfMetadataView(op.schema().name()) != nullptr) {
    args.assign(stack->end() - static_cast<std::ptrdiff_t>(num_args) + 1, stack->end());
  }
  op.redispatchBoxed(ownAutogradKernel(keys), stack);
  for (size_t i = stack->size() - op.schema().returns().size(); i < stack->size(); ++i) {
    const c10::IValue& result = (*stack)[i];
    if (result.isTensor()) {
      matchTheCpu(base, result.toTensor(), op, args);
    } else if (result.isTensorList()) {
      for (const at::Tensor& view : result.toTensorVector()) matchTheCpu(base, view, op, args);
    }
  }
}

// A view op of aten: an ADInplaceOrView kernel (which attaches view metadata to
// results that alias its first argument, written by none), and an autograd
// kernel of its own (not a composite that decomposes into other views).
bool isViewOp(const c10::OperatorHandle& op) {
  const c10::FunctionSchema& schema = op.schema();
  if (schema.name().rfind("aten::", 0) != 0 || schema.arguments().empty() ||
      !op.hasKernelForDispatchKey(c10::DispatchKey::ADInplaceOrView) ||
      !op.hasKernelForDispatchKey(c10::DispatchKey::Autograd) ||
      op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd) ||
      op.hasKernelForDispatchKey(c10::DispatchKey::AutogradIPU)) {
    return false;
  }
  const c10::AliasInfo* self = schema.arguments().front().alias_info();
  if (self == nullptr || self->isWrite() || schema.returns().empty()) return false;
  for (const c10::Argument& result : schema.returns()) {
    if (result.alias_info() == nullptr || result.alias_info()->isWrite()) return false;
  }
  return true;
}

struct ViewOpsWithTheCpusMetadata {
  ViewOpsWithTheCpusMetadata()
      : library(torch::Library::IMPL, "aten", c10::DispatchKey::AutogradIPU, __FILE__, __LINE__) {
    auto& dispatcher = c10::Dispatcher::singleton();
    for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
      const c10::OperatorHandle op = *dispatcher.findOp(name);
      if (!isViewOp(op)) continue;
      const std::string qualified = name.overload_name.empty()
                                        ? name.name.substr(6)
                                        : name.name.substr(6) + "." + name.overload_name;
      library.impl(qualified.c_str(),
                   torch::CppFunction::makeFromBoxedFunction<&viewWithTheCpusMetadata>());
    }
  }
  torch::Library library;
};
const ViewOpsWithTheCpusMetadata view_ops_with_the_cpus_metadata;

}  // namespace
}  // namespace poptorch::capture
