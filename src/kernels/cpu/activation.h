// Gated activations of an MLP: out = act(gate) * up.
#pragma once

#include <cstdint>

namespace llmk::cpu {

enum class Activation {
  SiLU,      // x * sigmoid(x)
  GeluTanh,  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
};

// out, gate, up: `rows` rows of F floats, *_ld apart (out may alias gate or up exactly).
void gated_act(float* out, int64_t out_ld, const float* gate, int64_t gate_ld, const float* up,
               int64_t up_ld, int64_t rows, int64_t F, Activation act);

}  // namespace llmk::cpu
