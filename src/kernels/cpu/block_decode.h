// Decoders for ggml's quantised block layouts, shared by dequantisation and the fused linear
// kernels. Internal to src/kernels/cpu.
//
// Every block type is decoded into the same intermediate form, a "run" of up to 256 weights:
//   w[i] = scale[i / 16] * q[i] + min[i / 16]      (min only for types that have one)
// with q a small signed integer (offsets such as -8 or -32 already applied). One scale per 16
// weights covers every layout: the k-quants carry one per 16 or 32, the legacy types one per 32.
// Consumers either turn a run into floats (dequantisation) or dot it with activations, using
// the factorisation sum(w*x) = sum_g scale_g * sum(q*x) + min_g * sum(x) so the weights are
// never materialised as floats.
//
// kOneScalePer32 says whether scale/min are constant over each 32 (consumers may then use one
// partial dot per 32 weights instead of two).
//
// Each codec has a portable decode_scalar() and, where AVX2 is available, a decode_simd() that
// must produce identical q/scale/min (the tests check both against the gguf package).
//
// For the fused linear kernel, the nibble and byte codecs (Q4_0, Q4_1, Q8_0, Q4_K) also offer a
// register-only view under AVX2: scales() writes the per-16 scale/min as decode does, and
// lanes(block, s, q) returns the integer weights 32s .. 32s+31 as four vectors of 8 int32,
// widened straight from the block's bytes. Decoding to a byte buffer and reloading it costs a
// store-forwarding stall per block (about a quarter of the kernel's time for these types); for
// the 5- and 6-bit types, gathering the high bits lane by lane costs more than that stall, so
// they go through decode (measured on the dev machine, Zen 4: Q6_K 125 vs 189 us, Q5_K 121 vs
// 160 us for a 1536x768 decode step on one core).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/dtype.h"
#include "core/half.h"
#include "kernels/cpu/dequant.h"
#include "kernels/cpu/isa.h"

#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

namespace llmk::cpu::detail {
// One copy per instruction set the including file is built for (isa.h).
inline namespace LLMK_CPU_ISA {

inline constexpr int kRunElems = 256;
inline constexpr int kGroup = 16;  // weights per scale/min

struct DecodedRun {
  alignas(32) int8_t q[kRunElems];
  alignas(32) float scale[kRunElems / kGroup];
  alignas(32) float min[kRunElems / kGroup];
};

inline float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof h);
#if defined(__F16C__)
  return _cvtsh_ss(h);  // one instruction; exact, like fp16_to_float, for every finite half
#else
  return fp16_to_float(h);
#endif
}

