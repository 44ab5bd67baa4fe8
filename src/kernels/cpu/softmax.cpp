#include "kernels/cpu/softmax.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/isa.h"
#include "kernels/cpu/vec_math.h"

// Built once per instruction set (isa.h): everything here is in its namespace.
namespace llmk::cpu::LLMK_CPU_ISA {

namespace {

float row_max(const float* x, int64_t n) {
  int64_t i = 0;
  float m = -INFINITY;
#if defined(__AVX2__)
  __m256 mv = _mm256_set1_ps(-INFINITY);
  for (; i + 8 <= n; i += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(x + i));
  m = detail::hmax8(mv);
#endif
  for (; i < n; ++i) m = std::max(m, x[i]);
  return m;
}

}  // namespace

void softmax(float* out, int64_t out_ld, const float* x, int64_t x_ld, int64_t rows, int64_t N) {
  detail::parallel_rows(rows, 20 * N, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * x_ld;
      float* yr = out + r * out_ld;
      const float max = row_max(xr, N);
      int64_t i = 0;
      float sum = 0.0f;
#if defined(__AVX2__)
      const __m256 mv = _mm256_set1_ps(max);
      __m256 acc = _mm256_setzero_ps();
      for (; i + 8 <= N; i += 8) {
        const __m256 e = detail::exp8(_mm256_sub_ps(_mm256_loadu_ps(xr + i), mv));
        _mm256_storeu_ps(yr + i, e);
        acc = _mm256_add_ps(acc, e);
      }
      sum = detail::hsum8(acc);
#endif
      for (; i < N; ++i) {
        yr[i] = detail::exp_clamped(xr[i] - max);
        sum += yr[i];
      }
      const float inv = 1.0f / sum;
      for (int64_t j = 0; j < N; ++j) yr[j] *= inv;
    }
  });
}

}  // namespace llmk::cpu::LLMK_CPU_ISA
