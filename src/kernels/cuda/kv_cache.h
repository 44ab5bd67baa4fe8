// KV cache writes on the GPU: new keys and values land in the cache rows named by positions
// read from device memory.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace llmk::cuda {

// The cache's format: plain elements (bf16, fp16 or f32: the activations'), or 8-bit with a
// float scale per row and head (kernels/kv_quant.h).
enum class KvFormat : uint8_t { Plain, E4M3, I8 };

struct KvAppendArgs {
  void* k_cache = nullptr;         // [L, H, D] cache_type, strides (k_cache_ld_l, k_cache_ld_h, 1)
  void* v_cache = nullptr;         // [L, H, D] cache_type, strides (v_cache_ld_l, v_cache_ld_h, 1)
  DType cache_type = DType::BF16;  // BF16, F16 or F32 (format Plain)
  int64_t k_cache_ld_l = 0, k_cache_ld_h = 0, v_cache_ld_l = 0, v_cache_ld_h = 0;
  const void* k = nullptr;  // [T, H, D] in src_type, strides (k_ld_t, k_ld_h, 1)
  const void* v = nullptr;  // [T, H, D] in src_type, strides (v_ld_t, v_ld_h, 1)
  int64_t k_ld_t = 0, k_ld_h = 0, v_ld_t = 0, v_ld_h = 0;
  DType src_type = DType::BF16;  // BF16, F16 or F32 (rounded to the cache's type, nearest even)
  const int32_t* positions = nullptr;  // [T] i32 in device memory, pos_stride apart
  int64_t pos_stride = 1;
  int64_t T = 0, L = 0, H = 0, D = 0;
  // 8-bit caches: their format and scales ([L, H] f32, contiguous), written with each row.
  KvFormat format = KvFormat::Plain;
  float* k_scale = nullptr;
  float* v_scale = nullptr;
};

// k_cache row positions[t] <- k row t and v_cache row positions[t] <- v row t, one launch.
// A position outside [0, L) writes nothing. Repeated positions race (the caller's error).
void kv_append(const KvAppendArgs& a);

struct KvGatherArgs {
  void* out_k = nullptr;  // [n, H, D] out_type (BF16, F16 or F32), contiguous
  void* out_v = nullptr;
  DType out_type = DType::BF16;
  const void* k_pool = nullptr;  // [L, H, D] out_type (Plain) or 8-bit (format), contiguous
  const void* v_pool = nullptr;
  const int32_t* rows = nullptr;  // [n] i32 pool rows, in device memory
  int64_t n = 0, L = 0, H = 0, D = 0;
  KvFormat format = KvFormat::Plain;
  const float* k_scale = nullptr;  // [L, H] f32 (8-bit pools)
  const float* v_scale = nullptr;
};

// out_k row i <- k_pool row rows[i] decoded (likewise V), one launch. A row outside [0, L) gives
// zeros.
void kv_gather(const KvGatherArgs& a);

}  // namespace llmk::cuda
