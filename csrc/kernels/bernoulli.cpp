// poptorch::bernoulli_(self, p, generator): fills `self` with 1 with
// probability p and 0 otherwise, as aten::bernoulli_.float does, from a
// counter-based generator (Philox4x32-10, as PyTorch's CUDA generator): each
// element's value is a function of the seed and the element's index alone.
//
// PyTorch's CPU kernel draws the elements one after another from the Mersenne
// Twister on one thread (on AMD CPUs; Intel ones use MKL's generators), 11 ns
// an element on this machine: dropout's masks were a quarter of a Transformer
// training step and unaffected by a second core. This one makes 32 elements
// per pass of AVX2 instructions (under 1 ns an element) and splits the tensor
// over threads, with the same values whatever the number of threads.
//
// passes::useCounterBasedRandomFills puts it in place of aten::bernoulli_.float
// in compiled programs; the runtime hands it a generator seeded with the
// node's seed (runtime/executor.cpp), whose seed is the key.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <immintrin.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <mutex>

#include "kernels/float_vectors.h"

namespace poptorch::kernels {
namespace {

constexpr uint32_t kM0 = 0xD2511F53u;
constexpr uint32_t kM1 = 0xCD9E8D57u;
constexpr uint32_t kW0 = 0x9E3779B9u;
constexpr uint32_t kW1 = 0xBB67AE85u;
constexpr int kRounds = 10;
// Eight counters per block, four 32-bit words each: element 8 j + l of block b
// is word j of counter 8 b + l.
constexpr int kLanes = 8;
constexpr int64_t kBlock = 4 * kLanes;
constexpr int64_t kGrainBlocks = float_vectors::kGrain / kBlock;

// Words 0-3 of counter {counter, 0, 0} (the low and high halves of a 64-bit
// counter in the first two words) under `key`.
void philox(uint64_t key, uint64_t counter, uint32_t (&words)[4]) {
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32);
  uint32_t c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int r = 0; r < kRounds; ++r) {
    const uint64_t p0 = static_cast<uint64_t>(kM0) * c0;
    const uint64_t p1 = static_cast<uint64_t>(kM1) * c2;
    c0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    c2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c1 = static_cast<uint32_t>(p1);
    c3 = static_cast<uint32_t>(p0);
    k0 += kW0;
    k1 += kW1;
  }
  words[0] = c0;
  words[1] = c1;
  words[2] = c2;
  words[3] = c3;
}

// 1 where the top 24 bits of a word, as a uniform draw u in [0, 1), fall
// below p; `threshold` is ceil(p * 2^24), so that u < p exactly.
inline bool keep(uint32_t word, uint32_t threshold) { return (word >> 8) < threshold; }

// Block `block` of the stream, one element at a time: the tail of a tensor,
// and machines without AVX2.
void scalarBlock(uint64_t key, uint32_t threshold, int64_t block, uint8_t (&out)[kBlock]) {
  for (int l = 0; l < kLanes; ++l) {
    uint32_t words[4];
    philox(key, static_cast<uint64_t>(block) * kLanes + l, words);
    for (int j = 0; j < 4; ++j) out[kLanes * j + l] = keep(words[j], threshold);
  }
}

// The high and low halves of the products of a's eight words with m.
__attribute__((target("avx2"))) inline void mulHiLo(__m256i a, __m256i m, __m256i& hi,
                                                    __m256i& lo) {
  const __m256i even = _mm256_mul_epu32(a, m);
  const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), m);
  lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
  hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
}

