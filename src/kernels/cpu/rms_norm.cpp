#include "kernels/cpu/rms_norm.h"

#include <cmath>

#include "kernels/cpu/isa.h"
#include "kernels/cpu/vec_math.h"

// Built once per instruction set (isa.h): everything here is in its namespace.
namespace llmk::cpu::LLMK_CPU_ISA {

namespace {

double sum_of_squares(const float* x, int64_t D) {
  int64_t i = 0;
  double s = 0.0;
#if defined(__AVX2__)
  __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
  for (; i + 8 <= D; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
    const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
    a0 = _mm256_fmadd_pd(lo, lo, a0);
    a1 = _mm256_fmadd_pd(hi, hi, a1);
  }
  alignas(32) double parts[4];
  _mm256_store_pd(parts, _mm256_add_pd(a0, a1));
  s = (parts[0] + parts[1]) + (parts[2] + parts[3]);
#endif
  for (; i < D; ++i) s += static_cast<double>(x[i]) * x[i];
  return s;
}

}  // namespace

void rms_norm(float* out, int64_t out_ld, const float* x, int64_t x_ld, int64_t rows, int64_t D,
              const float* w, float eps, bool add_one) {
  detail::parallel_rows(rows, D, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * x_ld;
      float* yr = out + r * out_ld;
      const double mean = sum_of_squares(xr, D) / static_cast<double>(D);
      const auto inv = static_cast<float>(1.0 / std::sqrt(mean + static_cast<double>(eps)));
      if (add_one) {
        for (int64_t i = 0; i < D; ++i) yr[i] = xr[i] * inv * (1.0f + w[i]);
      } else {
        for (int64_t i = 0; i < D; ++i) yr[i] = xr[i] * inv * w[i];
      }
    }
  });
}

}  // namespace llmk::cpu::LLMK_CPU_ISA
