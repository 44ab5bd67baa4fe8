#include "kernels/cpu/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "core/half.h"
#include "kernels/cpu/dequant.h"

// This file must build without FMA contraction (CMakeLists.txt sets -ffp-contract=off for it):
// ggml's reference (and the gguf package, which the tests compare with) rounds `x * id` before
// adding the offset, and a fused multiply-add could move a weight across a rounding boundary.

namespace llmk::cpu {

namespace {

constexpr int kLegacy = 32;  // weights per legacy block
constexpr int kSuper = 256;  // weights per k-quant super-block

void put_f16(uint8_t* dst, float v) {
  const uint16_t h = float_to_fp16(v);
  std::memcpy(dst, &h, sizeof h);
}

// The f32 value an f16 field will decode to.
float as_stored_f16(float v) { return fp16_to_float(float_to_fp16(v)); }

// A float as an int without undefined behaviour: NaN gives 0 and values beyond +-1e9 saturate
// (every caller clamps to its levels). Only inputs near the bottom of the float range get here:
// a scale of 1e-39 (subnormal) has an inverse that overflows to infinity.
int saturating_int(float v) {
  if (std::isnan(v)) return 0;
  return static_cast<int>(std::clamp(v, -1e9f, 1e9f));
}

// Round half to even: the k-quants' rounding (any rule would do; this one has no bias).
int round_int(float v) { return saturating_int(std::nearbyint(v)); }

// The element of largest magnitude, with its sign (the first one on ties, as ggml takes it).
float signed_absmax(const float* x, int n) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < n; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

void min_max(const float* x, int n, float& lo, float& hi) {
  lo = std::numeric_limits<float>::infinity();
  hi = -std::numeric_limits<float>::infinity();
  for (int j = 0; j < n; ++j) {
    lo = std::min(lo, x[j]);
    hi = std::max(hi, x[j]);
  }
}

// ---- legacy types: ggml's reference rounding --------------------------------------------------

// Legacy blocks keep weight j < 16 in the low nibble of qs[j] and weight j + 16 in its high one.
void pack_nibbles(const int* q, uint8_t* qs) {
  for (int j = 0; j < kLegacy / 2; ++j) {
    qs[j] = static_cast<uint8_t>((q[j] & 0x0F) | ((q[j + kLegacy / 2] & 0x0F) << 4));
  }
}

// The fifth bit of weight j is bit j of a little-endian u32.
void pack_fifth_bits(const int* q, uint8_t* qh) {
  uint32_t bits = 0;
  for (int j = 0; j < kLegacy; ++j) bits |= static_cast<uint32_t>((q[j] >> 4) & 1) << j;
  std::memcpy(qh, &bits, sizeof bits);
}

// Q4_0 / Q5_0: w = d * (q - 2^(b-1)); the largest magnitude maps to q = 0 exactly, so the
// signed range's extra negative level is used. Each weight is truncated after adding half a level
// and the offset (round half up).
template <int kBits>
void symmetric_block(const float* x, float& d, int* q) {
  constexpr int kOffset = 1 << (kBits - 1), kMax = (1 << kBits) - 1;
  const float max = signed_absmax(x, kLegacy);
  d = max / -kOffset;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int j = 0; j < kLegacy; ++j) {
    const float scaled = x[j] * id;
    // Truncation, as ggml's (int8_t) cast: the sum is >= 0 for every finite input.
    q[j] = std::clamp(saturating_int(scaled + (static_cast<float>(kOffset) + 0.5f)), 0, kMax);
  }
}

// Q4_1 / Q5_1: w = d * q + m, with m the block's minimum and d its range over the levels.
template <int kBits>
void affine_block(const float* x, float& d, float& m, int* q) {
  constexpr int kMax = (1 << kBits) - 1;
  float lo, hi;
  min_max(x, kLegacy, lo, hi);
  d = (hi - lo) / kMax;
  m = lo;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int j = 0; j < kLegacy; ++j) {
    const float scaled = (x[j] - lo) * id;
    q[j] = std::clamp(saturating_int(scaled + 0.5f), 0, kMax);
  }
}

