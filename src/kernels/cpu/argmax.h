// Index of the largest element of each row (greedy sampling).
#pragma once

#include <cstdint>

namespace llmk::cpu {

// out[r * out_stride] = index of the largest of the N floats of row r (rows x_ld apart): the
// lowest index among equal maxima. NaN counts as -inf, so a row of NaN and -inf gives the first
// such element. N must be at least 1 and below 2^31.
void argmax(int32_t* out, int64_t out_stride, const float* x, int64_t x_ld, int64_t rows,
            int64_t N);

}  // namespace llmk::cpu
