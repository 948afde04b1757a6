// poptorch::max_pool2d_with_indices and its backward: aten's ops with the
// same schemas, and for the most common pooling, 2x2 windows with stride 2
// and no padding over a contiguous (NCHW) float32 tensor, eight windows per
// AVX2 pass.
//
// PyTorch's CPU kernel for an NCHW tensor (cpu_max_pool) is a scalar loop
// that works out each window's bounds and index arithmetic in 64-bit integers:
// ~150 instructions per output, a third of the seed CNN's inference step
// (eager pays the same). The backward zero-fills the gradient and adds each
// output's gradient at its index, one element at a time.
//
// Values and indices are aten's bit for bit: a window's elements are visited
// in aten's order (row by row), the first one is the start and a later one
// replaces it when it is greater or NaN, so ties keep the first and a NaN
// wins; the backward writes 0 + gradient where aten adds the gradient to a
// zero (so -0 becomes +0 as there). An index outside its window (indices not
// made by the forward) takes aten's kernel, which says what is wrong. Other
// shapes, parameters, dtypes and layouts, and machines without AVX2, run
// aten's kernels.
#include <ATen/core/Tensor.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/max_pool2d_with_indices.h>
#include <ATen/ops/max_pool2d_with_indices_backward.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

#include "kernels/float_vectors.h"

namespace poptorch::kernels {
namespace {

using float_vectors::kLanes;

// True when every value of an int[2] argument (one value stands for both) is v.
bool allEqual(at::IntArrayRef values, int64_t v) {
  if (values.size() != 1 && values.size() != 2) return false;
  for (int64_t x : values) {
    if (x != v) return false;
  }
  return true;
}

// The sizes of a pooling that the fast kernels take: planes of height x
// width pooled into out_height x out_width.
struct Pooling {
  int64_t planes, height, width, out_height, out_width;
};

// The pooling of `input_sizes` (N, C, H, W or C, H, W) when the arguments are
// 2x2 windows with stride 2, no padding, no dilation, and the windows lie
// inside the input; false otherwise.
bool twoByTwo(at::IntArrayRef input_sizes, at::IntArrayRef kernel_size, at::IntArrayRef stride,
              at::IntArrayRef padding, at::IntArrayRef dilation, bool ceil_mode, Pooling& p) {
  if (!float_vectors::hasAvx2() || (input_sizes.size() != 3 && input_sizes.size() != 4) ||
      !allEqual(kernel_size, 2) || !(stride.empty() || allEqual(stride, 2)) ||
      !allEqual(padding, 0) || !allEqual(dilation, 1)) {
    return false;
  }
  p.height = input_sizes[input_sizes.size() - 2];
  p.width = input_sizes.back();
  p.planes = 1;
  for (size_t d = 0; d + 2 < input_sizes.size(); ++d) p.planes *= input_sizes[d];
  // ceil_mode adds a partial window at an odd edge: aten's kernel takes it.
  if (p.planes == 0 || p.height < 2 || p.width < 2 ||
      (ceil_mode && (p.height % 2 != 0 || p.width % 2 != 0)) ||
      p.height * p.width > std::numeric_limits<int32_t>::max()) {
    return false;
  }
  p.out_height = p.height / 2;
  p.out_width = p.width / 2;
  return true;
}

// Planes per task when split over threads: about float_vectors::kGrain elements.
int64_t planeGrain(const Pooling& p) {
  return std::max<int64_t>(1, float_vectors::kGrain / (p.height * p.width));
}

// The even and odd elements of in[0, 16), in order.
__attribute__((target("avx2,fma"))) inline void deinterleave(const float* in, __m256& even,
                                                             __m256& odd) {
  const __m256 lo = _mm256_loadu_ps(in), hi = _mm256_loadu_ps(in + kLanes);
  // Per 128-bit lane: lo0 lo2 hi0 hi2 | lo4 lo6 hi4 hi6; then 64-bit pairs 0 2 1 3.
  even = _mm256_castpd_ps(_mm256_permute4x64_pd(
      _mm256_castps_pd(_mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(2, 0, 2, 0))), 0xD8));
  odd = _mm256_castpd_ps(_mm256_permute4x64_pd(
      _mm256_castps_pd(_mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(3, 1, 3, 1))), 0xD8));
}

