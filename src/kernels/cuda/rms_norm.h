// RMS normalisation on the GPU, alone and fused with the residual add before it. Rows of bf16,
// fp16 or f32 (dt), f32 weights, fp32 math; one block per row.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace llmk::cuda {

// out, x: `rows` rows of D elements of dt, out_ld / x_ld elements apart (out may alias x
// exactly); w: [D] f32. y = x / sqrt(mean(x^2) + eps) * w, or * (1 + w) when add_one.
void rms_norm(DType dt, void* out, int64_t out_ld, const void* x, int64_t x_ld, int64_t rows,
              int64_t D, const float* w, float eps, bool add_one);
// The same over outer x inner rows in one launch: row (i, j) of x starts at i * x_ld +
// j * x_ld_inner (out likewise), e.g. [T, H, D] heads inside a wider projection output.
void rms_norm_2d(DType dt, void* out, int64_t out_ld, int64_t out_ld_inner, const void* x,
                 int64_t x_ld, int64_t x_ld_inner, int64_t outer, int64_t inner, int64_t D,
                 const float* w, float eps, bool add_one);

// x += delta (the sum rounded to dt and stored in x), then out = rms_norm(x) of the rounded
// sum. delta may be null (no add). x, delta, out: `rows` rows of D elements of dt, *_ld
// elements apart; out overlaps neither x nor delta; delta may alias x exactly.
void add_rms_norm(DType dt, void* x, int64_t x_ld, const void* delta, int64_t delta_ld, void* out,
                  int64_t out_ld, int64_t rows, int64_t D, const float* w, float eps, bool add_one);

}  // namespace llmk::cuda
