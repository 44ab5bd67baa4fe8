// RMS normalisation over the last dimension.
#pragma once

#include <cstdint>

namespace llmk::cpu {

// For each of `rows` rows of D floats: y = x / sqrt(mean(x^2) + eps) * w, or * (1 + w) when
// add_one (Gemma). The sum of squares is accumulated in double.
// out, x: rows out_ld / x_ld apart (out may alias x exactly); w: [D].
void rms_norm(float* out, int64_t out_ld, const float* x, int64_t x_ld, int64_t rows, int64_t D,
              const float* w, float eps, bool add_one);

}  // namespace llmk::cpu
