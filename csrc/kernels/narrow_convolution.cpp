// poptorch::convolution and poptorch::convolution_backward: aten's ops with
// the same schemas, and for narrow convolutions (isNarrowConvolution) over
// contiguous float32 tensors, an im2col of each image (AVX2 row copies) and
// MKL's GEMM (BLAS's sgemm, which PyTorch's CPU library exports):
//   forward         y[n] (C_out x P) = w (C_out x K) col[n] (K x P) + bias
//   weight gradient gw (C_out x K) = sum over n of gy[n] (C_out x P) col[n]^T
//   input gradient  gx[n] = col2im(w^T gy[n]), the columns added back into the image
// where K = C KH KW and P = OH OW. A padded convolution's image is copied into
// a zero-padded one first (and its gradient out of one), so that each row of
// the columns is whole rows of an image. The images are split over threads; each
// thread sums its images' weight and bias gradients, and the threads' sums
// are added in thread order.
//
// oneDNN runs these NCHW convolutions with few channels in generic kernels
// whose weight gradient alone took 42% of the seed CNN's training step, and
// PyTorch's own im2col path (_slow_conv2d) copies the columns element by
// element (docs/performance.md). Values are within float32 rounding of aten's
// (sums in another order), not bit-identical. Other convolutions, dtypes and
// layouts, and machines without AVX2, run aten's convolution.
#include "kernels/narrow_convolution.h"

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/convolution.h>
#include <ATen/ops/convolution_backward.h>
#include <ATen/ops/empty.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <limits>
#include <memory>
#include <optional>
#include <tuple>
#include <vector>

#include "kernels/float_vectors.h"

extern "C" void sgemm_(const char* transa, const char* transb, const int* m, const int* n,
                       const int* k, const float* alpha, const float* a, const int* lda,
                       const float* b, const int* ldb, const float* beta, float* c,
                       const int* ldc);

namespace poptorch::kernels {
namespace {

using float_vectors::kLanes;

constexpr int64_t kMaxChannels = 16;  // exclusive: see isNarrowConvolution

// Value d of an int[2] argument (one value stands for both), or nullopt.
std::optional<int64_t> dimension(c10::IntArrayRef values, size_t d) {
  if (values.size() == 1) return values[0];
  if (values.size() == 2) return values[d];
  return std::nullopt;
}

// The sizes of a narrow convolution; K and P as in the comment above.
struct Geometry {
  int64_t batch, channels, height, width;
  int64_t out_channels, kernel_h, kernel_w;
  int64_t pad_h, pad_w, out_h, out_w;

