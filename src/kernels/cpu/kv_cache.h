// KV cache writes: new keys or values land in the cache rows named by their positions.
#pragma once

#include <cstdint>

#include "kernels/kv_quant.h"

namespace llmk::cpu {

// For t in [0, T): cache row positions[t] <- src row t, each row [H, D] floats.
// cache: [L, H, D], strides (ld_l, ld_h, 1); src: [T, H, D], strides (ld_t, ld_h, 1);
// positions: [T], pos_stride apart, each already checked to be in [0, L). cache and src must
// not overlap; with repeated positions the last row written wins.
void kv_append(float* cache, int64_t cache_ld_l, int64_t cache_ld_h, const float* src,
               int64_t src_ld_t, int64_t src_ld_h, const int32_t* positions, int64_t pos_stride,
               int64_t T, int64_t H, int64_t D);

// The same into an 8-bit cache (kernels/kv_quant.h): each row's head h encoded in format f with
// its scale written to scales[position * scale_ld_l + h].
void kv_append_8bit(uint8_t* cache, int64_t cache_ld_l, int64_t cache_ld_h, float* scales,
                    int64_t scale_ld_l, const float* src, int64_t src_ld_t, int64_t src_ld_h,
                    const int32_t* positions, int64_t pos_stride, int64_t T, int64_t H, int64_t D,
                    kvq::Format f);

// dst[0, D) <- src[0, D) decoded from format f and multiplied by scale.
void kv_decode(float* dst, const uint8_t* src, float scale, int64_t D, kvq::Format f);

}  // namespace llmk::cpu
