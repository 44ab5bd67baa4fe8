// Embedding lookup on the GPU: out row t = table row ids[t], bf16.
#pragma once

#include <cstdint>

namespace llmk::cuda {

// out: [T, D] bf16, rows out_ld elements apart; table: [V, D] bf16, rows table_ld apart;
// ids: [T] i32 in device memory, ids_stride apart. An id outside [0, V) writes a row of zeros
// (the host cannot check device ids without waiting). out must not overlap table or ids.
void embedding(void* out, int64_t out_ld, const void* table, int64_t table_ld, int64_t V, int64_t D,
               const int32_t* ids, int64_t ids_stride, int64_t T);

}  // namespace llmk::cuda