void quantize_q4_0(const float* x, BlockQ4_0& b) {
  float d;
  int q[kLegacy];
  symmetric_block<4>(x, d, q);
  put_f16(b.d, d);
  pack_nibbles(q, b.qs);
}

void quantize_q5_0(const float* x, BlockQ5_0& b) {
  float d;
  int q[kLegacy];
  symmetric_block<5>(x, d, q);
  put_f16(b.d, d);
  pack_fifth_bits(q, b.qh);
  pack_nibbles(q, b.qs);
}

void quantize_q4_1(const float* x, BlockQ4_1& b) {
  float d, m;
  int q[kLegacy];
  affine_block<4>(x, d, m, q);
  put_f16(b.d, d);
  put_f16(b.m, m);
  pack_nibbles(q, b.qs);
}

void quantize_q5_1(const float* x, BlockQ5_1& b) {
  float d, m;
  int q[kLegacy];
  affine_block<5>(x, d, m, q);
  put_f16(b.d, d);
  put_f16(b.m, m);
  pack_fifth_bits(q, b.qh);
  pack_nibbles(q, b.qs);
}

// Q8_0: w = d * q, d = max|x| / 127, q rounded half away from zero.
void quantize_q8_0(const float* x, BlockQ8_0& b) {
  float amax = 0.0f;
  for (int j = 0; j < kLegacy; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  put_f16(b.d, d);
  for (int j = 0; j < kLegacy; ++j) {
    b.qs[j] = static_cast<int8_t>(std::clamp(saturating_int(std::round(x[j] * id)), -127, 127));
  }
}

// ---- k-quants: a scale search per sub-block ---------------------------------------------------

// Weighted least squares over fixed levels q: the sums that the closed-form fits need.
struct Sums {
  double w = 0, q = 0, qq = 0, x = 0, xq = 0;
  void add(double wi, double xi, double qi) {
    w += wi;
    q += wi * qi;
    qq += wi * qi * qi;
    x += wi * xi;
    xq += wi * xi * qi;
  }
};

// A sub-block of Q4_K / Q5_K: x[i] ~ scale * q[i] - min with q in [0, kMax], scale >= 0 and
// min >= 0 (the format stores both unsigned, so the offset -min never rises above 0).
struct Affine {
  float scale = 0.0f, min = 0.0f;
};

// Tries the plain range mapping (lowest weight to level 0, highest to kMax) and 21 stretched
// versions of it; for each rounding of the weights, the scale and offset are refitted by weighted
// least squares (weights `w`), and the one with the smallest error wins.
template <int kMax>
Affine fit_affine(const float* x, const float* w, int n) {
  float lo, hi;
  min_max(x, n, lo, hi);
  lo = std::min(lo, 0.0f);
  if (hi <= lo) return {0.0f, -lo};  // all equal (and <= 0): the min alone reproduces them
  Affine best{(hi - lo) / kMax, -lo};
  double best_err = std::numeric_limits<double>::infinity();
  for (int step = -1; step <= 20; ++step) {
    const float levels = step < 0 ? static_cast<float>(kMax) : kMax - 1.0f + 0.1f * step;
    const float iscale = levels / (hi - lo);
    Sums s;
    int q[kSuper];
    for (int i = 0; i < n; ++i) {
      q[i] = std::clamp(round_int(iscale * (x[i] - lo)), 0, kMax);
      s.add(w[i], x[i], q[i]);
    }
    const double det = s.w * s.qq - s.q * s.q;
    double scale = 0, offset = 0;
    if (det > 0) {
      scale = (s.w * s.xq - s.x * s.q) / det;
      offset = (s.qq * s.x - s.q * s.xq) / det;
    }
    if (det <= 0 || offset > 0) {  // the offset must stay <= 0: fit the scale alone
      offset = 0;
      scale = s.qq > 0 ? s.xq / s.qq : 0;
    }
    double err = 0;
    for (int i = 0; i < n; ++i) {
      const double e = scale * q[i] + offset - x[i];
      err += w[i] * e * e;
    }
    if (err < best_err) {
      best_err = err;
      best = {static_cast<float>(std::max(scale, 0.0)), static_cast<float>(-offset)};
    }
  }
  return best;
}

// A group of Q6_K: x[i] ~ scale * q[i], q in [-kHalf, kHalf - 1]. Candidate scales map the
// largest magnitude to about -kHalf (the level the signed range has spare); each rounding is
// refitted by least squares weighted by x^2, so that the large weights, which dominate a dot
// product, are kept most precisely.
template <int kHalf>
float fit_symmetric(const float* x, int n) {
  const float max = signed_absmax(x, n);
  if (max == 0.0f) return 0.0f;
  double best_score = -1, best_scale = 0;
  for (int step = -9; step <= 9; ++step) {
    const float iscale = -(kHalf + 0.1f * step) / max;
    double xq = 0, qq = 0;
    for (int i = 0; i < n; ++i) {
      const int q = std::clamp(round_int(iscale * x[i]), -kHalf, kHalf - 1);
      const double w = static_cast<double>(x[i]) * x[i];
      xq += w * x[i] * q;
      qq += w * q * q;
    }
    // The weighted error at the best scale xq / qq is sum(w x^2) - xq^2 / qq.
    if (qq > 0 && xq * xq / qq > best_score) {
      best_score = xq * xq / qq;
      best_scale = xq / qq;
    }
  }
  return static_cast<float>(best_scale);
}

// The 6-bit (scale, min) pair j of Q4_K / Q5_K into the 12 packed bytes (the inverse of
// kquant_scale_min in block_decode.h): pairs 0..3 in the low 6 bits of bytes j and j + 4; pairs
// 4..7 split into a nibble each in byte j + 4 and their top 2 bits on top of bytes j - 4 and j.
void pack_scale_min(uint8_t* s, int j, int sc, int m) {
  if (j < 4) {
    s[j] = static_cast<uint8_t>((s[j] & 0xC0) | sc);
    s[j + 4] = static_cast<uint8_t>((s[j + 4] & 0xC0) | m);
  } else {
    s[j + 4] = static_cast<uint8_t>((sc & 0x0F) | ((m & 0x0F) << 4));
    s[j - 4] = static_cast<uint8_t>(s[j - 4] | ((sc >> 4) << 6));
    s[j] = static_cast<uint8_t>(s[j] | ((m >> 4) << 6));
  }
}

// Q4_K / Q5_K: eight sub-blocks of 32, each fitted on its own, then their scales and mins
// rounded to 6 bits against the super-block's f16 d and dmin; q[256] gets the final levels.
template <int kMax>
void kquant_affine(const float* x, uint8_t* d_field, uint8_t* dmin_field, uint8_t* scales, int* q) {
  constexpr int kSub = 32, kSubs = kSuper / kSub;
  Affine fits[kSubs];
  float w[kSub];
  for (int j = 0; j < kSubs; ++j) {
    const float* xs = x + j * kSub;
    float sum_sq = 0.0f;
    for (int i = 0; i < kSub; ++i) sum_sq += xs[i] * xs[i];
    // Every weight counts, the large ones more (an error there moves a dot product most).
    const float rms = std::sqrt(sum_sq / kSub);
    for (int i = 0; i < kSub; ++i) w[i] = rms + std::fabs(xs[i]);
    fits[j] = fit_affine<kMax>(xs, w, kSub);
  }
  float max_scale = 0.0f, max_min = 0.0f;
  for (const Affine& f : fits) {
    max_scale = std::max(max_scale, f.scale);
    max_min = std::max(max_min, f.min);
  }
  const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
  const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
  put_f16(d_field, max_scale / 63.0f);
  put_f16(dmin_field, max_min / 63.0f);
  const float d = as_stored_f16(max_scale / 63.0f), dmin = as_stored_f16(max_min / 63.0f);
  std::memset(scales, 0, 12);
  for (int j = 0; j < kSubs; ++j) {
    const int sc = std::min(63, round_int(inv_scale * fits[j].scale));
    const int m = std::min(63, round_int(inv_min * fits[j].min));
    pack_scale_min(scales, j, sc, m);
    const float step = d * static_cast<float>(sc), offset = dmin * static_cast<float>(m);
    for (int i = 0; i < kSub; ++i) {
      const int k = j * kSub + i;
      q[k] = step > 0 ? std::clamp(round_int((x[k] + offset) / step), 0, kMax) : 0;
    }
  }
}

// Q4_K: bytes 32c..32c+31 of qs hold sub-block 2c in their low and 2c+1 in their high nibbles.
void pack_q4_k_nibbles(const int* q, uint8_t* qs) {
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      qs[32 * c + l] =
          static_cast<uint8_t>((q[64 * c + l] & 0x0F) | ((q[64 * c + 32 + l] & 0x0F) << 4));
    }
  }
}

