// Index of the largest element of each row on the GPU (greedy sampling); one block per row.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace llmk::cuda {

// out[r * out_stride] (i32, device memory) = index of the largest of the N elements of row r of
// x (F32 or BF16, rows x_ld elements apart): the lowest index among equal maxima; NaN counts as
// -inf, as in cpu::argmax. 1 <= N < 2^31.
void argmax(int32_t* out, int64_t out_stride, const void* x, DType x_type, int64_t x_ld,
            int64_t rows, int64_t N);

// cpu::sample_gumbel on the GPU, the same draws bit for bit: out [rows] i32; x [rows, N] f32 rows
// x_ld apart; temperature, min_p [rows] f32, seed [rows] u64, all device memory.
void sample_gumbel(int32_t* out, const float* x, int64_t x_ld, int64_t rows, int64_t N,
                   const float* temperature, const float* min_p, const uint64_t* seed);

// ops::apply_penalties on the GPU: x [rows, *] f32 rows x_ld apart; for each of the n entries
// e, the logit at row at[2e], column at[2e + 1] becomes penalty::apply(logit, by[2e], by[2e + 1])
// (kernels/penalty.h). at (i32) and by (f32): [n, 2], device memory; the entries' places are
// distinct.
void apply_penalties(float* x, int64_t x_ld, const int32_t* at, const float* by, int64_t n);

}  // namespace llmk::cuda
