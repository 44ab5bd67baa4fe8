// ops::kv_append's checks, CPU append and CUDA arguments, shared with ops::rope_kv_append, which
// fuses the append into RoPE. Internal to src/ops.
#pragma once

#include <string_view>

#include "core/tensor.h"

#ifdef LLMK_HAS_CUDA
#include "kernels/cuda/kv_cache.h"
#endif

namespace llmk::ops::detail {

// Checks the operands of kv_append as ops.h states them (errors name `op`); true when they are
// on CUDA. On the CPU it also checks every position against the cache.
bool check_kv_append(std::string_view op, const Tensor& k_cache, const Tensor& v_cache,
                     const Tensor& k, const Tensor& v, const Tensor& positions);

// The CPU append itself, on operands check_kv_append passed.
void cpu_kv_append(Tensor& k_cache, Tensor& v_cache, const Tensor& k, const Tensor& v,
                   const Tensor& positions);

#ifdef LLMK_HAS_CUDA
cuda::KvAppendArgs cuda_kv_append_args(Tensor& k_cache, Tensor& v_cache, const Tensor& k,
                                       const Tensor& v, const Tensor& positions);
#endif

}  // namespace llmk::ops::detail