// Blocks [first, first + blocks) as 0/1 floats, eight counters per AVX2 pass:
// the same words as philox().
__attribute__((target("avx2"))) void avx2Blocks(uint64_t key, uint32_t threshold, int64_t first,
                                                int64_t blocks, float* out) {
  const __m256i m0 = _mm256_set1_epi32(static_cast<int32_t>(kM0));
  const __m256i m1 = _mm256_set1_epi32(static_cast<int32_t>(kM1));
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  // threshold <= 2^24 and a word's top 24 bits < 2^24: a signed compare is exact.
  const __m256i limit = _mm256_set1_epi32(static_cast<int32_t>(threshold));
  const __m256 one = _mm256_set1_ps(1.0f);
  for (int64_t b = first; b < first + blocks; ++b) {
    const uint64_t counter = static_cast<uint64_t>(b) * kLanes;
    // The eight counters' low words do not carry: counter is a multiple of 8.
    __m256i c0 = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int32_t>(counter)), lanes);
    __m256i c1 = _mm256_set1_epi32(static_cast<int32_t>(counter >> 32));
    __m256i c2 = _mm256_setzero_si256();
    __m256i c3 = _mm256_setzero_si256();
    uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
    for (int r = 0; r < kRounds; ++r) {
      __m256i hi0, lo0, hi1, lo1;
      mulHiLo(c0, m0, hi0, lo0);
      mulHiLo(c2, m1, hi1, lo1);
      c0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1), _mm256_set1_epi32(static_cast<int32_t>(k0)));
      c2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3), _mm256_set1_epi32(static_cast<int32_t>(k1)));
      c1 = lo1;
      c3 = lo0;
      k0 += kW0;
      k1 += kW1;
    }
    const __m256i words[4] = {c0, c1, c2, c3};
    float* o = out + (b - first) * kBlock;
    for (int j = 0; j < 4; ++j) {
      const __m256i kept = _mm256_cmpgt_epi32(limit, _mm256_srli_epi32(words[j], 8));
      _mm256_storeu_ps(o + kLanes * j, _mm256_and_ps(_mm256_castsi256_ps(kept), one));
    }
  }
}

// Elements [begin, end) of the fill (begin a multiple of kBlock) into `out`,
// contiguous, as scalar_t.
template <typename scalar_t>
void fillRange(uint64_t key, uint32_t threshold, int64_t begin, int64_t end, scalar_t* out) {
  int64_t i = begin;
  if constexpr (std::is_same_v<scalar_t, float>) {
    if (float_vectors::hasAvx2()) {
      const int64_t blocks = (end - begin) / kBlock;
      avx2Blocks(key, threshold, begin / kBlock, blocks, out + begin);
      i += blocks * kBlock;
    }
  }
  for (; i < end; i += kBlock) {
    uint8_t block[kBlock];
    scalarBlock(key, threshold, i / kBlock, block);
    for (int64_t e = i; e < std::min(end, i + kBlock); ++e) {
      out[e] = static_cast<scalar_t>(block[e - i]);
    }
  }
}

void checkP(double p) {
  TORCH_CHECK(0 <= p && p <= 1, "bernoulli_ expects p to be in [0, 1], but got p=", p);
}

// The key of a fill: the seed of the generator the runtime made for the node,
// else a draw from the default generator (a direct call).
uint64_t keyOf(const std::optional<at::Generator>& generator) {
  if (generator.has_value() && generator->defined()) return generator->current_seed();
  at::Generator fallback = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(fallback.mutex());
  return at::check_generator<at::CPUGeneratorImpl>(fallback)->random64();
}

at::Tensor& bernoulliCpu(at::Tensor& self, double p, std::optional<at::Generator> generator) {
  checkP(p);
  const uint64_t key = keyOf(generator);
  const auto threshold = static_cast<uint32_t>(std::ceil(p * 16777216.0));
  // Values follow the elements' row-major order whatever self's layout.
  at::Tensor target = self.is_contiguous() ? self : at::empty(self.sizes(), self.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, self.scalar_type(), "bernoulli_", [&] {
    scalar_t* out = target.mutable_data_ptr<scalar_t>();
    const int64_t blocks = (target.numel() + kBlock - 1) / kBlock;
    at::parallel_for(0, blocks, kGrainBlocks, [&](int64_t begin, int64_t end) {
      fillRange(key, threshold, begin * kBlock, std::min(end * kBlock, target.numel()), out);
    });
  });
  if (!target.is_same(self)) self.copy_(target);
  return self;
}

at::Tensor& bernoulliMeta(at::Tensor& self, double p, std::optional<at::Generator> /*generator*/) {
  checkP(p);
  return self;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(poptorch, m) {
  m.def("bernoulli_(Tensor(a!) self, float p=0.5, *, Generator? generator=None) -> Tensor(a!)",
        {at::Tag::nondeterministic_seeded});
}

TORCH_LIBRARY_IMPL(poptorch, CPU, m) { m.impl("bernoulli_", TORCH_FN(bernoulliCpu)); }

TORCH_LIBRARY_IMPL(poptorch, Meta, m) { m.impl("bernoulli_", TORCH_FN(bernoulliMeta)); }

TORCH_LIBRARY_IMPL(poptorch, ADInplaceOrView, m) {
  m.impl("bernoulli_", torch::autograd::autogradNotImplementedInplaceOrViewFallback());
}

}  // namespace poptorch::kernels
