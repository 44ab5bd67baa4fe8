// The rotation angle of RoPE, shared by the rope kernel (rope.cu) and the one-row linear's RoPE
// epilogue (gemm/gemv.cu). Included by .cu files.
#pragma once

#include "kernels/cuda/common.cuh"

namespace llmk::cuda {

// (cos, sin) of position pos times pair i's frequency: base (theta^(-2i/rot_dim)) divided by
// factors[i] when given, times freq_scale. The angle is formed and reduced to [-pi, pi] in
// double, so a float sincos of it stays accurate at any position (a float angle at position
// 131072 would already be off by about 0.008 radians).
__device__ __forceinline__ float2 rope_cos_sin(double base, const float* factors, int i,
                                               double freq_scale, double pos) {
  double f = base;
  if (factors) f /= static_cast<double>(factors[i]);
  const double angle = pos * (f * freq_scale);
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  const double reduced = angle - rint(angle * (1.0 / kTwoPi)) * kTwoPi;
  float s, c;
  sincosf(static_cast<float>(reduced), &s, &c);
  return make_float2(c, s);
}

}  // namespace llmk::cuda
