// Bias rows for the linear layer, for the cases cuBLASLt's epilogue does not cover (see
// linear.cpp): out[m, n] = out[m, n] + bias[n], or = bias[n] when `assign` (K = 0).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"

namespace llmk::cuda {

// out: [M, N] bf16, f16 or f32, rows ldo elements apart; bias: [N] bf16, f16 or f32, contiguous.
// The sum is taken in fp32 and rounded once to out's dtype. Enqueued on `stream`. Returns false
// (and does nothing) for any other dtype. This file is compiled by nvcc, which cannot parse fmt:
// errors are the caller's to raise.
bool add_bias_rows(void* out, DType out_dtype, int64_t ldo, const void* bias, DType bias_dtype,
                   int64_t M, int64_t N, bool assign, cudaStream_t stream);

}  // namespace llmk::cuda
