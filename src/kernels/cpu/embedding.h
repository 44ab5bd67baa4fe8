// Embedding lookup: out row t = table row ids[t], dequantised to f32.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace llmk::cpu {

// out: [T, D] f32, rows out_ld apart; table: [V, D] in `dtype` (any dtype dequantize_row takes),
// rows row_bytes apart; ids: [T] i32, ids_stride apart, each already checked to be in [0, V).
void embedding(float* out, int64_t out_ld, const void* table, DType dtype, int64_t row_bytes,
               int64_t D, const int32_t* ids, int64_t ids_stride, int64_t T);

}  // namespace llmk::cpu