// max and where (offset in the window) take v when v > max or v is NaN.
__attribute__((target("avx2,fma"))) inline void visit(__m256 v, __m256i offset, __m256& max,
                                                      __m256i& where) {
  const __m256 take =
      _mm256_or_ps(_mm256_cmp_ps(v, max, _CMP_GT_OQ), _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  max = _mm256_blendv_ps(max, v, take);
  where = _mm256_blendv_epi8(where, offset, _mm256_castps_si256(take));
}

// Windows [ow, ow + 8) of output row oh of one plane.
__attribute__((target("avx2,fma"))) inline void poolEight(const float* plane, int64_t width,
                                                          int64_t oh, int64_t ow, float* out,
                                                          int64_t* indices) {
  const float* top = plane + 2 * oh * width + 2 * ow;
  __m256 a, b, c, d;
  deinterleave(top, a, b);
  deinterleave(top + width, c, d);
  __m256 max = a;
  __m256i where = _mm256_setzero_si256();
  const auto w = static_cast<int32_t>(width);
  visit(b, _mm256_set1_epi32(1), max, where);
  visit(c, _mm256_set1_epi32(w), max, where);
  visit(d, _mm256_set1_epi32(w + 1), max, where);
  _mm256_storeu_ps(out, max);
  // The window's first element: (2 oh) width + 2 (ow + lane).
  const __m256i first =
      _mm256_add_epi32(_mm256_set1_epi32(static_cast<int32_t>(2 * oh * width + 2 * ow)),
                       _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14));
  const __m256i index = _mm256_add_epi32(first, where);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(indices),
                      _mm256_cvtepi32_epi64(_mm256_castsi256_si128(index)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(indices + 4),
                      _mm256_cvtepi32_epi64(_mm256_extracti128_si256(index, 1)));
}

// One window, as aten's loop visits it.
void poolOne(const float* plane, int64_t width, int64_t oh, int64_t ow, float* out,
             int64_t* indices) {
  const int64_t first = 2 * oh * width + 2 * ow;
  const int64_t offsets[4] = {0, 1, width, width + 1};
  float max = plane[first];
  int64_t index = first;
  for (int k = 1; k < 4; ++k) {
    const float v = plane[first + offsets[k]];
    if (v > max || std::isnan(v)) {
      max = v;
      index = first + offsets[k];
    }
  }
  *out = max;
  *indices = index;
}

__attribute__((target("avx2,fma"))) void poolPlanes(const float* in, float* out, int64_t* indices,
                                                    const Pooling& p, int64_t begin, int64_t end) {
  for (int64_t plane = begin; plane < end; ++plane) {
    const float* input = in + plane * p.height * p.width;
    for (int64_t oh = 0; oh < p.out_height; ++oh) {
      const int64_t row = (plane * p.out_height + oh) * p.out_width;
      if (p.out_width < kLanes) {
        for (int64_t ow = 0; ow < p.out_width; ++ow) {
          poolOne(input, p.width, oh, ow, out + row + ow, indices + row + ow);
        }
        continue;
      }
      // The last eight windows may overlap the ones before: they are written
      // again with the same values.
      for (int64_t ow = 0;; ow += kLanes) {
        ow = std::min(ow, p.out_width - kLanes);
        poolEight(input, p.width, oh, ow, out + row + ow, indices + row + ow);
        if (ow + kLanes == p.out_width) break;
      }
    }
  }
}

