// Softmax over rows on the GPU, f32 or bf16, fp32 math; one block per row.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace llmk::cuda {

// out, x: `rows` rows of N >= 1 elements, *_ld elements apart; out_type and x_type each F32 or
// BF16 (out may alias x exactly when they match). The row maximum is subtracted first.
void softmax(void* out, DType out_type, int64_t out_ld, const void* x, DType x_type, int64_t x_ld,
             int64_t rows, int64_t N);

}  // namespace llmk::cuda
