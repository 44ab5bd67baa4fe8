// Gated activations of an MLP on the GPU: out = act(gate) * up, bf16, fp16 or f32 (dt), fp32
// math.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace llmk::cuda {

enum class Activation {
  SiLU,      // x * sigmoid(x)
  GeluTanh,  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
};

// out, gate, up: `rows` rows of F elements of dt, *_ld elements apart (out may alias gate or up
// exactly).
void gated_act(DType dt, void* out, int64_t out_ld, const void* gate, int64_t gate_ld,
               const void* up, int64_t up_ld, int64_t rows, int64_t F, Activation act);

}  // namespace llmk::cuda
