// ops::kv_append's checks, CPU append and CUDA arguments, shared with ops::rope_kv_append, which
// fuses the append into RoPE. Internal to src/ops.
#pragma once

#include <string_view>

#include "core/tensor.h"
#include "kernels/kv_quant.h"
#include "ops/ops.h"

#ifdef LLMK_HAS_CUDA
#include "kernels/cuda/kv_cache.h"
#endif

namespace llmk::ops::detail {

// Checks the operands of kv_append as ops.h states them (errors name `op`); true when they are
// on CUDA. On the CPU it also checks every position against the cache.
// With scales the caches must be 8-bit (check_kv_scales).
bool check_kv_append(std::string_view op, const Tensor& k_cache, const Tensor& v_cache,
                     const Tensor& k, const Tensor& v, const Tensor& positions,
                     const KvScales* scales = nullptr);

// Checks that k_cache and v_cache are 8-bit (F8E4M3 or I8, the same) with scales of the shape
// KvScales states, on their device; without scales, that they are not 8-bit.
void check_kv_scales(std::string_view op, const Tensor& k_cache, const Tensor& v_cache,
                     const KvScales* scales);

// The format of an 8-bit cache (F8E4M3 or I8).
kvq::Format kv_format(const Tensor& cache);

// The CPU append itself, on operands check_kv_append passed.
void cpu_kv_append(Tensor& k_cache, Tensor& v_cache, const Tensor& k, const Tensor& v,
                   const Tensor& positions, KvScales* scales = nullptr);

#ifdef LLMK_HAS_CUDA
// kv_format for the CUDA kernels (its values are AttentionArgs::kv_format's too).
cuda::KvFormat cuda_kv_format(const Tensor& cache);

cuda::KvAppendArgs cuda_kv_append_args(Tensor& k_cache, Tensor& v_cache, const Tensor& k,
                                       const Tensor& v, const Tensor& positions,
                                       KvScales* scales = nullptr);
#endif

}  // namespace llmk::ops::detail
