// The activations' element-wise forms, shared by gated_act (activation.cu), the one-row linear
// kernel that applies them to its input (gemm/gemv.cu), llmk.ops' kernels (grad.cu) and the GEMM
// with the activation in its epilogue (gemm/gemm_act.cu). Included by .cu files.
#pragma once

#include "kernels/cpu/grad.h"
#include "kernels/cuda/common.cuh"

namespace llmk::cuda {

// The gated activations act(g) * u: SiLU x / (1 + e^-x), as cpu::gated_act; GELU
// 0.5 x (1 + tanh t) written as x / (1 + e^(-2t)), as act_fast has it: no cancellation at
// either end (cpu::gated_act's x - x / (1 + e^(2t)) loses all digits for x < -4), and e^(-2t)
// overflowing to inf gives -0, the limit.
struct SiluMul {
  __device__ float operator()(float g, float u) const { return g / (1.0f + expf(-g)) * u; }
};
struct GeluTanhMul {
  __device__ float operator()(float g, float u) const {
    const float t = 0.7978845608028654f * (g + 0.044715f * g * g * g);
    return g / (1.0f + expf(-2.0f * t)) * u;
  }
};

// act(x) and act'(x) in fp32, the forms of cpu::grad's gate_value.
struct GateValue {
  float f, df;
};

template <cpu::grad::Act kAct>
__device__ __forceinline__ GateValue gate_value(float x) {
  if constexpr (kAct == cpu::grad::Act::SiLU) {
    const float s = 1.0f / (1.0f + expf(-x));
    return {x * s, s * (1.0f + x * (1.0f - s))};
  } else if constexpr (kAct == cpu::grad::Act::GeluTanh) {
    constexpr float kC = 0.7978845608028654f;  // sqrt(2 / pi)
    constexpr float kK = 0.044715f;
    const float t = tanhf(kC * (x + kK * x * x * x));
    const float cdf = 0.5f * (1.0f + t);
    // (1 - t)(1 + t) rather than 1 - t^2: accurate where |t| is close to 1.
    const float dt = (1.0f - t) * (1.0f + t) * kC * (1.0f + 3.0f * kK * x * x);
    return {x * cdf, cdf + 0.5f * x * dt};
  } else if constexpr (kAct == cpu::grad::Act::GeluErf) {
    constexpr float kInvSqrt2Pi = 0.3989422804014327f;
    const float cdf = normcdff(x);  // 0.5 (1 + erf(x / sqrt(2))), accurate for x < 0 too
    return {x * cdf, cdf + x * kInvSqrt2Pi * expf(-0.5f * x * x)};
  } else {
    return {x, 1.0f};
  }
}

// 2^x and 1 / x by the special-function unit, flushing subnormals (ex2.approx.ftz: relative
// error 2^-22; rcp.approx.ftz: 1 ulp), without the range fix-ups of exp2f and division.
__device__ __forceinline__ float ex2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float rcp_ftz(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// act(x) alone, in fast forms for epilogues that apply it to every output of a GEMM (GELU's erf
// through erfc's Chebyshev-fitted form, relative error under 1.2e-7: Numerical Recipes' erfcc):
// relative error under 2^-16 (the fp32 rounding of the exponent's argument grows with |x|), or
// absolute under 2^-118 near the bottom of the float range, where subnormal intermediates flush
// to zero (tests/gpu/act_fast_test.cu), far below the bf16 rounding that follows. Finite for
// every finite x; e^x overflowing to inf gives the limit.
template <cpu::grad::Act kAct>
__device__ __forceinline__ float act_fast(float x) {
  constexpr float kLog2e = 1.4426950408889634f;
  if constexpr (kAct == cpu::grad::Act::SiLU) {
    return x * rcp_ftz(1.0f + ex2_ftz(-kLog2e * x));
  } else if constexpr (kAct == cpu::grad::Act::GeluTanh) {
    // 0.5 x (1 + tanh u) = x / (1 + e^(-2u)), u = sqrt(2/pi) (x + 0.044715 x^3): no
    // cancellation at either end (x - x / (1 + e^(2u)) loses all digits for x < -4).
    const float u2 = (-2.0f * kLog2e * 0.7978845608028654f) * fmaf(0.044715f * x, x * x, x);
    return x * rcp_ftz(1.0f + ex2_ftz(u2));
  } else if constexpr (kAct == cpu::grad::Act::GeluErf) {
    // Phi(x) = 1 - erfc(z) / 2 for x >= 0, erfc(z) / 2 for x < 0, z = |x| / sqrt(2), with
    // erfc(z) = t exp(-z^2 + P(t)), t = 1 / (1 + z / 2) (Numerical Recipes' erfcc, relative error
    // under 1.2e-7). Here P's coefficients are scaled by log2(e) and the constant term takes the
    // factor 1/2 (-1), so erfc(z) / 2 = t 2^(P'(t) - log2(e) x^2 / 2).
    const float t = rcp_ftz(fmaf(fabsf(x), 0.35355339059327373f, 1.0f));
    float p = 0.246517298f;
    p = fmaf(p, t, -1.18611495f);
    p = fmaf(p, t, 2.14747446f);
    p = fmaf(p, t, -1.63775315f);
    p = fmaf(p, t, 0.402321582f);
    p = fmaf(p, t, -0.26875686f);
    p = fmaf(p, t, 0.139630057f);
    p = fmaf(p, t, 0.539700616f);
    p = fmaf(p, t, 1.4427292f);
    p = fmaf(p, t, -2.82574822f);
    const float half_erfc = t * ex2_ftz(fmaf(-0.5f * kLog2e * x, x, p));
    return x * (x >= 0.0f ? 1.0f - half_erfc : half_erfc);
  } else {
    return x;
  }
}
}  // namespace llmk::cuda
