// ggml's block layouts and their dequantisation to f32.
//
// Each block type packs `block_size` weights into a fixed number of bytes (see core/dtype.h).
// The structs below give the byte layout, field by field, exactly as ggml writes it; every
// field is a byte array so a block may sit at any address. Multi-byte fields are little-endian;
// `d`/`m`/`dmin` are IEEE half floats.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace llmk::cpu {

// w[j] = d * (q[j] - 8); q[j] is the low nibble of qs[j] for j < 16, the high nibble of qs[j-16].
struct BlockQ4_0 {
  uint8_t d[2];
  uint8_t qs[16];
};
// w[j] = d * q[j] + m; nibbles as Q4_0.
struct BlockQ4_1 {
  uint8_t d[2];
  uint8_t m[2];
  uint8_t qs[16];
};
// w[j] = d * (q[j] - 16); q[j] = nibble (as Q4_0) | bit j of the u32 qh << 4.
struct BlockQ5_0 {
  uint8_t d[2];
  uint8_t qh[4];
  uint8_t qs[16];
};
// w[j] = d * q[j] + m; q as Q5_0.
struct BlockQ5_1 {
  uint8_t d[2];
  uint8_t m[2];
  uint8_t qh[4];
  uint8_t qs[16];
};
// w[j] = d * qs[j] (int8).
struct BlockQ8_0 {
  uint8_t d[2];
  int8_t qs[32];
};
// 16 groups of 16: w = d * (scales[g] & 15) * q - dmin * (scales[g] >> 4); q is 2 bits.
struct BlockQ2_K {
  uint8_t scales[16];
  uint8_t qs[64];
  uint8_t d[2];
  uint8_t dmin[2];
};
// 16 groups of 16 with 6-bit scales: w = d * (scale[g] - 32) * q, q in -4..3 (2 low bits in qs,
// the third bit, inverted, in hmask).
struct BlockQ3_K {
  uint8_t hmask[32];
  uint8_t qs[64];
  uint8_t scales[12];
  uint8_t d[2];
};
// 8 sub-blocks of 32 with 6-bit scale and min: w = d * sc[s] * q - dmin * m[s], q a nibble.
struct BlockQ4_K {
  uint8_t d[2];
  uint8_t dmin[2];
  uint8_t scales[12];
  uint8_t qs[128];
};
// As Q4_K with a fifth bit per weight in qh.
struct BlockQ5_K {
  uint8_t d[2];
  uint8_t dmin[2];
  uint8_t scales[12];
  uint8_t qh[32];
  uint8_t qs[128];
};
// 16 groups of 16: w = d * scales[g] * (q - 32), q 6 bits (low 4 in ql, high 2 in qh).
struct BlockQ6_K {
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint8_t d[2];
};

// True for the dtypes dequantize_row handles: f32, f16, bf16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
// Q2_K, Q3_K, Q4_K, Q5_K, Q6_K.
bool can_dequantize(DType t);

// dst[0, n) = the first n weights at src as f32; n must be a whole number of blocks.
// Bit-exact with ggml's dequantize_row_* (products and sums rounded separately, no FMA).
// Throws llmk::Error for dtypes it cannot handle.
void dequantize_row(DType t, const void* src, float* dst, int64_t n);

// The same through the portable decoders only (no SIMD): the fallback on targets without AVX2,
// kept callable so the tests check it on every build.
void dequantize_row_scalar(DType t, const void* src, float* dst, int64_t n);

}  // namespace llmk::cpu
