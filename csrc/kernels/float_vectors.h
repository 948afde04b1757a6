// What the project's float32 elementwise kernels share: the CPU test for their
// AVX2 code, how they split a tensor over threads, when an output may be
// written while the input is read, and the loops that map eight floats (of one
// or two inputs) at a time over a range.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace poptorch::kernels::float_vectors {

// Elements per task when a kernel is split over threads (TensorIterator's
// grain: below it one thread wins).
constexpr int64_t kGrain = 32768;
constexpr int64_t kLanes = 8;  // floats per __m256

// True when the CPU runs the kernels' target("avx2,fma") code.
inline bool hasAvx2() {
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return avx2;
}

// True when `a` and `b` share no bytes (each one dense block).
inline bool disjoint(const at::Tensor& a, const at::Tensor& b) {
  const auto* x = static_cast<const char*>(a.const_data_ptr());
  const auto* y = static_cast<const char*>(b.const_data_ptr());
  return x + static_cast<std::ptrdiff_t>(a.nbytes()) <= y ||
         y + static_cast<std::ptrdiff_t>(b.nbytes()) <= x;
}

// True when `out` is `self`'s bytes or shares none of them: a kernel that
// reads element i before writing it may then run in one pass, where a partial
// overlap would read elements it has already written.
inline bool sameOrDisjoint(const at::Tensor& self, const at::Tensor& out) {
  return (self.const_data_ptr() == out.const_data_ptr() && self.nbytes() == out.nbytes()) ||
         disjoint(self, out);
}

// out[i] = f(in[i]) for i in [0, n), eight floats per call of `f`, whose
// operator() must be target("avx2,fma") too, or GCC will not inline it here
// (the __m256 calling convention differs between the two targets). The tail
// goes through the same `f`: an element's value does not depend on where it
// falls.
template <typename F>
__attribute__((target("avx2,fma"))) void mapRange(const float* in, float* out, int64_t n,
                                                  const F& f) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) _mm256_storeu_ps(out + i, f(_mm256_loadu_ps(in + i)));
  if (i == n) return;
  float tail[kLanes] = {};
  std::memcpy(tail, in + i, (n - i) * sizeof(float));
  _mm256_storeu_ps(tail, f(_mm256_loadu_ps(tail)));
  std::memcpy(out + i, tail, (n - i) * sizeof(float));
}

// mapRange over `n` floats of `in` into `out`, split over threads as ATen
// splits unary ops. The caller checks hasAvx2().
template <typename F>
void map(const float* in, float* out, int64_t n, const F& f) {
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    mapRange(in + begin, out + begin, end - begin, f);
  });
}

// out[i] = f(a[i], b[i]), as mapRange does for one input.
template <typename F>
__attribute__((target("avx2,fma"))) void mapRange2(const float* a, const float* b, float* out,
                                                   int64_t n, const F& f) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    _mm256_storeu_ps(out + i, f(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
  }
  if (i == n) return;
  float tail_a[kLanes] = {};
  float tail_b[kLanes] = {};
  std::memcpy(tail_a, a + i, (n - i) * sizeof(float));
  std::memcpy(tail_b, b + i, (n - i) * sizeof(float));
  _mm256_storeu_ps(tail_a, f(_mm256_loadu_ps(tail_a), _mm256_loadu_ps(tail_b)));
  std::memcpy(out + i, tail_a, (n - i) * sizeof(float));
}

// mapRange2 split over threads, as map is.
template <typename F>
void map2(const float* a, const float* b, float* out, int64_t n, const F& f) {
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    mapRange2(a + begin, b + begin, out + begin, end - begin, f);
  });
}

}  // namespace poptorch::kernels::float_vectors
