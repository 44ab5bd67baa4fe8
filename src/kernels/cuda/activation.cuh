// The gated activations' element-wise forms, shared by gated_act (activation.cu) and the
// one-row linear kernel that applies them to its input (gemm/gemv.cu). Included by .cu files.
#pragma once

#include "kernels/cuda/common.cuh"

namespace llmk::cuda {

// The same forms as cpu::gated_act: SiLU x / (1 + e^-x); GELU 0.5 x (1 + tanh u) written as
// x - x / (1 + e^(2u)), finite at both ends.
struct SiluMul {
  __device__ float operator()(float g, float u) const { return g / (1.0f + expf(-g)) * u; }
};
struct GeluTanhMul {
  __device__ float operator()(float g, float u) const {
    const float t = 0.7978845608028654f * (g + 0.044715f * g * g * g);
    return (g - g / (1.0f + expf(2.0f * t))) * u;
  }
};

}  // namespace llmk::cuda
