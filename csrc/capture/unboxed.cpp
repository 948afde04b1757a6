// Unboxed capture kernels for the hottest operators (see unboxed.h). One
// template serves every operator: its arguments go to capture borrowed, and
// anything capture does not do that way (a step captured whole, an op run on
// the host) takes the boxed fallback, as before.
#include "capture/unboxed.h"

#include <ATen/core/boxing/KernelFunction.h>
#include <ATen/ops/_log_softmax_backward_data_ops.h>
#include <ATen/ops/_log_softmax_ops.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_ops.h>
#include <ATen/ops/_softmax_backward_data_ops.h>
#include <ATen/ops/_softmax_ops.h>
#include <ATen/ops/add_ops.h>
#include <ATen/ops/addcmul_ops.h>
#include <ATen/ops/addmm_ops.h>
#include <ATen/ops/bernoulli_ops.h>
#include <ATen/ops/bmm_ops.h>
#include <ATen/ops/convolution_backward_ops.h>
#include <ATen/ops/convolution_ops.h>
#include <ATen/ops/div_ops.h>
#include <ATen/ops/embedding_dense_backward_ops.h>
#include <ATen/ops/fill_ops.h>
#include <ATen/ops/gelu_backward_ops.h>
#include <ATen/ops/gelu_ops.h>
#include <ATen/ops/index_select_ops.h>
#include <ATen/ops/max_pool2d_with_indices_backward_ops.h>
#include <ATen/ops/max_pool2d_with_indices_ops.h>
#include <ATen/ops/mean_ops.h>
#include <ATen/ops/mm_ops.h>
#include <ATen/ops/mul_ops.h>
#include <ATen/ops/native_batch_norm_backward_ops.h>
#include <ATen/ops/native_batch_norm_ops.h>
#include <ATen/ops/native_layer_norm_backward_ops.h>
#include <ATen/ops/native_layer_norm_ops.h>
#include <ATen/ops/nll_loss_backward_ops.h>
#include <ATen/ops/nll_loss_forward_ops.h>
#include <ATen/ops/relu_ops.h>
#include <ATen/ops/sigmoid_ops.h>
#include <ATen/ops/sub_ops.h>
#include <ATen/ops/sum_ops.h>
#include <ATen/ops/tanh_ops.h>
#include <ATen/ops/threshold_backward_ops.h>
#include <ATen/ops/where_ops.h>
#include <ATen/ops/zero_ops.h>

#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "capture/capture.h"

