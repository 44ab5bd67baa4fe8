// KV cache writes on the GPU: new keys and values land in the cache rows named by positions
// read from device memory.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace llmk::cuda {

struct KvAppendArgs {
  void* k_cache = nullptr;  // [L, H, D] bf16, strides (k_cache_ld_l, k_cache_ld_h, 1)
  void* v_cache = nullptr;  // [L, H, D] bf16, strides (v_cache_ld_l, v_cache_ld_h, 1)
  int64_t k_cache_ld_l = 0, k_cache_ld_h = 0, v_cache_ld_l = 0, v_cache_ld_h = 0;
  const void* k = nullptr;  // [T, H, D] in src_type, strides (k_ld_t, k_ld_h, 1)
  const void* v = nullptr;  // [T, H, D] in src_type, strides (v_ld_t, v_ld_h, 1)
  int64_t k_ld_t = 0, k_ld_h = 0, v_ld_t = 0, v_ld_h = 0;
  DType src_type = DType::BF16;        // BF16, or F32 (rounded to nearest even)
  const int32_t* positions = nullptr;  // [T] i32 in device memory, pos_stride apart
  int64_t pos_stride = 1;
  int64_t T = 0, L = 0, H = 0, D = 0;
};

// k_cache row positions[t] <- k row t and v_cache row positions[t] <- v row t, one launch.
// A position outside [0, L) writes nothing. Repeated positions race (the caller's error).
void kv_append(const KvAppendArgs& a);

}  // namespace llmk::cuda