void quantize_q4_k(const float* x, BlockQ4_K& b) {
  int q[kSuper];
  kquant_affine<15>(x, b.d, b.dmin, b.scales, q);
  pack_q4_k_nibbles(q, b.qs);
}

// Q5_K: Q4_K's nibbles plus the fifth bit of weight 32s + l as bit s of qh[l].
void quantize_q5_k(const float* x, BlockQ5_K& b) {
  int q[kSuper];
  kquant_affine<31>(x, b.d, b.dmin, b.scales, q);
  pack_q4_k_nibbles(q, b.qs);
  std::memset(b.qh, 0, sizeof b.qh);
  for (int k = 0; k < kSuper; ++k) {
    b.qh[k % 32] = static_cast<uint8_t>(b.qh[k % 32] | (((q[k] >> 4) & 1) << (k / 32)));
  }
}

// Q6_K: sixteen groups of 16 with signed 8-bit scales against the f16 d; levels q + 32 in 6 bits.
void quantize_q6_k(const float* x, BlockQ6_K& b) {
  constexpr int kGroup = 16, kGroups = kSuper / kGroup;
  float scales[kGroups];
  float max_scale = 0.0f;  // the group scale of largest magnitude, with its sign
  for (int g = 0; g < kGroups; ++g) {
    scales[g] = fit_symmetric<32>(x + g * kGroup, kGroup);
    if (std::fabs(scales[g]) > std::fabs(max_scale)) max_scale = scales[g];
  }
  // The largest scale maps to -128, the int8 level the positive side lacks.
  const float iscale = max_scale != 0.0f ? -128.0f / max_scale : 0.0f;
  const float d_raw = max_scale != 0.0f ? 1.0f / iscale : 0.0f;
  put_f16(b.d, d_raw);
  const float d = as_stored_f16(d_raw);
  int q[kSuper];
  for (int g = 0; g < kGroups; ++g) {
    const int sc = std::clamp(round_int(iscale * scales[g]), -128, 127);
    b.scales[g] = static_cast<int8_t>(sc);
    const float step = d * static_cast<float>(sc);
    for (int i = 0; i < kGroup; ++i) {
      const int k = g * kGroup + i;
      q[k] = (step != 0.0f ? std::clamp(round_int(x[k] / step), -32, 31) : 0) + 32;
    }
  }
  // Per half h and l < 32: ql[64h + l] holds weights 128h + l (low nibble) and 128h + 64 + l
  // (high), ql[64h + 32 + l] weights 128h + 32 + l and 128h + 96 + l; qh[32h + l] their top two
  // bits in the order +0, +32, +64, +96.
  for (int h = 0; h < 2; ++h) {
    for (int l = 0; l < 32; ++l) {
      const int* p = q + 128 * h + l;
      b.ql[64 * h + l] = static_cast<uint8_t>((p[0] & 0x0F) | ((p[64] & 0x0F) << 4));
      b.ql[64 * h + 32 + l] = static_cast<uint8_t>((p[32] & 0x0F) | ((p[96] & 0x0F) << 4));
      b.qh[32 * h + l] = static_cast<uint8_t>((p[0] >> 4) | ((p[32] >> 4) << 2) |
                                              ((p[64] >> 4) << 4) | ((p[96] >> 4) << 6));
    }
  }
}

