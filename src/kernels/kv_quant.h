// Compressed KV cache rows, the same arithmetic on the CPU and the GPU.
//
// An 8-bit cache (F8E4M3 or I8) keeps each row's head (D values) as D bytes and one float scale:
// value = stored x scale, scale = the head's largest |value| / kMax (448 for E4M3, its largest
// finite value; 127 for int8), so the largest value of every head row is stored exactly up to its
// format's rounding. Stored values: E4M3 rounded to nearest even (saturating at 448); int8
// rounded to nearest even, in [-127, 127]. A row of zeros has scale 0.
#pragma once

#include <math.h>

#include <cstdint>

#include "kernels/host_device.h"

namespace llmk::kvq {

enum class Format : uint8_t { E4M3, I8 };

template <Format F>
inline constexpr float kMax = F == Format::E4M3 ? 448.0f : 127.0f;

// E4M3 (the OCP "fn" variant: no infinities; S.1111.111 is NaN) from a float, rounded to nearest
// even and saturated to +-448; NaN stays NaN.
LLMK_HOST_DEVICE inline uint8_t e4m3_from_float(float x) {
  const uint8_t sign = x < 0.0f || (x == 0.0f && 1.0f / x < 0.0f) ? 0x80 : 0x00;
  const float a = fabsf(x);
  if (a != a) return 0x7F;
  if (a >= 448.0f) return sign | 0x7E;
  if (a < 0.015625f) {  // below 2^-6: subnormals, steps of 2^-9 (8 steps reach 2^-6, 0x08)
    return sign | static_cast<uint8_t>(rintf(a * 512.0f));
  }
  int e = 0;
  const float m = frexpf(a, &e);  // a = m 2^e, m in [0.5, 1)
  int exp = e - 1;                // a = (2m) 2^exp, 2m in [1, 2)
  int mant = static_cast<int>(rintf((2.0f * m - 1.0f) * 8.0f));
  if (mant == 8) {
    mant = 0;
    ++exp;
  }
  if (exp > 8 || (exp == 8 && mant > 6)) return sign | 0x7E;
  return sign | static_cast<uint8_t>(((exp + 7) << 3) | mant);
}

LLMK_HOST_DEVICE inline float e4m3_to_float(uint8_t b) {
  const int exp = (b >> 3) & 15, mant = b & 7;
  float v;
  if (exp == 15 && mant == 7) {
    v = NAN;
  } else if (exp == 0) {
    v = ldexpf(static_cast<float>(mant), -9);
  } else {
    v = ldexpf(1.0f + static_cast<float>(mant) / 8.0f, exp - 7);
  }
  return (b & 0x80) ? -v : v;
}

template <Format F>
LLMK_HOST_DEVICE inline uint8_t encode(float x) {
  if constexpr (F == Format::E4M3) {
    return e4m3_from_float(x);
  } else {
    const float r = fminf(fmaxf(rintf(x), -127.0f), 127.0f);
    return static_cast<uint8_t>(static_cast<int8_t>(r));
  }
}

template <Format F>
LLMK_HOST_DEVICE inline float decode(uint8_t b) {
  if constexpr (F == Format::E4M3) {
    return e4m3_to_float(b);
  } else {
    return static_cast<float>(static_cast<int8_t>(b));
  }
}

// What a head row of largest magnitude `absmax` is multiplied by before encoding, and its scale.
template <Format F>
LLMK_HOST_DEVICE inline float inverse_scale(float absmax) {
  return absmax > 0.0f ? kMax<F> / absmax : 0.0f;
}
template <Format F>
LLMK_HOST_DEVICE inline float scale_of(float absmax) {
  return absmax / kMax<F>;
}

}  // namespace llmk::kvq