std::tuple<at::Tensor, at::Tensor> maxPool(const at::Tensor& self, at::IntArrayRef kernel_size,
                                           at::IntArrayRef stride, at::IntArrayRef padding,
                                           at::IntArrayRef dilation, bool ceil_mode) {
  Pooling p;
  if (self.scalar_type() != at::kFloat || !self.is_contiguous() ||
      self.suggest_memory_format() != at::MemoryFormat::Contiguous ||
      !twoByTwo(self.sizes(), kernel_size, stride, padding, dilation, ceil_mode, p)) {
    return at::max_pool2d_with_indices(self, kernel_size, stride, padding, dilation, ceil_mode);
  }
  std::vector<int64_t> sizes = self.sizes().vec();
  sizes[sizes.size() - 2] = p.out_height;
  sizes.back() = p.out_width;
  at::Tensor out = at::empty(sizes, self.options());
  at::Tensor indices = at::empty(sizes, self.options().dtype(at::kLong));
  const float* in = self.const_data_ptr<float>();
  float* values = out.mutable_data_ptr<float>();
  int64_t* where = indices.mutable_data_ptr<int64_t>();
  at::parallel_for(0, p.planes, planeGrain(p), [&](int64_t begin, int64_t end) {
    poolPlanes(in, values, where, p, begin, end);
  });
  return {out, indices};
}

// The gradients of windows [ow, ow + 8) of output row oh into the two input
// rows they cover (every element of them); false when an index is outside its
// window.
__attribute__((target("avx2,fma"))) inline bool unpoolEight(const float* grad, const int64_t* index,
                                                            int64_t width, int64_t oh, int64_t ow,
                                                            float* plane) {
  const int64_t first = 2 * oh * width + 2 * ow;
  __m256i offset[2];  // index - window start, windows 0-3 and 4-7
  for (int half = 0; half < 2; ++half) {
    const __m256i start =
        _mm256_add_epi64(_mm256_set1_epi64x(first + 8 * half), _mm256_setr_epi64x(0, 2, 4, 6));
    offset[half] = _mm256_sub_epi64(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(index + 4 * half)), start);
  }
  // Which windows have their index at offset 0, 1, width, width + 1.
  const int64_t targets[4] = {0, 1, width, width + 1};
  __m256 hit[4];
  for (int k = 0; k < 4; ++k) {
    const __m256i t = _mm256_set1_epi64x(targets[k]);
    const __m256 lo = _mm256_castsi256_ps(_mm256_cmpeq_epi64(offset[0], t));
    const __m256 hi = _mm256_castsi256_ps(_mm256_cmpeq_epi64(offset[1], t));
    // The low halves of the 64-bit masks, windows 0-7 in order.
    hit[k] = _mm256_castpd_ps(_mm256_permute4x64_pd(
        _mm256_castps_pd(_mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(2, 0, 2, 0))), 0xD8));
  }
  const __m256 covered = _mm256_or_ps(_mm256_or_ps(hit[0], hit[1]), _mm256_or_ps(hit[2], hit[3]));
  if (_mm256_movemask_ps(covered) != 0xFF) return false;
  const __m256 g = _mm256_add_ps(_mm256_setzero_ps(), _mm256_loadu_ps(grad));
  float* const rows[2] = {plane + first, plane + first + width};
  for (int r = 0; r < 2; ++r) {
    const __m256 left = _mm256_and_ps(hit[2 * r], g), right = _mm256_and_ps(hit[2 * r + 1], g);
    // left0 right0 left1 right1 | left4 right4 ... per 128-bit lane.
    const __m256 lo = _mm256_unpacklo_ps(left, right), hi = _mm256_unpackhi_ps(left, right);
    _mm256_storeu_ps(rows[r], _mm256_permute2f128_ps(lo, hi, 0x20));
    _mm256_storeu_ps(rows[r] + kLanes, _mm256_permute2f128_ps(lo, hi, 0x31));
  }
  return true;
}

// One window's gradient, as unpoolEight writes it.
bool unpoolOne(float grad, int64_t index, int64_t width, int64_t oh, int64_t ow, float* plane) {
  const int64_t first = 2 * oh * width + 2 * ow;
  const int64_t offsets[4] = {0, 1, width, width + 1};
  bool covered = false;
  for (int64_t offset : offsets) {
    const bool hit = index - first == offset;
    plane[first + offset] = hit ? 0.0f + grad : 0.0f;
    covered = covered || hit;
  }
  return covered;
}

