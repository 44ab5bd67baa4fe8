#include "kernels/cpu/activation.h"

#include "kernels/cpu/isa.h"
#include "kernels/cpu/vec_math.h"

// Built once per instruction set (isa.h): everything here is in its namespace.
namespace llmk::cpu::LLMK_CPU_ISA {

namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

// SiLU: x / (1 + e^-x). GELU: 0.5 x (1 + tanh u) = x / (1 + e^(-2u)), which needs one exp and
// keeps its digits for x < -4, where x - x / (1 + e^(2u)) cancels. From -2u = 88 (x below about
// -9.3), where exp_clamped and exp8 saturate, GELU is under 6e-38 and taken as 0.
constexpr float kExpSaturates = 88.0f;
inline float silu(float x) { return x / (1.0f + detail::exp_clamped(-x)); }
inline float gelu_tanh(float x) {
  const float u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
  const float m2u = -2.0f * u;
  return m2u >= kExpSaturates ? 0.0f : x / (1.0f + detail::exp_clamped(m2u));
}

template <Activation A>
void act_row(float* out, const float* gate, const float* up, int64_t F) {
  int64_t i = 0;
#if defined(__AVX2__)
  const __m256 one = _mm256_set1_ps(1.0f);
  for (; i + 8 <= F; i += 8) {
    const __m256 x = _mm256_loadu_ps(gate + i);
    __m256 y;
    if constexpr (A == Activation::SiLU) {
      const __m256 e = detail::exp8(_mm256_sub_ps(_mm256_setzero_ps(), x));
      y = _mm256_div_ps(x, _mm256_add_ps(one, e));
    } else {
      const __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
      const __m256 u = _mm256_mul_ps(_mm256_set1_ps(kSqrt2OverPi),
                                     _mm256_fmadd_ps(_mm256_set1_ps(kGeluCubic), x3, x));
      const __m256 m2u = _mm256_sub_ps(_mm256_setzero_ps(), _mm256_add_ps(u, u));
      const __m256 e = detail::exp8(m2u);
      y = _mm256_div_ps(x, _mm256_add_ps(one, e));
      y = _mm256_andnot_ps(_mm256_cmp_ps(m2u, _mm256_set1_ps(kExpSaturates), _CMP_GE_OQ), y);
    }
    _mm256_storeu_ps(out + i, _mm256_mul_ps(y, _mm256_loadu_ps(up + i)));
  }
#endif
  for (; i < F; ++i) {
    const float y = A == Activation::SiLU ? silu(gate[i]) : gelu_tanh(gate[i]);
    out[i] = y * up[i];
  }
}

}  // namespace

void gated_act(float* out, int64_t out_ld, const float* gate, int64_t gate_ld, const float* up,
               int64_t up_ld, int64_t rows, int64_t F, Activation act) {
  detail::parallel_rows(rows, 20 * F, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* o = out + r * out_ld;
      const float* g = gate + r * gate_ld;
      const float* u = up + r * up_ld;
      if (act == Activation::SiLU) {
        act_row<Activation::SiLU>(o, g, u, F);
      } else {
        act_row<Activation::GeluTanh>(o, g, u, F);
      }
    }
  });
}

}  // namespace llmk::cpu::LLMK_CPU_ISA
