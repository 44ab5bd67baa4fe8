// Index of the largest element of each row (greedy sampling).
#pragma once

#include <cstdint>

namespace llmk::cpu {

// out[r * out_stride] = index of the largest of the N floats of row r (rows x_ld apart): the
// lowest index among equal maxima. NaN counts as -inf, so a row of NaN and -inf gives the first
// such element. N must be at least 1 and below 2^31.
void argmax(int32_t* out, int64_t out_stride, const float* x, int64_t x_ld, int64_t rows,
            int64_t N);

// A token drawn per row (kernels/gumbel.h): the index of the largest x / temperature[r] +
// noise(seed[r], i) among the columns with x >= max + temperature[r] * log(min_p[r]) (min_p 0:
// all; NaN and -inf never drawn unless the whole row is, then as argmax). temperature > 0.
void sample_gumbel(int32_t* out, const float* x, int64_t x_ld, int64_t rows, int64_t N,
                   const float* temperature, const float* min_p, const uint64_t* seed);

}  // namespace llmk::cpu
