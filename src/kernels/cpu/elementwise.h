// Element-wise f32 ops over rows, and strided copies with dtype conversion.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace llmk::cpu {

// out = a + b over `rows` rows of D floats, *_ld apart (out may alias a or b exactly).
void add(float* out, int64_t out_ld, const float* a, int64_t a_ld, const float* b, int64_t b_ld,
         int64_t rows, int64_t D);

// x *= s over `rows` rows of D floats, x_ld apart.
void scale(float* x, int64_t x_ld, int64_t rows, int64_t D, float s);

// dst = src element by element over an n-d index space; strides in elements of each side's
// dtype. Converts between f32, f16 and bf16 (f32 -> 16-bit rounds to nearest even); any other
// dtype only copies to itself. dst and src must not overlap.
void copy(void* dst, DType dst_type, const int64_t* dst_strides, const void* src, DType src_type,
          const int64_t* src_strides, const int64_t* shape, int ndim);

// True when copy() handles this pair.
bool copy_supports(DType dst_type, DType src_type);

}  // namespace llmk::cpu
