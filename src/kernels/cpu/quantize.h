// Quantisation of f32 rows into ggml's block layouts (the layouts of dequant.h), for
// `llmk quantize`. The reference every other quantiser in llmk is checked against, so it is
// plain scalar code written for clarity, not speed.
//
// Legacy types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0): ggml's reference rounding, reproduced bit for bit
// (the tests compare with the gguf Python package's quantisers). Each block of 32 takes one
// scale (and a min for _1) from its largest magnitude (or its range) and rounds each weight to
// the nearest level; products are rounded on their own (this file builds without FMA
// contraction), as ggml's reference is written.
//
// K-quants (Q4_K, Q5_K, Q6_K): llmk's own search, same idea as ggml's reference quantiser. For
// each sub-block (32 weights for Q4_K / Q5_K, 16 for Q6_K) a small set of candidate scales is
// tried; for each, the weights are rounded and the scale (and min) that then minimise the
// weighted squared error are solved in closed form; the best candidate wins. The sub-block
// scales are then rounded to the 6-bit (Q4_K, Q5_K) or 8-bit (Q6_K) integers the super-block
// stores against its f16 scale, and the weights are rounded again against those final scales.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace llmk::cpu {

// True for the dtypes quantize_row writes: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K.
bool can_quantize(DType t);

// src: [n] f32, finite; dst: bytes_for(t, n) bytes. n must be a whole number of t's blocks.
// Throws llmk::Error for dtypes it cannot write and for n that is not whole blocks.
void quantize_row(DType t, const float* src, void* dst, int64_t n);

// Integer weights already chosen, with one scale per block of 32, as the symmetric block types
// (w = scale * q): Q8_0 takes q in [-128, 127], Q5_0 [-16, 15], Q4_0 [-8, 7]. q: [n] int8;
// scales: [n / 32], each exactly an f16 value (the blocks store f16). dst: bytes_for(t, n). Throws
// llmk::Error naming the first value out of range or scale an f16 cannot hold, and for another t
// or n that is not whole blocks of 32.
void pack_symmetric_row(DType t, const int8_t* q, const float* scales, void* dst, int64_t n);

}  // namespace llmk::cpu
