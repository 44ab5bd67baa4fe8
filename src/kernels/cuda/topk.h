// The k largest logits of each row with their ids, and the row's log-sum-exp, on the GPU; one
// block per row. The CUDA side of kernels/cpu/topk.h, which defines the order, the ties and the
// non-finite cases.
#pragma once

#include <cstdint>

namespace llmk::cuda {

// Device pointers; enqueued on current_stream(), nothing waits on the host, nothing allocates.
// logits: [rows, vocab] f32, rows ld floats apart. ids: [rows, k] i32, values: [rows, k] f32 (row
// stride k): equal to cpu::topk_lse's bit for bit. lse: [rows] f32, max-subtracted with the sum
// of exp in double: within a few float roundings of cpu::topk_lse's (the exps are fp32). Rows
// with NaN or infinities give what cpu::topk_lse gives. 1 <= k <= min(vocab, 1024),
// vocab < 2^31, rows < 2^31. lse_scale: as cpu::topk_lse's (device memory).
void topk_lse(int32_t* ids, float* values, float* lse, const float* logits, int64_t rows,
              int64_t vocab, int64_t ld, int k, const float* lse_scale = nullptr);

}  // namespace llmk::cuda
