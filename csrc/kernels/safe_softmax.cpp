// poptorch::_safe_softmax(self, dim, dtype): aten::_safe_softmax (softmax
// whose rows of -inf alone give zeros, not NaN: the attention's math path,
// which attention with dropout takes on the CPU) in one kernel and a scan.
//
// aten's is a decomposition of four kernels: softmax, a boolean tensor of
// self == -inf, `all` of it along dim, and `where` of the softmax and zero.
// The boolean reduction runs a scalar loop (~2.6 ns an element on this
// machine's AMD CPU, more than the softmax), and the `where` is a third pass
// over the result. Here the softmax is aten's kernel, and the rows are found
// by a scan that stops at a row's first element that is not -inf (the first,
// in a causal or padding mask's rows that see anything); a row of -inf alone
// is zeroed. The values are aten's bit for bit. Other layouts than a
// contiguous self reduced along its last dimension run aten's decomposition.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/_safe_softmax.h>
#include <ATen/ops/softmax.h>
#include <torch/library.h>

#include <algorithm>
#include <limits>
#include <optional>

namespace poptorch::kernels {
namespace {

bool fastPathApplies(const at::Tensor& self, int64_t dim, std::optional<at::ScalarType> dtype) {
  return self.scalar_type() == at::kFloat && (!dtype || *dtype == at::kFloat) &&
         self.dim() > 0 && at::maybe_wrap_dim(dim, self.dim()) == self.dim() - 1 &&
         self.is_contiguous() && self.numel() > 0;
}

// Zeroes the rows of `out` whose row of `self` is -inf alone.
void zeroRowsOfMinusInfinity(const at::Tensor& self, at::Tensor& out) {
  const int64_t length = self.size(-1);
  const int64_t rows = self.numel() / length;
  const float* in = self.const_data_ptr<float>();
  float* result = out.mutable_data_ptr<float>();
  constexpr float kMinusInfinity = -std::numeric_limits<float>::infinity();
  // A row usually ends its scan at its first element: a grain of many rows.
  at::parallel_for(0, rows, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const float* first = in + row * length;
      if (std::all_of(first, first + length, [](float x) { return x == kMinusInfinity; })) {
        std::fill_n(result + row * length, length, 0.0f);
      }
    }
  });
}

at::Tensor safeSoftmax(const at::Tensor& self, int64_t dim, std::optional<at::ScalarType> dtype) {
  if (!fastPathApplies(self, dim, dtype)) return at::_safe_softmax(self, dim, dtype);
  at::Tensor out = at::softmax(self, dim, dtype);
  if (!out.is_contiguous() || out.scalar_type() != at::kFloat) {
    return at::_safe_softmax(self, dim, dtype);
  }
  zeroRowsOfMinusInfinity(self, out);
  return out;
}

at::Tensor safeSoftmaxMeta(const at::Tensor& self, int64_t dim,
                           std::optional<at::ScalarType> dtype) {
  return at::_safe_softmax(self, dim, dtype);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(poptorch, m) {
  m.def("_safe_softmax(Tensor self, int dim, ScalarType? dtype=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(poptorch, CPU, m) { m.impl("_safe_softmax", TORCH_FN(safeSoftmax)); }

TORCH_LIBRARY_IMPL(poptorch, Meta, m) { m.impl("_safe_softmax", TORCH_FN(safeSoftmaxMeta)); }

}  // namespace poptorch::kernels