// Quantises n / kElems blocks of type Block with fn.
template <class Block, int kElems, class Fn>
void blocks(const float* src, void* dst, int64_t n, Fn fn) {
  auto* out = static_cast<Block*>(dst);
  for (int64_t b = 0; b < n / kElems; ++b) fn(src + b * kElems, out[b]);
}

// The block of 32 with scale d and integers q (already checked in range).
void pack_block(DType t, const int8_t* q, float d, uint8_t* dst) {
  int v[kLegacy];
  switch (t) {
    case DType::Q8_0: {
      auto& b = *reinterpret_cast<BlockQ8_0*>(dst);
      put_f16(b.d, d);
      std::memcpy(b.qs, q, kLegacy);
      return;
    }
    case DType::Q5_0: {
      auto& b = *reinterpret_cast<BlockQ5_0*>(dst);
      for (int j = 0; j < kLegacy; ++j) v[j] = q[j] + 16;
      put_f16(b.d, d);
      pack_fifth_bits(v, b.qh);
      pack_nibbles(v, b.qs);
      return;
    }
    default: {  // Q4_0
      auto& b = *reinterpret_cast<BlockQ4_0*>(dst);
      for (int j = 0; j < kLegacy; ++j) v[j] = q[j] + 8;
      put_f16(b.d, d);
      pack_nibbles(v, b.qs);
      return;
    }
  }
}

}  // namespace

