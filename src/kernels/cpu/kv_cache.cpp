#include "kernels/cpu/kv_cache.h"

#include <cstring>

namespace llmk::cpu {

void kv_append(float* cache, int64_t cache_ld_l, int64_t cache_ld_h, const float* src,
               int64_t src_ld_t, int64_t src_ld_h, const int32_t* positions, int64_t pos_stride,
               int64_t T, int64_t H, int64_t D) {
  // Sequential: a few rows per call, and repeated positions must resolve in order.
  for (int64_t t = 0; t < T; ++t) {
    float* dst = cache + positions[t * pos_stride] * cache_ld_l;
    const float* s = src + t * src_ld_t;
    for (int64_t h = 0; h < H; ++h) {
      std::memcpy(dst + h * cache_ld_h, s + h * src_ld_h, static_cast<size_t>(D) * sizeof(float));
    }
  }
}

}  // namespace llmk::cpu