// Writes every element of planes [begin, end) of grad_input; false when an
// index is outside its window.
__attribute__((target("avx2,fma"))) bool unpoolPlanes(const float* grad, const int64_t* indices,
                                                      float* grad_input, const Pooling& p,
                                                      int64_t begin, int64_t end) {
  for (int64_t plane = begin; plane < end; ++plane) {
    float* input = grad_input + plane * p.height * p.width;
    for (int64_t oh = 0; oh < p.out_height; ++oh) {
      const int64_t row = (plane * p.out_height + oh) * p.out_width;
      if (p.out_width < kLanes) {
        for (int64_t ow = 0; ow < p.out_width; ++ow) {
          if (!unpoolOne(grad[row + ow], indices[row + ow], p.width, oh, ow, input)) return false;
        }
      } else {
        for (int64_t ow = 0;; ow += kLanes) {
          ow = std::min(ow, p.out_width - kLanes);  // see poolPlanes
          if (!unpoolEight(grad + row + ow, indices + row + ow, p.width, oh, ow, input)) {
            return false;
          }
          if (ow + kLanes == p.out_width) break;
        }
      }
      // An odd width's last column is in no window.
      if (p.width % 2 != 0) {
        input[(2 * oh) * p.width + p.width - 1] = 0.0f;
        input[(2 * oh + 1) * p.width + p.width - 1] = 0.0f;
      }
    }
    // As is an odd height's last row.
    if (p.height % 2 != 0) {
      std::fill_n(input + (p.height - 1) * p.width, p.width, 0.0f);
    }
  }
  return true;
}

// The pooling when the fast backward takes these arguments; false otherwise.
bool fastBackward(const at::Tensor& grad_output, const at::Tensor& self,
                  at::IntArrayRef kernel_size, at::IntArrayRef stride, at::IntArrayRef padding,
                  at::IntArrayRef dilation, bool ceil_mode, const at::Tensor& indices, Pooling& p) {
  if (self.scalar_type() != at::kFloat || grad_output.scalar_type() != at::kFloat ||
      indices.scalar_type() != at::kLong || !self.is_contiguous() ||
      self.suggest_memory_format() != at::MemoryFormat::Contiguous ||
      !grad_output.is_contiguous() || !indices.is_contiguous() ||
      !twoByTwo(self.sizes(), kernel_size, stride, padding, dilation, ceil_mode, p)) {
    return false;
  }
  std::vector<int64_t> pooled = self.sizes().vec();
  pooled[pooled.size() - 2] = p.out_height;
  pooled.back() = p.out_width;
  return grad_output.sizes().equals(pooled) && indices.sizes().equals(pooled);
}

// Writes all of grad_input (contiguous, self's shape); false when an index is
// outside its window.
bool unpool(const at::Tensor& grad_output, const at::Tensor& indices, const Pooling& p,
            at::Tensor& grad_input) {
  const float* grad = grad_output.const_data_ptr<float>();
  const int64_t* where = indices.const_data_ptr<int64_t>();
  float* result = grad_input.mutable_data_ptr<float>();
  std::atomic<bool> valid{true};
  at::parallel_for(0, p.planes, planeGrain(p), [&](int64_t begin, int64_t end) {
    if (!unpoolPlanes(grad, where, result, p, begin, end)) valid = false;
  });
  return valid;
}

at::Tensor maxPoolBackward(const at::Tensor& grad_output, const at::Tensor& self,
                           at::IntArrayRef kernel_size, at::IntArrayRef stride,
                           at::IntArrayRef padding, at::IntArrayRef dilation, bool ceil_mode,
                           const at::Tensor& indices) {
  Pooling p;
  if (fastBackward(grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices,
                   p)) {
    at::Tensor grad_input = at::empty(self.sizes(), self.options());
    if (unpool(grad_output, indices, p, grad_input)) return grad_input;
  }
  return at::max_pool2d_with_indices_backward(grad_output, self, kernel_size, stride, padding,
                                              dilation, ceil_mode, indices);
}

