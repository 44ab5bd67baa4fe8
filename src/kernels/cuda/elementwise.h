// Element-wise ops over rows of bf16, fp16 or f32 (dt) on the GPU.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace llmk::cuda {

// out = a + b over `rows` rows of D elements, *_ld elements apart (out may alias a or b
// exactly); the sum is formed in fp32 and rounded once.
void add(DType dt, void* out, int64_t out_ld, const void* a, int64_t a_ld, const void* b,
         int64_t b_ld, int64_t rows, int64_t D);

// x *= s over `rows` rows of D elements, x_ld elements apart (fp32 product, rounded once).
void scale(DType dt, void* x, int64_t x_ld, int64_t rows, int64_t D, float s);

}  // namespace llmk::cuda