void pack_symmetric_row(DType t, const int8_t* q, const float* scales, void* dst, int64_t n) {
  int lo = 0, hi = 0;
  switch (t) {
    case DType::Q8_0:
      lo = -128, hi = 127;
      break;
    case DType::Q5_0:
      lo = -16, hi = 15;
      break;
    case DType::Q4_0:
      lo = -8, hi = 7;
      break;
    default:
      throw Error(fmt::format("pack_symmetric_row: {} is not Q8_0, Q5_0 or Q4_0", dtype_name(t)));
  }
  LLMK_CHECK(n >= 0 && n % kLegacy == 0,
             "pack_symmetric_row: {} weights are not whole blocks of {}", n, kLegacy);
  const int64_t bytes = static_cast<int64_t>(bytes_for(t, kLegacy));
  auto* out = static_cast<uint8_t*>(dst);
  for (int64_t b = 0; b < n / kLegacy; ++b) {
    const float d = scales[b];
    LLMK_CHECK(as_stored_f16(d) == d,
               "{} blocks store f16 scales, but block {}'s scale {} is not "
               "a float16 value",
               dtype_name(t), b, d);
    const int8_t* qb = q + b * kLegacy;
    for (int j = 0; j < kLegacy; ++j) {
      LLMK_CHECK(qb[j] >= lo && qb[j] <= hi, "{} holds integers in [{}, {}], but weight {} is {}",
                 dtype_name(t), lo, hi, b * kLegacy + j, qb[j]);
    }
    pack_block(t, qb, d, out + b * bytes);
  }
}

bool can_quantize(DType t) {
  switch (t) {
    case DType::Q4_0:
    case DType::Q4_1:
    case DType::Q5_0:
    case DType::Q5_1:
    case DType::Q8_0:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
      return true;
    default:
      return false;
  }
}

void quantize_row(DType t, const float* src, void* dst, int64_t n) {
  LLMK_CHECK(can_quantize(t), "quantize_row: cannot write dtype {}", dtype_name(t));
  LLMK_CHECK(n >= 0 && n % block_size(t) == 0,
             "quantize_row: {} weights are not whole {} blocks of {}", n, dtype_name(t),
             block_size(t));
  switch (t) {
    case DType::Q4_0:
      return blocks<BlockQ4_0, kLegacy>(src, dst, n, quantize_q4_0);
    case DType::Q4_1:
      return blocks<BlockQ4_1, kLegacy>(src, dst, n, quantize_q4_1);
    case DType::Q5_0:
      return blocks<BlockQ5_0, kLegacy>(src, dst, n, quantize_q5_0);
    case DType::Q5_1:
      return blocks<BlockQ5_1, kLegacy>(src, dst, n, quantize_q5_1);
    case DType::Q8_0:
      return blocks<BlockQ8_0, kLegacy>(src, dst, n, quantize_q8_0);
    case DType::Q4_K:
      return blocks<BlockQ4_K, kSuper>(src, dst, n, quantize_q4_k);
    case DType::Q5_K:
      return blocks<BlockQ5_K, kSuper>(src, dst, n, quantize_q5_k);
    case DType::Q6_K:
      return blocks<BlockQ6_K, kSuper>(src, dst, n, quantize_q6_k);
    default:
      break;
  }
}

}  // namespace llmk::cpu