inline uint32_t u32_at(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// The 6-bit (scale, min) pairs of Q4_K / Q5_K sub-block j (0..7), packed in 12 bytes.
inline void kquant_scale_min(const uint8_t* s, int j, int& sc, int& m) {
  if (j < 4) {
    sc = s[j] & 63;
    m = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
    m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Q4_K / Q5_K: eight sub-blocks of 32, each with scale d*sc and min -dmin*m.
// Q4_K and Q5_K share the position of d, dmin and scales.
inline void kquant_scales(const uint8_t* blk, float* scale, float* min) {
  static_assert(offsetof(BlockQ4_K, scales) == offsetof(BlockQ5_K, scales));
  static_assert(offsetof(BlockQ4_K, dmin) == offsetof(BlockQ5_K, dmin));
  const float d = f16_at(blk + offsetof(BlockQ4_K, d));
  const float dmin = f16_at(blk + offsetof(BlockQ4_K, dmin));
  for (int j = 0; j < 8; ++j) {
    int sc, m;
    kquant_scale_min(blk + offsetof(BlockQ4_K, scales), j, sc, m);
    const float ds = d * static_cast<float>(sc);
    const float ms = -(dmin * static_cast<float>(m));
    scale[2 * j] = scale[2 * j + 1] = ds;
    min[2 * j] = min[2 * j + 1] = ms;
  }
}

#if defined(__AVX2__)
// Bytes 0..31 = 0xFF where bit i of `bits` is set, else 0.
inline __m256i expand_bits_to_bytes(uint32_t bits) {
  const __m256i v = _mm256_set1_epi32(static_cast<int>(bits));
  // Byte i takes source byte i / 8 (shuffle works within 128-bit lanes; all lanes hold `bits`).
  const __m256i pick = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,  //
                                        2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
  const __m256i sel = _mm256_and_si256(_mm256_shuffle_epi8(v, pick), bit);
  return _mm256_cmpeq_epi8(sel, bit);
}

// 16 packed bytes -> 32 nibbles: low nibbles first, then high nibbles (the legacy layout).
inline __m256i nibbles_lo_then_hi(const uint8_t* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i m4 = _mm_set1_epi8(0x0F);
  const __m128i lo = _mm_and_si128(raw, m4);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), m4);
  return _mm256_set_m128i(hi, lo);
}

inline void store32(int8_t* q, __m256i v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), v); }
inline __m256i load32(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// 8 bytes at p widened to 8 int32 lanes (zero- or sign-extended), straight from memory.
inline __m256i widen8u(const uint8_t* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
inline __m256i widen8s(const uint8_t* p) {
  return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
inline __m256i low_nibble(__m256i v) { return _mm256_and_si256(v, _mm256_set1_epi32(0x0F)); }
inline __m256i high_nibble(__m256i v) { return _mm256_srli_epi32(v, 4); }  // v is a widened byte
#endif

template <DType T>
struct Codec;

#define LLMK_AT(Block, field) static_cast<int>(offsetof(Block, field))

// Q4_0: w = d * (q - 8).
template <>
struct Codec<DType::Q4_0> {
  using Block = BlockQ4_0;
  static constexpr bool kOneScalePer32 = true;
  static constexpr int kElems = 32;
  static constexpr bool kHasMin = false;
  static constexpr int kD = LLMK_AT(Block, d), kQs = LLMK_AT(Block, qs);
  static void decode_scalar(const uint8_t* b, int8_t* q, float* scale, float*) {
    scale[0] = scale[1] = f16_at(b + kD);
    for (int j = 0; j < 16; ++j) {
      q[j] = static_cast<int8_t>((b[kQs + j] & 0x0F) - 8);
      q[j + 16] = static_cast<int8_t>((b[kQs + j] >> 4) - 8);
    }
  }
#if defined(__AVX2__)
  static void decode_simd(const uint8_t* b, int8_t* q, float* scale, float*) {
    scale[0] = scale[1] = f16_at(b + kD);
    store32(q, _mm256_sub_epi8(nibbles_lo_then_hi(b + kQs), _mm256_set1_epi8(8)));
  }
  static void scales(const uint8_t* b, float* scale, float*) {
    scale[0] = scale[1] = f16_at(b + kD);
  }
  static void lanes(const uint8_t* b, int, __m256i* q) {
    const __m256i a = widen8u(b + kQs), c = widen8u(b + kQs + 8), off = _mm256_set1_epi32(8);
    q[0] = _mm256_sub_epi32(low_nibble(a), off);
    q[1] = _mm256_sub_epi32(low_nibble(c), off);
    q[2] = _mm256_sub_epi32(high_nibble(a), off);
    q[3] = _mm256_sub_epi32(high_nibble(c), off);
  }
#endif
};

// Q4_1: w = d * q + m.
template <>
struct Codec<DType::Q4_1> {
  using Block = BlockQ4_1;
  static constexpr bool kOneScalePer32 = true;
  static constexpr int kElems = 32;
  static constexpr bool kHasMin = true;
  static constexpr int kD = LLMK_AT(Block, d), kM = LLMK_AT(Block, m), kQs = LLMK_AT(Block, qs);
  static void decode_scalar(const uint8_t* b, int8_t* q, float* scale, float* min) {
    scale[0] = scale[1] = f16_at(b + kD);
    min[0] = min[1] = f16_at(b + kM);
    for (int j = 0; j < 16; ++j) {
      q[j] = static_cast<int8_t>(b[kQs + j] & 0x0F);
      q[j + 16] = static_cast<int8_t>(b[kQs + j] >> 4);
    }
  }
#if defined(__AVX2__)
  static void decode_simd(const uint8_t* b, int8_t* q, float* scale, float* min) {
    scale[0] = scale[1] = f16_at(b + kD);
    min[0] = min[1] = f16_at(b + kM);
    store32(q, nibbles_lo_then_hi(b + kQs));
  }
  static void scales(const uint8_t* b, float* scale, float* min) {
    scale[0] = scale[1] = f16_at(b + kD);
    min[0] = min[1] = f16_at(b + kM);
  }
  static void lanes(const uint8_t* b, int, __m256i* q) {
    const __m256i a = widen8u(b + kQs), c = widen8u(b + kQs + 8);
    q[0] = low_nibble(a);
    q[1] = low_nibble(c);
    q[2] = high_nibble(a);
    q[3] = high_nibble(c);
  }
#endif
};

// Q5_0: w = d * (q - 16), the fifth bit of weight j is bit j of qh.
template <>
struct Codec<DType::Q5_0> {
  using Block = BlockQ5_0;
  static constexpr bool kOneScalePer32 = true;
  static constexpr int kElems = 32;
  static constexpr bool kHasMin = false;
  static constexpr int kD = LLMK_AT(Block, d), kQh = LLMK_AT(Block, qh), kQs = LLMK_AT(Block, qs);
  static void decode_scalar(const uint8_t* b, int8_t* q, float* scale, float*) {
    scale[0] = scale[1] = f16_at(b + kD);
    const uint32_t qh = u32_at(b + kQh);
    for (int j = 0; j < 16; ++j) {
      q[j] = static_cast<int8_t>(((b[kQs + j] & 0x0F) | (((qh >> j) & 1u) << 4)) - 16);
      q[j + 16] = static_cast<int8_t>(((b[kQs + j] >> 4) | (((qh >> (j + 16)) & 1u) << 4)) - 16);
    }
  }
#if defined(__AVX2__)
  static void decode_simd(const uint8_t* b, int8_t* q, float* scale, float*) {
    scale[0] = scale[1] = f16_at(b + kD);
    const __m256i hi =
        _mm256_and_si256(expand_bits_to_bytes(u32_at(b + kQh)), _mm256_set1_epi8(16));
    const __m256i v = _mm256_or_si256(nibbles_lo_then_hi(b + kQs), hi);
    store32(q, _mm256_sub_epi8(v, _mm256_set1_epi8(16)));
  }
#endif
};

// Q5_1: w = d * q + m, q as Q5_0 without the offset.
template <>
struct Codec<DType::Q5_1> {
  using Block = BlockQ5_1;
  static constexpr bool kOneScalePer32 = true;
  static constexpr int kElems = 32;
  static constexpr bool kHasMin = true;
  static constexpr int kD = LLMK_AT(Block, d), kM = LLMK_AT(Block, m), kQh = LLMK_AT(Block, qh),
                       kQs = LLMK_AT(Block, qs);
  static void decode_scalar(const uint8_t* b, int8_t* q, float* scale, float* min) {
    scale[0] = scale[1] = f16_at(b + kD);
    min[0] = min[1] = f16_at(b + kM);
    const uint32_t qh = u32_at(b + kQh);
    for (int j = 0; j < 16; ++j) {
      q[j] = static_cast<int8_t>((b[kQs + j] & 0x0F) | (((qh >> j) & 1u) << 4));
      q[j + 16] = static_cast<int8_t>((b[kQs + j] >> 4) | (((qh >> (j + 16)) & 1u) << 4));
    }
  }
#if defined(__AVX2__)
  static void decode_simd(const uint8_t* b, int8_t* q, float* scale, float* min) {
    scale[0] = scale[1] = f16_at(b + kD);
    min[0] = min[1] = f16_at(b + kM);
    const __m256i hi =
        _mm256_and_si256(expand_bits_to_bytes(u32_at(b + kQh)), _mm256_set1_epi8(16));
    store32(q, _mm256_or_si256(nibbles_lo_then_hi(b + kQs), hi));
  }
#endif
};

// Q8_0: w = d * q.
template <>
struct Codec<DType::Q8_0> {
  using Block = BlockQ8_0;
  static constexpr bool kOneScalePer32 = true;
  static constexpr int kElems = 32;
  static constexpr bool kHasMin = false;
  static constexpr int kD = LLMK_AT(Block, d), kQs = LLMK_AT(Block, qs);
  static void decode_scalar(const uint8_t* b, int8_t* q, float* scale, float*) {
    scale[0] = scale[1] = f16_at(b + kD);
    std::memcpy(q, b + kQs, 32);  // already one vector move; no separate SIMD decoder
  }
#if defined(__AVX2__)
  static void scales(const uint8_t* b, float* scale, float*) {
    scale[0] = scale[1] = f16_at(b + kD);
  }
  static void lanes(const uint8_t* b, int, __m256i* q) {
    for (int i = 0; i < 4; ++i) q[i] = widen8s(b + kQs + 8 * i);
  }
#endif
};

// Q2_K: weight 128h + 32j + l (h < 2, j < 4, l < 32) is bits 2j..2j+1 of qs[32h + l]; group g
// has scale d * (scales[g] & 15) and min -dmin * (scales[g] >> 4).
template <>
struct Codec<DType::Q2_K> {
  using Block = BlockQ2_K;
  static constexpr bool kOneScalePer32 = false;  // one per 16
  static constexpr int kElems = 256;
  static constexpr bool kHasMin = true;
  static constexpr int kSc = LLMK_AT(Block, scales), kQs = LLMK_AT(Block, qs),
                       kD = LLMK_AT(Block, d), kDmin = LLMK_AT(Block, dmin);
  static void decode_scalar(const uint8_t* b, int8_t* q, float* scale, float* min) {
    const float d = f16_at(b + kD);
    const float dmin = f16_at(b + kDmin);
    for (int g = 0; g < 16; ++g) {
      scale[g] = d * static_cast<float>(b[kSc + g] & 0x0F);
      min[g] = -(dmin * static_cast<float>(b[kSc + g] >> 4));
    }
    for (int h = 0; h < 2; ++h)
      for (int j = 0; j < 4; ++j)
        for (int l = 0; l < 32; ++l)
          q[128 * h + 32 * j + l] = static_cast<int8_t>((b[kQs + 32 * h + l] >> (2 * j)) & 3);
  }
};

// Q3_K: weight 128h + 32j + l has low bits 2j..2j+1 of qs[32h + l] and is lowered by 4 when
// bit 4h + j of hmask[l] is clear. Group g's 6-bit scale: low 4 bits are nibble g/8 of byte
// g%8, high 2 bits are bit pair g/4 of byte 8 + g%4.
template <>
struct Codec<DType::Q3_K> {
  using Block = BlockQ3_K;
  static constexpr bool kOneScalePer32 = false;  // one per 16
  static constexpr int kElems = 256;
  static constexpr bool kHasMin = false;
  static constexpr int kHmask = LLMK_AT(Block, hmask), kQs = LLMK_AT(Block, qs),
                       kSc = LLMK_AT(Block, scales), kD = LLMK_AT(Block, d);
  static void decode_scalar(const uint8_t* b, int8_t* q, float* scale, float*) {
    const uint8_t* s = b + kSc;
    const float d = f16_at(b + kD);
    for (int g = 0; g < 16; ++g) {
      const int lo = g < 8 ? (s[g] & 0x0F) : (s[g - 8] >> 4);
      const int hi = (s[8 + g % 4] >> (2 * (g / 4))) & 3;
      scale[g] = d * static_cast<float>((lo | (hi << 4)) - 32);
    }
    for (int h = 0; h < 2; ++h)
      for (int j = 0; j < 4; ++j)
        for (int l = 0; l < 32; ++l) {
          const int low = (b[kQs + 32 * h + l] >> (2 * j)) & 3;
          const int high_clear = ((b[kHmask + l] >> (4 * h + j)) & 1) == 0;
          q[128 * h + 32 * j + l] = static_cast<int8_t>(low - 4 * high_clear);
        }
  }
};

// Q4_K: bytes 32j..32j+31 of qs hold sub-block 2j in their low and 2j+1 in their high nibbles.
template <>
struct Codec<DType::Q4_K> {
  using Block = BlockQ4_K;
  static constexpr bool kOneScalePer32 = true;
  static constexpr int kElems = 256;
  static constexpr bool kHasMin = true;
  static constexpr int kQs = LLMK_AT(Block, qs);
  static void decode_scalar(const uint8_t* b, int8_t* q, float* scale, float* min) {
    kquant_scales(b, scale, min);
    for (int j = 0; j < 4; ++j)
      for (int l = 0; l < 32; ++l) {
        q[64 * j + l] = static_cast<int8_t>(b[kQs + 32 * j + l] & 0x0F);
        q[64 * j + 32 + l] = static_cast<int8_t>(b[kQs + 32 * j + l] >> 4);
      }
  }
#if defined(__AVX2__)
  static void decode_simd(const uint8_t* b, int8_t* q, float* scale, float* min) {
    kquant_scales(b, scale, min);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int j = 0; j < 4; ++j) {
      const __m256i raw = load32(b + kQs + 32 * j);
      store32(q + 64 * j, _mm256_and_si256(raw, m4));
      store32(q + 64 * j + 32, _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4));
    }
  }
  static void scales(const uint8_t* b, float* scale, float* min) { kquant_scales(b, scale, min); }
  static void lanes(const uint8_t* b, int s, __m256i* q) {
    const uint8_t* src = b + kQs + 32 * (s / 2);
    for (int i = 0; i < 4; ++i) {
      const __m256i v = widen8u(src + 8 * i);
      q[i] = s % 2 ? high_nibble(v) : low_nibble(v);
    }
  }
#endif
};

// Q5_K: as Q4_K plus a fifth bit: bit s of qh[l] belongs to weight 32s + l.
template <>
struct Codec<DType::Q5_K> {
  using Block = BlockQ5_K;
  static constexpr bool kOneScalePer32 = true;
  static constexpr int kElems = 256;
  static constexpr bool kHasMin = true;
  static constexpr int kQh = LLMK_AT(Block, qh), kQs = LLMK_AT(Block, qs);
  static void decode_scalar(const uint8_t* b, int8_t* q, float* scale, float* min) {
    kquant_scales(b, scale, min);
    const uint8_t* qh = b + kQh;
    const uint8_t* qs = b + kQs;
    for (int j = 0; j < 4; ++j)
      for (int l = 0; l < 32; ++l) {
        q[64 * j + l] =
            static_cast<int8_t>((qs[32 * j + l] & 0x0F) | (((qh[l] >> (2 * j)) & 1) << 4));
        q[64 * j + 32 + l] =
            static_cast<int8_t>((qs[32 * j + l] >> 4) | (((qh[l] >> (2 * j + 1)) & 1) << 4));
      }
  }
#if defined(__AVX2__)
  static void decode_simd(const uint8_t* b, int8_t* q, float* scale, float* min) {
    kquant_scales(b, scale, min);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i one = _mm256_set1_epi8(1);
    const __m256i two = _mm256_set1_epi8(2);
    __m256i qh = load32(b + kQh);
    for (int j = 0; j < 4; ++j) {
      const __m256i raw = load32(b + kQs + 32 * j);
      // After shifting by 2j, bit 0 of each byte is sub-block 2j's fifth bit, bit 1 is 2j+1's.
      const __m256i h0 = _mm256_slli_epi16(_mm256_and_si256(qh, one), 4);
      const __m256i h1 = _mm256_slli_epi16(_mm256_and_si256(qh, two), 3);
      store32(q + 64 * j, _mm256_or_si256(_mm256_and_si256(raw, m4), h0));
      store32(q + 64 * j + 32,
              _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(raw, 4), m4), h1));
      qh = _mm256_srli_epi16(qh, 2);
    }
  }
