// Softmax over the last dimension, with the row maximum subtracted first.
#pragma once

#include <cstdint>

namespace llmk::cpu {

// out, x: `rows` rows of N floats, *_ld apart (out may alias x exactly).
void softmax(float* out, int64_t out_ld, const float* x, int64_t x_ld, int64_t rows, int64_t N);

}  // namespace llmk::cpu