  int64_t patch() const { return channels * kernel_h * kernel_w; }  // K
  int64_t pixels() const { return out_h * out_w; }                   // P
  int64_t imageSize() const { return channels * height * width; }
  int64_t outputSize() const { return out_channels * pixels(); }
  bool padded() const { return pad_h != 0 || pad_w != 0; }
  int64_t paddedHeight() const { return height + 2 * pad_h; }
  int64_t paddedWidth() const { return width + 2 * pad_w; }
  int64_t paddedSize() const { return channels * paddedHeight() * paddedWidth(); }
};

std::optional<Geometry> narrowGeometry(const ConvolutionShape& s) {
  if (s.input.size() != 4 || s.weight.size() != 4 || s.transposed || s.groups != 1) {
    return std::nullopt;
  }
  int64_t pad[2];
  for (size_t d = 0; d < 2; ++d) {
    const auto stride = dimension(s.stride, d), padding = dimension(s.padding, d),
               dilation = dimension(s.dilation, d), output_padding = dimension(s.output_padding, d);
    if (stride != 1 || dilation != 1 || output_padding != 0 || !padding || *padding < 0) {
      return std::nullopt;
    }
    pad[d] = *padding;
  }
  Geometry g{s.input[0],  s.input[1],  s.input[2], s.input[3], s.weight[0], s.weight[2],
             s.weight[3], pad[0],      pad[1],     0,          0};
  g.out_h = g.height + 2 * g.pad_h - g.kernel_h + 1;
  g.out_w = g.width + 2 * g.pad_w - g.kernel_w + 1;
  constexpr int64_t kIntMax = std::numeric_limits<int>::max();  // BLAS's sizes
  if (s.weight[1] != g.channels || g.batch < 1 || g.channels < 1 ||
      g.channels >= kMaxChannels || g.out_channels < 1 || g.out_channels >= kMaxChannels ||
      g.kernel_h < 1 || g.kernel_w < 1 || g.out_h < 1 || g.out_w < 1 ||
      g.patch() * g.pixels() > kIntMax || g.paddedSize() > kIntMax) {
    return std::nullopt;
  }
  return g;
}

// c (m x n, row-major) = op(a) op(b) + beta c, where op(a) (m x k) is a as
// stored or, with transpose_a, the transpose of a stored k x m; op(b) (k x n)
// likewise.
void matmul(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, const float* a,
            const float* b, float beta, float* c) {
  // BLAS's matrices are column-major, a row-major one's transpose: c^T = op(b)^T op(a)^T.
  const char trans_b = transpose_b ? 'T' : 'N', trans_a = transpose_a ? 'T' : 'N';
  const int rows = static_cast<int>(n), cols = static_cast<int>(m), depth = static_cast<int>(k);
  const int ld_b = static_cast<int>(transpose_b ? k : n);
  const int ld_a = static_cast<int>(transpose_a ? m : k);
  const float one = 1.0f;
  sgemm_(&trans_b, &trans_a, &rows, &cols, &depth, &one, b, &ld_b, a, &ld_a, &beta, c, &rows);
}

// The lanes [0, n % 8) of a mask: a row's tail after its whole vectors.
__attribute__((target("avx2,fma"))) inline __m256i tailMask(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(n % kLanes)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// dst[0, n) = src[0, n); `tail` is tailMask(n). Masked loads and stores
// for the tail, where a scalar loop would be vectorised with alias checks.
__attribute__((target("avx2,fma"), always_inline)) inline void copyRow(float* dst,
                                                                       const float* src,
                                                                       int64_t n, __m256i tail) {
  if (n < kLanes) {
    _mm256_maskstore_ps(dst, tail, _mm256_maskload_ps(src, tail));
    return;
  }
  // The last eight may overlap the ones before: they are copied again.
  for (int64_t i = 0; i < n - kLanes; i += kLanes) {
    _mm256_storeu_ps(dst + i, _mm256_loadu_ps(src + i));
  }
  _mm256_storeu_ps(dst + n - kLanes, _mm256_loadu_ps(src + n - kLanes));
}

// dst[0, n) += src[0, n); `tail` is tailMask(n).
__attribute__((target("avx2,fma"), always_inline)) inline void addRow(float* dst,
                                                                      const float* src,
                                                                      int64_t n, __m256i tail) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    _mm256_storeu_ps(dst + i, _mm256_add_ps(_mm256_loadu_ps(dst + i), _mm256_loadu_ps(src + i)));
  }
  if (i < n) {
    _mm256_maskstore_ps(dst + i, tail,
                        _mm256_add_ps(_mm256_maskload_ps(dst + i, tail),
                                      _mm256_maskload_ps(src + i, tail)));
  }
}

__attribute__((target("avx2,fma"))) float sumRow(const float* src, int64_t n) {
  __m256 sum = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) sum = _mm256_add_ps(sum, _mm256_loadu_ps(src + i));
  alignas(32) float lanes[kLanes];
  _mm256_store_ps(lanes, sum);
  float total = 0.0f;
  for (float lane : lanes) total += lane;
  for (; i < n; ++i) total += src[i];
  return total;
}

// A thread's scratch memory, uninitialised (each use writes what it reads):
// the columns of one image (K x P) and, for a padded convolution, one padded
// image (C x Hp x Wp).
struct Scratch {
  explicit Scratch(const Geometry& g)
      : col(new float[g.patch() * g.pixels()]),
        padded(g.padded() ? new float[g.paddedSize()] : nullptr) {}
  std::unique_ptr<float[]> col, padded;
};