#endif
};

// Q6_K: for half h and byte l < 32, ql[64h+l] gives weights 128h+l (low nibble) and 128h+64+l
// (high), ql[64h+32+l] gives 128h+32+l and 128h+96+l, and the bit pairs 0,1,2,3 of qh[32h+l]
// extend those four in the order +0, +32, +64, +96.
template <>
struct Codec<DType::Q6_K> {
  using Block = BlockQ6_K;
  static constexpr bool kOneScalePer32 = false;  // one per 16
  static constexpr int kElems = 256;
  static constexpr bool kHasMin = false;
  static constexpr int kQl = LLMK_AT(Block, ql), kQh = LLMK_AT(Block, qh),
                       kSc = LLMK_AT(Block, scales), kD = LLMK_AT(Block, d);
  static void group_scales(const uint8_t* b, float* scale) {
    const float d = f16_at(b + kD);
    for (int g = 0; g < 16; ++g) {
      scale[g] = d * static_cast<float>(static_cast<int8_t>(b[kSc + g]));
    }
  }
  static void decode_scalar(const uint8_t* b, int8_t* q, float* scale, float*) {
    group_scales(b, scale);
    for (int h = 0; h < 2; ++h)
      for (int l = 0; l < 32; ++l) {
        const int a = b[kQl + 64 * h + l], c = b[kQl + 64 * h + 32 + l];
        const int hh = b[kQh + 32 * h + l];
        q[128 * h + l] = static_cast<int8_t>(((a & 0x0F) | ((hh & 3) << 4)) - 32);
        q[128 * h + 32 + l] = static_cast<int8_t>(((c & 0x0F) | (((hh >> 2) & 3) << 4)) - 32);
        q[128 * h + 64 + l] = static_cast<int8_t>(((a >> 4) | (((hh >> 4) & 3) << 4)) - 32);
        q[128 * h + 96 + l] = static_cast<int8_t>(((c >> 4) | (((hh >> 6) & 3) << 4)) - 32);
      }
  }
#if defined(__AVX2__)
  static void decode_simd(const uint8_t* b, int8_t* q, float* scale, float*) {
    group_scales(b, scale);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i m30 = _mm256_set1_epi8(0x30);
    const __m256i off = _mm256_set1_epi8(32);
    for (int h = 0; h < 2; ++h) {
      const __m256i a = load32(b + kQl + 64 * h);
      const __m256i c = load32(b + kQl + 64 * h + 32);
      const __m256i hh = load32(b + kQh + 32 * h);
      // Each bit pair moves to bits 4..5; 16-bit shifts only leak bits that the mask drops.
      const __m256i h0 = _mm256_and_si256(_mm256_slli_epi16(hh, 4), m30);
      const __m256i h1 = _mm256_and_si256(_mm256_slli_epi16(hh, 2), m30);
      const __m256i h2 = _mm256_and_si256(hh, m30);
      const __m256i h3 = _mm256_and_si256(_mm256_srli_epi16(hh, 2), m30);
      const __m256i a_hi = _mm256_and_si256(_mm256_srli_epi16(a, 4), m4);
      const __m256i c_hi = _mm256_and_si256(_mm256_srli_epi16(c, 4), m4);
      store32(q + 128 * h, _mm256_sub_epi8(_mm256_or_si256(_mm256_and_si256(a, m4), h0), off));
      store32(q + 128 * h + 32, _mm256_sub_epi8(_mm256_or_si256(_mm256_and_si256(c, m4), h1), off));
      store32(q + 128 * h + 64, _mm256_sub_epi8(_mm256_or_si256(a_hi, h2), off));
      store32(q + 128 * h + 96, _mm256_sub_epi8(_mm256_or_si256(c_hi, h3), off));
    }
  }
#endif
};

