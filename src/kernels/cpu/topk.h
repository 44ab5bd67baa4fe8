// The k largest logits of each row with their column ids, and the row's log-sum-exp: what a
// teacher model exports for offline distillation (its top-k logits, and the normaliser that
// turns any of them into a log-probability, logit - lse). The reference for cuda::topk_lse
// (kernels/cuda/topk.h), which matches ids and values bit for bit.
#pragma once

#include <cstdint>

namespace llmk::cpu {

// logits: [rows, vocab] f32, rows ld floats apart. ids: [rows, k] i32 and values: [rows, k] f32
// (row stride k): the k largest logits of each row and their columns, values descending, equal
// values by ascending id, so the result is fully determined. -0.0 and +0.0 count as equal; every
// NaN counts as larger than +inf (as in torch.topk), so a NaN in a row shows in its top k. values
// are copies of the logits, bits included.
// lse: [rows] = log(sum_j exp(logits_j)), max-subtracted, summed in double. -inf logits add
// nothing; a row of -inf only gives -inf; a +inf gives +inf; a NaN gives NaN (NaN wins over +inf).
// With lse_scale ([rows], not null), lse is that of the logits times lse_scale[r] (each product
// rounded to float first; the same rules for those that are not finite): a sampler's
// normaliser at temperature 1 / lse_scale[r]. ids and values are the logits' own either way.
// 1 <= k <= vocab < 2^31. Rows run in parallel on cpu_pool().
void topk_lse(int32_t* ids, float* values, float* lse, const float* logits, int64_t rows,
              int64_t vocab, int64_t ld, int k, const float* lse_scale = nullptr);

}  // namespace llmk::cpu