// One image (C x H x W) with its zero padding, in `padded`; the image itself
// when the convolution has none.
const float* padImage(const Geometry& g, const float* image, float* padded) {
  if (!g.padded()) return image;
  std::fill_n(padded, g.paddedSize(), 0.0f);
  for (int64_t row = 0; row < g.channels * g.height; ++row) {
    const int64_t c = row / g.height, ih = row % g.height;
    std::copy_n(image + row * g.width, g.width,
                padded + (c * g.paddedHeight() + ih + g.pad_h) * g.paddedWidth() + g.pad_w);
  }
  return padded;
}

// The gradient of an image (C x H x W) inside that of its padded image.
void unpadImage(const Geometry& g, const float* padded, float* image) {
  for (int64_t row = 0; row < g.channels * g.height; ++row) {
    const int64_t c = row / g.height, ih = row % g.height;
    std::copy_n(padded + (c * g.paddedHeight() + ih + g.pad_h) * g.paddedWidth() + g.pad_w,
                g.width, image + row * g.width);
  }
}

// The columns of one padded image (C x Hp x Wp): row (c, kh, kw) of `col`
// (K x P) holds at output pixel (oh, ow) the element that tap multiplies
// there, (c, oh + kh, ow + kw).
__attribute__((target("avx2,fma"))) void im2col(const Geometry& g, const float* image,
                                                float* col) {
  // Locals, so that the loops keep them in registers.
  const int64_t rows = g.out_h, cols = g.out_w, width = g.paddedWidth();
  const int64_t plane = g.paddedHeight() * width, taps_h = g.kernel_h, taps_w = g.kernel_w;
  const __m256i tail = tailMask(cols);
  for (int64_t c = 0; c < g.channels; ++c) {
    for (int64_t kh = 0; kh < taps_h; ++kh) {
      for (int64_t kw = 0; kw < taps_w; ++kw) {
        const float* in = image + c * plane + kh * width + kw;
        for (int64_t oh = 0; oh < rows; ++oh, in += width, col += cols) {
          copyRow(col, in, cols, tail);
        }
      }
    }
  }
}

// Adds the columns back into one padded image's gradient (C x Hp x Wp,
// zeroed first): im2col's adjoint.
__attribute__((target("avx2,fma"))) void col2im(const Geometry& g, const float* col,
                                                float* image) {
  const int64_t rows = g.out_h, cols = g.out_w, width = g.paddedWidth();
  const int64_t plane = g.paddedHeight() * width, taps_h = g.kernel_h, taps_w = g.kernel_w;
  const __m256i tail = tailMask(cols);
  std::fill_n(image, g.paddedSize(), 0.0f);
  for (int64_t c = 0; c < g.channels; ++c) {
    for (int64_t kh = 0; kh < taps_h; ++kh) {
      for (int64_t kw = 0; kw < taps_w; ++kw) {
        float* out = image + c * plane + kh * width + kw;
        for (int64_t oh = 0; oh < rows; ++oh, out += width, col += cols) {
          addRow(out, col, cols, tail);
        }
      }
    }
  }
}

