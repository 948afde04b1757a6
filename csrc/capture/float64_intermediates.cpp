// Ops whose composite kernels compute intermediates in float64 for float32
// inputs, as the CPU does, and give results that are not float64.
//
// linalg.pinv and linalg.matrix_rank make their tolerances (atol, rtol) float64
// tensors on the input's device, whatever the input's dtype, and compare the
// singular values with them in float64 (at::max of a float64 tolerance and a
// float32 bound promotes). The ipu refuses float64 tensors, so these ops were
// refused for float32 inputs. Here their kernels run under a
// Float64Intermediates: the tolerances are ipu float64 tensors that the host
// kernels compute as the CPU does, so the results are the CPU's; the results
// themselves are float32 (or int64 ranks), and the user never holds a float64
// tensor. Registered above autograd (so that the composite's own ops record
// their derivatives) and on the backend key (inference mode skips autograd;
// linalg_pinv.atol_rtol_tensor, which has a derivative formula, runs its kernel
// there).
#include <ATen/ops/linalg_matrix_rank_native.h>
#include <ATen/ops/linalg_pinv_native.h>
#include <torch/library.h>

#include <optional>
#include <utility>

#include "device/ipu_tensor.h"

namespace poptorch::capture {
namespace {

template <typename Signature, Signature* Kernel>
struct WithFloat64Intermediates;

template <typename Result, typename... Args, Result (*Kernel)(Args...)>
struct WithFloat64Intermediates<Result(Args...), Kernel> {
  static Result call(Args... args) {
    const device::Float64Intermediates allowed;
    return Kernel(std::forward<Args>(args)...);
  }
};

using OptionalTensor = const std::optional<at::Tensor>&;
using TensorTolerances = at::Tensor(const at::Tensor&, OptionalTensor, OptionalTensor, bool);
using TensorTolerancesOut = at::Tensor&(const at::Tensor&, OptionalTensor, OptionalTensor, bool,
                                        at::Tensor&);
using FloatTolerances = at::Tensor(const at::Tensor&, std::optional<double>,
                                   std::optional<double>, bool);
using FloatTolerancesOut = at::Tensor&(const at::Tensor&, std::optional<double>,
                                       std::optional<double>, bool, at::Tensor&);
using FloatTolerance = at::Tensor(const at::Tensor&, double, bool);
using FloatToleranceOut = at::Tensor&(const at::Tensor&, double, bool, at::Tensor&);
using TensorTolerance = at::Tensor(const at::Tensor&, const at::Tensor&, bool);
using TensorToleranceOut = at::Tensor&(const at::Tensor&, const at::Tensor&, bool, at::Tensor&);

template <typename Signature, Signature* Kernel>
auto kernel() {
  return TORCH_FN((WithFloat64Intermediates<Signature, Kernel>::call));
}

// The overloads whose kernels are composite implicit (the tolerances of floats
// are made before any other kernel runs).
void registerImplicit(torch::Library& m) {
  m.impl("linalg_pinv.atol_rtol_float", kernel<FloatTolerances, at::native::linalg_pinv>());
  m.impl("linalg_pinv.atol_rtol_float_out",
         kernel<FloatTolerancesOut, at::native::linalg_pinv_out>());
  m.impl("linalg_pinv", kernel<FloatTolerance, at::native::linalg_pinv>());
  m.impl("linalg_pinv.out", kernel<FloatToleranceOut, at::native::linalg_pinv_out>());
  m.impl("linalg_pinv.rcond_tensor", kernel<TensorTolerance, at::native::linalg_pinv>());
  m.impl("linalg_pinv.out_rcond_tensor",
         kernel<TensorToleranceOut, at::native::linalg_pinv_out>());
  m.impl("linalg_matrix_rank.atol_rtol_tensor",
         kernel<TensorTolerances, at::native::linalg_matrix_rank>());
  m.impl("linalg_matrix_rank.atol_rtol_tensor_out",
         kernel<TensorTolerancesOut, at::native::linalg_matrix_rank_out>());
  m.impl("linalg_matrix_rank.atol_rtol_float",
         kernel<FloatTolerances, at::native::linalg_matrix_rank>());
  m.impl("linalg_matrix_rank.atol_rtol_float_out",
         kernel<FloatTolerancesOut, at::native::linalg_matrix_rank_out>());
  m.impl("linalg_matrix_rank", kernel<FloatTolerance, at::native::linalg_matrix_rank>());
  m.impl("linalg_matrix_rank.out", kernel<FloatToleranceOut, at::native::linalg_matrix_rank_out>());
  m.impl("linalg_matrix_rank.tol_tensor", kernel<TensorTolerance, at::native::linalg_matrix_rank>());
  m.impl("linalg_matrix_rank.out_tol_tensor",
         kernel<TensorToleranceOut, at::native::linalg_matrix_rank_out>());
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, AutogradIPU, m) { registerImplicit(m); }

TORCH_LIBRARY_IMPL(aten, IPU, m) {
  registerImplicit(m);
  m.impl("linalg_pinv.atol_rtol_tensor", kernel<TensorTolerances, at::native::linalg_pinv>());
  m.impl("linalg_pinv.atol_rtol_tensor_out",
         kernel<TensorTolerancesOut, at::native::linalg_pinv_out>());
}

}  // namespace poptorch::capture
