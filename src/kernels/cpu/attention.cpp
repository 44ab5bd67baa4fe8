#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/isa.h"
#include "kernels/cpu/vec_math.h"

// Built once per instruction set (isa.h): everything here is in its namespace.
namespace llmk::cpu::LLMK_CPU_ISA {

namespace {

float dot(const float* a, const float* b, int64_t n) {
  int64_t i = 0;
  float s = 0.0f;
#if defined(__AVX2__)
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
  }
  s = detail::hsum8(_mm256_add_ps(acc0, acc1));
#endif
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// y += c * x
void axpy(float* y, float c, const float* x, int64_t n) {
  int64_t i = 0;
#if defined(__AVX2__)
  const __m256 cv = _mm256_set1_ps(c);
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(cv, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  }
#endif
  for (; i < n; ++i) y[i] += c * x[i];
}

// s[i] = exp(s[i] - max), returns the sum.
float exp_shifted_sum(float* s, int64_t n, float max) {
  int64_t i = 0;
  float sum = 0.0f;
#if defined(__AVX2__)
  const __m256 mv = _mm256_set1_ps(max);
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 e = detail::exp8(_mm256_sub_ps(_mm256_loadu_ps(s + i), mv));
    _mm256_storeu_ps(s + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  sum = detail::hsum8(acc);
#endif
  for (; i < n; ++i) {
    s[i] = detail::exp_clamped(s[i] - max);
    sum += s[i];
  }
  return sum;
}

}  // namespace

void attention(const AttentionArgs& a) {
  const int64_t group = a.Hq / a.Hkv;
  const int64_t D = a.D;
  // Cost of one (query, head) item: about (keys seen) * 2D steps.
  const int64_t avg_keys = a.window > 0 ? std::min(a.window, a.pos0 + a.T) : a.pos0 + a.T;
  detail::parallel_rows(a.T * a.Hq, avg_keys * 2 * D, [&](int64_t i0, int64_t i1) {
    thread_local std::vector<float> scores, acc;
    for (int64_t item = i0; item < i1; ++item) {
      const int64_t t = item / a.Hq, h = item % a.Hq, hk = h / group;
      const int64_t p = a.pos0 + t;
      const int64_t first = a.window > 0 ? std::max<int64_t>(0, p - a.window + 1) : 0;
      const int64_t n = p - first + 1;
      scores.resize(static_cast<size_t>(n));
      acc.assign(static_cast<size_t>(D), 0.0f);
      const float* q = a.q + t * a.q_t + h * a.q_h;
      const float* k = a.k + hk * a.k_h;
      const float* v = a.v + hk * a.v_h;
      float max = -INFINITY;
      for (int64_t j = 0; j < n; ++j) {
        float s = dot(q, k + (first + j) * a.k_t, D) * a.scale;
        if (a.softcap > 0.0f) s = a.softcap * std::tanh(s / a.softcap);
        scores[static_cast<size_t>(j)] = s;
        max = std::max(max, s);
      }
      const float sum = exp_shifted_sum(scores.data(), n, max);
      for (int64_t j = 0; j < n; ++j) {
        axpy(acc.data(), scores[static_cast<size_t>(j)], v + (first + j) * a.v_t, D);
      }
      const float inv = 1.0f / sum;
      float* o = a.out + t * a.out_t + h * a.out_h;
      for (int64_t d = 0; d < D; ++d) o[d] = acc[static_cast<size_t>(d)] * inv;
    }
  });
}

}  // namespace llmk::cpu::LLMK_CPU_ISA