at::Tensor forward(const Geometry& g, const at::Tensor& input, const at::Tensor& weight,
                   const std::optional<at::Tensor>& bias) {
  at::Tensor output = at::empty({g.batch, g.out_channels, g.out_h, g.out_w}, input.options());
  const float* x = input.const_data_ptr<float>();
  const float* w = weight.const_data_ptr<float>();
  const float* b = bias && bias->defined() ? bias->const_data_ptr<float>() : nullptr;
  float* y = output.mutable_data_ptr<float>();
  at::parallel_for(0, g.batch, 1, [&](int64_t begin, int64_t end) {
    Scratch scratch(g);
    for (int64_t n = begin; n < end; ++n) {
      float* out = y + n * g.outputSize();
      if (b != nullptr) {
        for (int64_t o = 0; o < g.out_channels; ++o) {
          std::fill_n(out + o * g.pixels(), g.pixels(), b[o]);
        }
      }
      im2col(g, padImage(g, x + n * g.imageSize(), scratch.padded.get()), scratch.col.get());
      matmul(false, false, g.out_channels, g.pixels(), g.patch(), w, scratch.col.get(),
             b != nullptr ? 1.0f : 0.0f, out);
    }
  });
  return output;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> backward(const Geometry& g,
                                                        const at::Tensor& grad_output,
                                                        const at::Tensor& input,
                                                        const at::Tensor& weight,
                                                        std::array<bool, 3> mask) {
  // oneDNN, which aten runs these on, gives the weight's gradient with the
  // bias's even when the mask leaves it out: so do these kernels.
  mask[1] = mask[1] || mask[2];
  const at::TensorOptions options = input.options();
  at::Tensor grad_input = mask[0] ? at::empty(input.sizes(), options) : at::Tensor();
  at::Tensor grad_weight = mask[1] ? at::empty(weight.sizes(), options) : at::Tensor();
  at::Tensor grad_bias = mask[2] ? at::empty({g.out_channels}, options) : at::Tensor();
  const float* gy = grad_output.const_data_ptr<float>();
  const float* x = input.const_data_ptr<float>();
  const float* w = weight.const_data_ptr<float>();
  float* gx = mask[0] ? grad_input.mutable_data_ptr<float>() : nullptr;
  // Chunk 0 of the images sums into the results, each other chunk into its
  // own `sums`, added to them afterwards in chunk order.
  const int64_t weights = g.out_channels * g.patch();
  const int64_t sums = weights + g.out_channels;
  const int64_t chunks = std::min<int64_t>(at::get_num_threads(), g.batch);
  std::vector<float> partial((chunks - 1) * sums);
  const auto weightSums = [&](int64_t chunk) {
    return chunk == 0 ? (mask[1] ? grad_weight.mutable_data_ptr<float>() : nullptr)
                      : partial.data() + (chunk - 1) * sums;
  };
  const auto biasSums = [&](int64_t chunk) {
    return chunk == 0 ? (mask[2] ? grad_bias.mutable_data_ptr<float>() : nullptr)
                      : partial.data() + (chunk - 1) * sums + weights;
  };
  at::parallel_for(0, chunks, 1, [&](int64_t first_chunk, int64_t last_chunk) {
    Scratch scratch(g);
    float* col = scratch.col.get();
    for (int64_t chunk = first_chunk; chunk < last_chunk; ++chunk) {
      float* gw = weightSums(chunk);
      float* gb = biasSums(chunk);
      const int64_t first = chunk * g.batch / chunks, last = (chunk + 1) * g.batch / chunks;
      for (int64_t n = first; n < last; ++n) {
        const float* gy_n = gy + n * g.outputSize();
        // BLAS's beta 0 ignores the uninitialised sums; so must the bias's.
        const bool start = n == first;
        const float beta = start ? 0.0f : 1.0f;
        if (mask[1]) {
          im2col(g, padImage(g, x + n * g.imageSize(), scratch.padded.get()), col);
          matmul(false, true, g.out_channels, g.patch(), g.pixels(), gy_n, col, beta, gw);
        }
        if (mask[2]) {
          for (int64_t o = 0; o < g.out_channels; ++o) {
            gb[o] = (start ? 0.0f : gb[o]) + sumRow(gy_n + o * g.pixels(), g.pixels());
          }
        }
        if (mask[0]) {
          matmul(true, false, g.patch(), g.pixels(), g.out_channels, w, gy_n, 0.0f, col);
          float* gx_n = gx + n * g.imageSize();
          col2im(g, col, g.padded() ? scratch.padded.get() : gx_n);
          if (g.padded()) unpadImage(g, scratch.padded.get(), gx_n);
        }
      }
    }
  });
  for (int64_t chunk = 1; chunk < chunks; ++chunk) {
    if (mask[1]) {
      float* gw = weightSums(0);
      const float* part = weightSums(chunk);
      for (int64_t i = 0; i < weights; ++i) gw[i] += part[i];
    }
    if (mask[2]) {
      float* gb = biasSums(0);
      const float* part = biasSums(chunk);
      for (int64_t o = 0; o < g.out_channels; ++o) gb[o] += part[o];
    }
  }
  return {grad_input, grad_weight, grad_bias};
}

bool isFloat(const at::Tensor& t) { return t.scalar_type() == at::kFloat; }

// The geometry when the narrow kernels take these tensors and arguments.
std::optional<Geometry> narrow(const at::Tensor& input, const at::Tensor& weight,
                               c10::IntArrayRef stride, c10::IntArrayRef padding,
                               c10::IntArrayRef dilation, bool transposed,
                               c10::IntArrayRef output_padding, int64_t groups) {
  if (!float_vectors::hasAvx2() || !isFloat(input) || !isFloat(weight)) return std::nullopt;
  return narrowGeometry({input.sizes(), weight.sizes(), stride, padding, dilation, transposed,
                         output_padding, groups});
}

at::Tensor convolution(const at::Tensor& input, const at::Tensor& weight,
                       const std::optional<at::Tensor>& bias, c10::IntArrayRef stride,
                       c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
                       c10::IntArrayRef output_padding, int64_t groups) {
  const auto g =
      narrow(input, weight, stride, padding, dilation, transposed, output_padding, groups);
  const bool bias_fits = !bias || !bias->defined() ||
                         (isFloat(*bias) && bias->sizes().equals({g ? g->out_channels : -1}));
  if (!g || !bias_fits || input.suggest_memory_format() != at::MemoryFormat::Contiguous) {
    return at::convolution(input, weight, bias, stride, padding, dilation, transposed,
                           output_padding, groups);
  }
  std::optional<at::Tensor> contiguous_bias;
  if (bias && bias->defined()) contiguous_bias = bias->contiguous();
  return forward(*g, input.contiguous(), weight.contiguous(), contiguous_bias);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolutionBackward(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
    at::OptionalIntArrayRef bias_sizes, c10::IntArrayRef stride, c10::IntArrayRef padding,
    c10::IntArrayRef dilation, bool transposed, c10::IntArrayRef output_padding, int64_t groups,
    std::array<bool, 3> output_mask) {
  const auto g =
      narrow(input, weight, stride, padding, dilation, transposed, output_padding, groups);
  if (!g || !isFloat(grad_output) ||
      !grad_output.sizes().equals({g->batch, g->out_channels, g->out_h, g->out_w}) ||
      input.suggest_memory_format() != at::MemoryFormat::Contiguous) {
    return at::convolution_backward(grad_output, input, weight, bias_sizes, stride, padding,
                                    dilation, transposed, output_padding, groups, output_mask);
  }
  return backward(*g, grad_output.contiguous(), input.contiguous(), weight.contiguous(),
                  output_mask);
}

at::Tensor convolutionMeta(const at::Tensor& input, const at::Tensor& weight,
                           const std::optional<at::Tensor>& bias, c10::IntArrayRef stride,
                           c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
                           c10::IntArrayRef output_padding, int64_t groups) {
  return at::convolution(input, weight, bias, stride, padding, dilation, transposed,
                         output_padding, groups);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolutionBackwardMeta(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
    at::OptionalIntArrayRef bias_sizes, c10::IntArrayRef stride, c10::IntArrayRef padding,
    c10::IntArrayRef dilation, bool transposed, c10::IntArrayRef output_padding, int64_t groups,
    std::array<bool, 3> output_mask) {
  return at::convolution_backward(grad_output, input, weight, bias_sizes, stride, padding,
                                  dilation, transposed, output_padding, groups, output_mask);
}

}  // namespace

bool isNarrowConvolution(const ConvolutionShape& shape) {
  return narrowGeometry(shape).has_value();
}

TORCH_LIBRARY_FRAGMENT(poptorch, m) {
  m.def(
      "convolution(Tensor input, Tensor weight, Tensor? bias, int[] stride, int[] padding, "
      "int[] dilation, bool transposed, int[] output_padding, int groups) -> Tensor");
  m.def(
      "convolution_backward(Tensor grad_output, Tensor input, Tensor weight, int[]? bias_sizes, "
      "int[] stride, int[] padding, int[] dilation, bool transposed, int[] output_padding, "
      "int groups, bool[3] output_mask) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(poptorch, CPU, m) {
  m.impl("convolution", TORCH_FN(convolution));
  m.impl("convolution_backward", TORCH_FN(convolutionBackward));
}

TORCH_LIBRARY_IMPL(poptorch, Meta, m) {
  m.impl("convolution", TORCH_FN(convolutionMeta));
  m.impl("convolution_backward", TORCH_FN(convolutionBackwardMeta));
}

}  // namespace poptorch::kernels
