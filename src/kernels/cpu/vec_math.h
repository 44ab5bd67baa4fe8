// Small vector helpers shared by the CPU kernels: exp over 8 floats, horizontal sums, and the
// rule for when a row loop is worth spreading over the thread pool. Internal to src/kernels/cpu.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/thread_pool.h"
#include "kernels/cpu/isa.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace llmk::cpu::detail {
// One copy per instruction set the including file is built for (isa.h).
inline namespace LLMK_CPU_ISA {

// Runs fn(begin, end) over [0, rows), in parallel when the rows hold enough work (about
// `work_per_row` elementary steps each) to pay for waking the pool.
template <class Fn>
void parallel_rows(int64_t rows, int64_t work_per_row, Fn&& fn) {
  constexpr int64_t kMinWorkPerChunk = 16384;
  const int64_t grain = std::max<int64_t>(1, kMinWorkPerChunk / std::max<int64_t>(1, work_per_row));
  cpu_pool().parallel_for(rows, grain, fn);
}

#if defined(__AVX2__)
inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline float hmax8(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// exp(x) for 8 floats, within about 2 ulp of the correctly rounded result for x in [-87, 88].
// Inputs are clamped to [-88, 88]: large x saturates near 1.7e38 instead of overflowing, x <= -88
// (-inf included) gives exactly 0, results below 2^-126 may flush to 0. NaN propagates.
// Method (Cephes expf): x = n*ln2 + r with |r| <= ln2/2 (ln2 split in two so n*ln2_hi is
// exact), e^r = 1 + r + r^2 * P(r) with a degree-5 P, then scale by 2^n via the exponent bits.
inline __m256 exp8(__m256 x) {
  const __m256 hi = _mm256_set1_ps(88.0f), lo = _mm256_set1_ps(-88.0f);
  x = _mm256_min_ps(hi, _mm256_max_ps(lo, x));  // x second: max/min return it when it is NaN
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
#endif

// The scalar twin of exp8, for tails: the same clamping (0 for x <= -88), std::exp inside.
inline float exp_clamped(float x) { return x <= -88.0f ? 0.0f : std::exp(std::min(x, 88.0f)); }

}  // namespace LLMK_CPU_ISA
}  // namespace llmk::cpu::detail
