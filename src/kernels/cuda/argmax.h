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

}  // namespace llmk::cuda