#undef LLMK_AT

// True when Codec<T> has an AVX2 decoder.
template <class C>
concept HasSimdDecode = requires(const uint8_t* b, int8_t* q, float* f) {
  C::decode_simd(b, q, f, f);
};

#if defined(__AVX2__)
// True when Codec<T> offers the register-only scales()/lanes() view.
template <class C>
concept HasLanes = requires(const uint8_t* b, float* f, __m256i* q) {
  C::scales(b, f, f);
  C::lanes(b, 0, q);
};
#endif

// The fastest decoder available for this build.
template <class C>
inline void decode_block(const uint8_t* b, int8_t* q, float* scale, float* min) {
#if defined(__AVX2__)
  if constexpr (HasSimdDecode<C>) {
    C::decode_simd(b, q, scale, min);
    return;
  }
#endif
  C::decode_scalar(b, q, scale, min);
}

// Calls fn(Codec<T>{}) for a block dtype with a codec; returns false for other dtypes.
template <class Fn>
bool visit_codec(DType t, Fn&& fn) {
  switch (t) {
    case DType::Q4_0:
      fn(Codec<DType::Q4_0>{});
      return true;
    case DType::Q4_1:
      fn(Codec<DType::Q4_1>{});
      return true;
    case DType::Q5_0:
      fn(Codec<DType::Q5_0>{});
      return true;
    case DType::Q5_1:
      fn(Codec<DType::Q5_1>{});
      return true;
    case DType::Q8_0:
      fn(Codec<DType::Q8_0>{});
      return true;
    case DType::Q2_K:
      fn(Codec<DType::Q2_K>{});
      return true;
    case DType::Q3_K:
      fn(Codec<DType::Q3_K>{});
      return true;
    case DType::Q4_K:
      fn(Codec<DType::Q4_K>{});
      return true;
    case DType::Q5_K:
      fn(Codec<DType::Q5_K>{});
      return true;
    case DType::Q6_K:
      fn(Codec<DType::Q6_K>{});
      return true;
    default:
      return false;
  }
}

}  // namespace LLMK_CPU_ISA
}  // namespace llmk::cpu::detail
