#include "kernels/cpu/kv_cache.h"

#include <algorithm>
#include <array>
#include <cmath>
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

namespace {
template <kvq::Format F>
void encode_head(uint8_t* dst, float* scale, const float* src, int64_t D) {
  float absmax = 0.0f;
  for (int64_t i = 0; i < D; ++i) absmax = std::max(absmax, std::fabs(src[i]));
  const float inv = kvq::inverse_scale<F>(absmax);
  for (int64_t i = 0; i < D; ++i) dst[i] = kvq::encode<F>(src[i] * inv);
  *scale = kvq::scale_of<F>(absmax);
}
}  // namespace

void kv_append_8bit(uint8_t* cache, int64_t cache_ld_l, int64_t cache_ld_h, float* scales,
                    int64_t scale_ld_l, const float* src, int64_t src_ld_t, int64_t src_ld_h,
                    const int32_t* positions, int64_t pos_stride, int64_t T, int64_t H, int64_t D,
                    kvq::Format f) {
  for (int64_t t = 0; t < T; ++t) {
    const int64_t row = positions[t * pos_stride];
    for (int64_t h = 0; h < H; ++h) {
      uint8_t* dst = cache + row * cache_ld_l + h * cache_ld_h;
      float* sc = scales + row * scale_ld_l + h;
      const float* s = src + t * src_ld_t + h * src_ld_h;
      if (f == kvq::Format::E4M3) {
        encode_head<kvq::Format::E4M3>(dst, sc, s, D);
      } else {
        encode_head<kvq::Format::I8>(dst, sc, s, D);
      }
    }
  }
}

void kv_decode(float* dst, const uint8_t* src, float scale, int64_t D, kvq::Format f) {
  if (f == kvq::Format::E4M3) {  // a table of the 256 codes' values (kvq::e4m3_to_float)
    static const std::array<float, 256> table = [] {
      std::array<float, 256> t{};
      for (int b = 0; b < 256; ++b)
        t[static_cast<size_t>(b)] = kvq::e4m3_to_float(static_cast<uint8_t>(b));
      return t;
    }();
    for (int64_t i = 0; i < D; ++i) dst[i] = table[src[i]] * scale;
  } else {
    for (int64_t i = 0; i < D; ++i) dst[i] = kvq::decode<kvq::Format::I8>(src[i]) * scale;
  }
}

}  // namespace llmk::cpu