at::Tensor& maxPoolBackwardOut(const at::Tensor& grad_output, const at::Tensor& self,
                               at::IntArrayRef kernel_size, at::IntArrayRef stride,
                               at::IntArrayRef padding, at::IntArrayRef dilation, bool ceil_mode,
                               const at::Tensor& indices, at::Tensor& grad_input) {
  Pooling p;
  if (fastBackward(grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices,
                   p) &&
      grad_input.scalar_type() == at::kFloat) {
    at::native::resize_output(grad_input, self.sizes());
    // It reads each gradient and index after writing elements of other windows.
    if (grad_input.is_contiguous() && float_vectors::disjoint(grad_input, grad_output) &&
        float_vectors::disjoint(grad_input, indices) &&
        unpool(grad_output, indices, p, grad_input)) {
      return grad_input;
    }
  }
  return at::max_pool2d_with_indices_backward_out(grad_input, grad_output, self, kernel_size,
                                                  stride, padding, dilation, ceil_mode, indices);
}

std::tuple<at::Tensor, at::Tensor> maxPoolMeta(const at::Tensor& self, at::IntArrayRef kernel_size,
                                               at::IntArrayRef stride, at::IntArrayRef padding,
                                               at::IntArrayRef dilation, bool ceil_mode) {
  return at::max_pool2d_with_indices(self, kernel_size, stride, padding, dilation, ceil_mode);
}

at::Tensor maxPoolBackwardMeta(const at::Tensor& grad_output, const at::Tensor& self,
                               at::IntArrayRef kernel_size, at::IntArrayRef stride,
                               at::IntArrayRef padding, at::IntArrayRef dilation, bool ceil_mode,
                               const at::Tensor& indices) {
  return at::max_pool2d_with_indices_backward(grad_output, self, kernel_size, stride, padding,
                                              dilation, ceil_mode, indices);
}

at::Tensor& maxPoolBackwardOutMeta(const at::Tensor& grad_output, const at::Tensor& self,
                                   at::IntArrayRef kernel_size, at::IntArrayRef stride,
                                   at::IntArrayRef padding, at::IntArrayRef dilation,
                                   bool ceil_mode, const at::Tensor& indices,
                                   at::Tensor& grad_input) {
  at::native::resize_output(grad_input, self.sizes());
  return grad_input;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(poptorch, m) {
  m.def(
      "max_pool2d_with_indices(Tensor self, int[2] kernel_size, int[2] stride=[], "
      "int[2] padding=0, int[2] dilation=1, bool ceil_mode=False) -> (Tensor, Tensor)");
  m.def(
      "max_pool2d_with_indices_backward(Tensor grad_output, Tensor self, int[2] kernel_size, "
      "int[2] stride, int[2] padding, int[2] dilation, bool ceil_mode, Tensor indices) -> Tensor");
  m.def(
      "max_pool2d_with_indices_backward.grad_input(Tensor grad_output, Tensor self, "
      "int[2] kernel_size, int[2] stride, int[2] padding, int[2] dilation, bool ceil_mode, "
      "Tensor indices, *, Tensor(a!) grad_input) -> Tensor(a!)");
}

TORCH_LIBRARY_IMPL(poptorch, CPU, m) {
  m.impl("max_pool2d_with_indices", TORCH_FN(maxPool));
  m.impl("max_pool2d_with_indices_backward", TORCH_FN(maxPoolBackward));
  m.impl("max_pool2d_with_indices_backward.grad_input", TORCH_FN(maxPoolBackwardOut));
}

TORCH_LIBRARY_IMPL(poptorch, Meta, m) {
  m.impl("max_pool2d_with_indices", TORCH_FN(maxPoolMeta));
  m.impl("max_pool2d_with_indices_backward", TORCH_FN(maxPoolBackwardMeta));
  m.impl("max_pool2d_with_indices_backward.grad_input", TORCH_FN(maxPoolBackwardOutMeta));
}

}  // namespace poptorch::kernels