namespace poptorch::capture {

void BorrowedArguments::push(const at::Tensor& tensor) {
  values_.emplace_back(c10::MaybeOwnedTraits<at::Tensor>::createBorrow(tensor));
  borrowed_.push_back(true);
}

void BorrowedArguments::push(const std::optional<at::Tensor>& tensor) {
  if (!tensor) {
    values_.emplace_back();
    borrowed_.push_back(false);
    return;
  }
  push(*tensor);
}

BorrowedArguments::~BorrowedArguments() {
  for (size_t i = 0; i < values_.size(); ++i) {
    if (borrowed_[i]) c10::MaybeOwnedTraits<at::Tensor>::destroyBorrow(values_[i].toTensor());
  }
}

namespace {

// The `index`-th of `args`, which is a written tensor argument.
template <class... Args>
at::Tensor& writtenArgument(size_t index, Args&... args) {
  at::Tensor* found = nullptr;
  size_t i = 0;
  (
      [&](auto& argument) {
        if constexpr (std::is_same_v<std::decay_t<decltype(argument)>, at::Tensor> &&
                      !std::is_const_v<std::remove_reference_t<decltype(argument)>>) {
          if (i == index) found = &argument;
        }
        ++i;
      }(args),
      ...);
  TORCH_INTERNAL_ASSERT(found != nullptr, "argument ", index, " is not a written tensor");
  return *found;
}

// An unboxed kernel's return value from capture's results.
template <class Ret>
struct FromResults {
  static Ret call(CapturedResults& results) { return std::move(results[0]).to<Ret>(); }
};

template <class... Types>
struct FromResults<std::tuple<Types...>> {
  static std::tuple<Types...> call(CapturedResults& results) {
    return call(results, std::index_sequence_for<Types...>());
  }
  template <size_t... I>
  static std::tuple<Types...> call(CapturedResults& results, std::index_sequence<I...>) {
    return std::make_tuple(std::move(results[I]).template to<Types>()...);
  }
};

template <class Op, class Schema = typename Op::schema>
struct UnboxedCapture;

template <class Op, class Ret, class... Args>
struct UnboxedCapture<Op, Ret(Args...)> {
  static Ret call(c10::DispatchKeySet keys, Args... args) {
    static const UnboxedOp unboxed(Op::name, Op::overload_name);
    const c10::OperatorHandle& op = unboxed.op;
    std::optional<CapturedResults> results;
    {
      const BorrowedArguments arguments(args...);
      results = captureBorrowed(unboxed, arguments.values());
    }
    if (!results) {
      return c10::impl::BoxedKernelWrapper<Ret(Args...)>::call(
          c10::BoxedKernel::makeFromFunction<&ipuFallback>(), op, keys,
          std::forward<Args>(args)...);
    }
    if constexpr (std::is_same_v<Ret, at::Tensor&>) {
      static const size_t written = writtenArgumentIndex(op.schema(), 0);
      return writtenArgument(written, args...);
    } else {
      return FromResults<Ret>::call(*results);
    }
  }
};

template <class Op>
void registerUnboxed(torch::Library& library) {
  const std::string name = std::string(Op::name).substr(std::string("aten::").size());
  const std::string overload = Op::overload_name;
  const std::string qualified = overload.empty() ? name : name + "." + overload;
  library.impl(qualified.c_str(), TORCH_FN(UnboxedCapture<Op>::call));
}

}  // namespace

void registerUnboxedKernels(torch::Library& library) {
  // Ops that reach the boxed fallback (their CPU kernel is what runs), most
  // frequent in the benchmarks' models first: layers forward and backward,
  // losses, and the optimisers' in-place updates.
  registerUnboxed<at::_ops::add_Tensor>(library);
  registerUnboxed<at::_ops::add__Tensor>(library);
  registerUnboxed<at::_ops::sub_Tensor>(library);
  registerUnboxed<at::_ops::mul_Tensor>(library);
  registerUnboxed<at::_ops::mul__Tensor>(library);
  registerUnboxed<at::_ops::div_Tensor>(library);
  registerUnboxed<at::_ops::div__Tensor>(library);
  registerUnboxed<at::_ops::addcmul_>(library);
  registerUnboxed<at::_ops::zero_>(library);
  registerUnboxed<at::_ops::fill__Scalar>(library);
  registerUnboxed<at::_ops::where_self>(library);
  registerUnboxed<at::_ops::relu>(library);
  registerUnboxed<at::_ops::threshold_backward>(library);
  registerUnboxed<at::_ops::gelu>(library);
  registerUnboxed<at::_ops::gelu_backward>(library);
  registerUnboxed<at::_ops::tanh>(library);
  registerUnboxed<at::_ops::sigmoid>(library);
  registerUnboxed<at::_ops::bernoulli__float>(library);
  registerUnboxed<at::_ops::mm>(library);
  registerUnboxed<at::_ops::addmm>(library);
  registerUnboxed<at::_ops::bmm>(library);
  registerUnboxed<at::_ops::sum_dim_IntList>(library);
  registerUnboxed<at::_ops::mean_dim>(library);
  registerUnboxed<at::_ops::_softmax>(library);
  registerUnboxed<at::_ops::_softmax_backward_data>(library);
  registerUnboxed<at::_ops::_log_softmax>(library);
  registerUnboxed<at::_ops::_log_softmax_backward_data>(library);
  registerUnboxed<at::_ops::nll_loss_forward>(library);
  registerUnboxed<at::_ops::nll_loss_backward>(library);
  registerUnboxed<at::_ops::native_layer_norm>(library);
  registerUnboxed<at::_ops::native_layer_norm_backward>(library);
  registerUnboxed<at::_ops::_scaled_dot_product_flash_attention_for_cpu>(library);
  registerUnboxed<at::_ops::index_select>(library);
  registerUnboxed<at::_ops::embedding_dense_backward>(library);
  registerUnboxed<at::_ops::convolution>(library);
  registerUnboxed<at::_ops::convolution_backward>(library);
  registerUnboxed<at::_ops::native_batch_norm>(library);
  registerUnboxed<at::_ops::native_batch_norm_backward>(library);
  registerUnboxed<at::_ops::max_pool2d_with_indices>(library);
  registerUnboxed<at::_ops::max_pool2d_with_indices_backward>(library);
}

}  // namespace poptorch::capture
