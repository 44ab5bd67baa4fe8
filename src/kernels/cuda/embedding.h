// Embedding lookup on the GPU: out row t = table row ids[t], rows of 2- or 4-byte elements
// (bf16, fp16 or f32) copied as they are.
#pragma once

#include <cstdint>

namespace llmk::cuda {

// out: [T, D], rows out_ld elements apart; table: [V, D] of the same dtype (elements of
// elem_bytes, 2 or 4), rows table_ld apart; ids: [T] i32 in device memory, ids_stride apart. An
// id outside [0, V) writes a row of zeros (the host cannot check device ids without waiting).
// out must not overlap table or ids.
void embedding(void* out, int64_t out_ld, const void* table, int64_t table_ld, int64_t V, int64_t D,
               int elem_bytes, const int32_t* ids, int64_t ids_stride, int64_t T);

}  // namespace llmk::cuda
