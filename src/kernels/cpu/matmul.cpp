#include "kernels/cpu/matmul.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "core/thread_pool.h"
#include "kernels/cpu/block_decode.h"
#include "kernels/cpu/dequant.h"
#include "kernels/cpu/isa.h"

// Built once per instruction set (isa.h): everything here is in its namespace.
namespace llmk::cpu::LLMK_CPU_ISA {

namespace {

using detail::DecodedRun;
using detail::kGroup;
using detail::kRunElems;

// Up to this many x rows the fused path wins: its per-row cost is one FMA per weight per x row
// like the tiled kernel, without writing and re-reading an f32 copy of the weights.
[[maybe_unused]] constexpr int64_t kFusedMaxM = 4;  // (the baseline build has no fused path)
// Output rows per parallel_for grain in the fused path.
[[maybe_unused]] constexpr int64_t kFusedGrain = 16;

// Micro-kernel shape of the tiled path: MR x rows by NR weight rows, MR*NR accumulators.
constexpr int kMR = 4;
constexpr int kNR = 3;
// Per-thread f32 weight tile, in bytes: sized to stay in L1/L2 while all M rows pass over it.
constexpr int64_t kTileBytes = 48 * 1024;
constexpr int64_t kMaxTileRows = 48;

// y = v, or y += v when accumulating: the same f32 add as an add after the linear would do.
inline void store(float& y, float v, bool accumulate) { y = accumulate ? y + v : v; }

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

#if defined(__AVX2__)

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline __m256 load_i8_as_f32(const int8_t* q) {
  return _mm256_cvtepi32_ps(
      _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q))));
}

// ---- fused path, block types ----------------------------------------------------------------

// Sums of x over each group of 16, per x row, zero-padded to whole runs of 256 so that the
// per-run min term can always read 16 of them.
void group_sums(const LinearArgs& a, std::vector<float>& out, int64_t& ld) {
  const int64_t groups = a.K / kGroup;
  ld = round_up(groups, kRunElems / kGroup);
  out.assign(static_cast<size_t>(a.M * ld), 0.0f);
  for (int64_t m = 0; m < a.M; ++m) {
    const float* x = a.x + m * a.ldx;
    for (int64_t g = 0; g < groups; ++g) {
      __m256 s = _mm256_add_ps(_mm256_loadu_ps(x + g * 16), _mm256_loadu_ps(x + g * 16 + 8));
      out[static_cast<size_t>(m * ld + g)] = hsum(s);
    }
  }
}

// Rows [n0, n1) of y for M x rows (M <= kFusedMaxM, a template so accumulators stay in
// registers), for codecs without lanes(): runs of up to 256 weights are decoded to int8 in a
// small buffer, then per 32 weights 4 int8->f32 conversions are shared by all x rows, and each
// row adds one partial dot per scale group to its accumulators.
template <class C, int M>
void fused_block_rows(const LinearArgs& a, const float* xsum, int64_t xsum_ld, int64_t n0,
                      int64_t n1) {
  constexpr int kRunBlocks = kRunElems / C::kElems;
  constexpr int kBlockBytes = static_cast<int>(sizeof(typename C::Block));
  const int64_t nblocks = a.K / C::kElems;
  const auto* w = static_cast<const uint8_t*>(a.w);
  DecodedRun run;
  std::fill(std::begin(run.min), std::end(run.min), 0.0f);
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w + n * a.w_row_bytes;
    __m256 acc0[M], acc1[M], macc[M];
    for (int m = 0; m < M; ++m) acc0[m] = acc1[m] = macc[m] = _mm256_setzero_ps();
    for (int64_t b0 = 0; b0 < nblocks; b0 += kRunBlocks) {
      const int nb = static_cast<int>(std::min<int64_t>(kRunBlocks, nblocks - b0));
      for (int b = 0; b < nb; ++b) {
        detail::decode_block<C>(row + (b0 + b) * kBlockBytes, run.q + b * C::kElems,
                                run.scale + b * C::kElems / kGroup,
                                run.min + b * C::kElems / kGroup);
      }
      if constexpr (C::kHasMin) {
        // A short last run: clear the mins it did not write (their x sums are zero padding).
        std::fill(run.min + nb * C::kElems / kGroup, std::end(run.min), 0.0f);
      }
      const int64_t k0 = b0 * C::kElems;
      const int n32 = nb * C::kElems / 32;
      for (int g = 0; g < n32; ++g) {
        const int8_t* q = run.q + 32 * g;
        const __m256 f0 = load_i8_as_f32(q), f1 = load_i8_as_f32(q + 8);
        const __m256 f2 = load_i8_as_f32(q + 16), f3 = load_i8_as_f32(q + 24);
        const __m256 s0 = _mm256_set1_ps(run.scale[2 * g]);
        for (int m = 0; m < M; ++m) {
          const float* x = a.x + m * a.ldx + k0 + 32 * g;
          const __m256 lo =
              _mm256_fmadd_ps(f1, _mm256_loadu_ps(x + 8), _mm256_mul_ps(f0, _mm256_loadu_ps(x)));
          if constexpr (C::kOneScalePer32) {
            // One partial dot per 32; even and odd groups alternate accumulators so that
            // consecutive FMAs into one accumulator are two groups apart.
            const __m256 all = _mm256_fmadd_ps(f3, _mm256_loadu_ps(x + 24),
                                               _mm256_fmadd_ps(f2, _mm256_loadu_ps(x + 16), lo));
            if (g % 2 == 0) {
              acc0[m] = _mm256_fmadd_ps(s0, all, acc0[m]);
            } else {
              acc1[m] = _mm256_fmadd_ps(s0, all, acc1[m]);
            }
          } else {
            const __m256 s1 = _mm256_set1_ps(run.scale[2 * g + 1]);
            const __m256 hi = _mm256_fmadd_ps(f3, _mm256_loadu_ps(x + 24),
                                              _mm256_mul_ps(f2, _mm256_loadu_ps(x + 16)));
            acc0[m] = _mm256_fmadd_ps(s0, lo, acc0[m]);
            acc1[m] = _mm256_fmadd_ps(s1, hi, acc1[m]);
          }
        }
      }
      if constexpr (C::kHasMin) {
        const __m256 mn0 = _mm256_load_ps(run.min), mn1 = _mm256_load_ps(run.min + 8);
        for (int m = 0; m < M; ++m) {
          const float* xs = xsum + m * xsum_ld + k0 / kGroup;
          macc[m] = _mm256_fmadd_ps(mn0, _mm256_loadu_ps(xs), macc[m]);
          macc[m] = _mm256_fmadd_ps(mn1, _mm256_loadu_ps(xs + 8), macc[m]);
        }
      }
    }
    const float b = a.bias ? a.bias[n] : 0.0f;
    for (int m = 0; m < M; ++m) {
      float v = hsum(_mm256_add_ps(acc0[m], acc1[m]));
      if constexpr (C::kHasMin) v += hsum(macc[m]);
      store(a.y[m * a.ldy + n], v + b, a.accumulate);
    }
  }
}

// The same for codecs with the register-only lanes() view: block by block, each sub-block of
// 32 widened straight from the weight bytes (no decoded copy in memory).
template <class C, int M>
void fused_lane_rows(const LinearArgs& a, const float* xsum, int64_t xsum_ld, int64_t n0,
                     int64_t n1) {
  constexpr int kSubs = C::kElems / 32;
  constexpr int kGroups = C::kElems / kGroup;
  constexpr int64_t kBlockBytes = sizeof(typename C::Block);
  const int64_t nblocks = a.K / C::kElems;
  const auto* w = static_cast<const uint8_t*>(a.w);
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w + n * a.w_row_bytes;
    __m256 acc0[M], acc1[M], macc[M];
    float macc1[M];
    for (int m = 0; m < M; ++m) {
      acc0[m] = acc1[m] = macc[m] = _mm256_setzero_ps();
      macc1[m] = 0.0f;
    }
    for (int64_t b = 0; b < nblocks; ++b) {
      const uint8_t* blk = row + b * kBlockBytes;
      alignas(32) float sc[kGroups], mn[kGroups];
      C::scales(blk, sc, mn);
      for (int s = 0; s < kSubs; ++s) {
        __m256i qi[4];
        C::lanes(blk, s, qi);
        const __m256 f0 = _mm256_cvtepi32_ps(qi[0]), f1 = _mm256_cvtepi32_ps(qi[1]);
        const __m256 f2 = _mm256_cvtepi32_ps(qi[2]), f3 = _mm256_cvtepi32_ps(qi[3]);
        const __m256 s0 = _mm256_set1_ps(sc[2 * s]);
        const bool odd = ((b * kSubs + s) & 1) != 0;
        for (int m = 0; m < M; ++m) {
          const float* x = a.x + m * a.ldx + b * C::kElems + 32 * s;
          const __m256 lo =
              _mm256_fmadd_ps(f1, _mm256_loadu_ps(x + 8), _mm256_mul_ps(f0, _mm256_loadu_ps(x)));
          if constexpr (C::kOneScalePer32) {
            // One partial dot per 32; alternate accumulators so consecutive FMAs into one
            // accumulator are two sub-blocks apart.
            const __m256 all = _mm256_fmadd_ps(f3, _mm256_loadu_ps(x + 24),
                                               _mm256_fmadd_ps(f2, _mm256_loadu_ps(x + 16), lo));
            if (odd) {
              acc1[m] = _mm256_fmadd_ps(s0, all, acc1[m]);
            } else {
              acc0[m] = _mm256_fmadd_ps(s0, all, acc0[m]);
            }
          } else {
            const __m256 s1 = _mm256_set1_ps(sc[2 * s + 1]);
            const __m256 hi = _mm256_fmadd_ps(f3, _mm256_loadu_ps(x + 24),
                                              _mm256_mul_ps(f2, _mm256_loadu_ps(x + 16)));
            acc0[m] = _mm256_fmadd_ps(s0, lo, acc0[m]);
            acc1[m] = _mm256_fmadd_ps(s1, hi, acc1[m]);
          }
        }
      }
      if constexpr (C::kHasMin) {
        const int64_t g0 = b * kGroups;
        for (int m = 0; m < M; ++m) {
          const float* xs = xsum + m * xsum_ld + g0;
          if constexpr (kGroups == 16) {
            macc[m] = _mm256_fmadd_ps(_mm256_load_ps(mn), _mm256_loadu_ps(xs), macc[m]);
            macc[m] = _mm256_fmadd_ps(_mm256_load_ps(mn + 8), _mm256_loadu_ps(xs + 8), macc[m]);
          } else {
            static_assert(kGroups == 2);
            macc1[m] += mn[0] * (xs[0] + xs[1]);  // one min per 32
          }
        }
      }
    }
    const float bias = a.bias ? a.bias[n] : 0.0f;
    for (int m = 0; m < M; ++m) {
      float v = hsum(_mm256_add_ps(acc0[m], acc1[m]));
      if constexpr (C::kHasMin) v += hsum(macc[m]) + macc1[m];
      store(a.y[m * a.ldy + n], v + bias, a.accumulate);
    }
  }
}

// ---- fused path, plain types ----------------------------------------------------------------

struct LoadF32 {
  using T = float;
  static __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
  static float one(float v) { return v; }
};
struct LoadF16 {
  using T = uint16_t;
  static __m256 load8(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static float one(uint16_t v) { return fp16_to_float(v); }
};
struct LoadBF16 {
  using T = uint16_t;
  static __m256 load8(const uint16_t* p) {
    const __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
  }
  static float one(uint16_t v) { return bf16_to_float(v); }
};

template <class L, int M>
void fused_plain_rows(const LinearArgs& a, int64_t n0, int64_t n1) {
  const int64_t K = a.K;
  for (int64_t n = n0; n < n1; ++n) {
    const auto* row = reinterpret_cast<const typename L::T*>(static_cast<const uint8_t*>(a.w) +
                                                             n * a.w_row_bytes);
    __m256 acc0[M], acc1[M];
    for (int m = 0; m < M; ++m) acc0[m] = acc1[m] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
      const __m256 w0 = L::load8(row + k), w1 = L::load8(row + k + 8);
      for (int m = 0; m < M; ++m) {
        const float* x = a.x + m * a.ldx + k;
        acc0[m] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x), acc0[m]);
        acc1[m] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + 8), acc1[m]);
      }
    }
    for (; k + 8 <= K; k += 8) {
      const __m256 w0 = L::load8(row + k);
      for (int m = 0; m < M; ++m) {
        acc0[m] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(a.x + m * a.ldx + k), acc0[m]);
      }
    }
    const float b = a.bias ? a.bias[n] : 0.0f;
    for (int m = 0; m < M; ++m) {
      float v = hsum(_mm256_add_ps(acc0[m], acc1[m]));
      for (int64_t kk = k; kk < K; ++kk) v += L::one(row[kk]) * a.x[m * a.ldx + kk];
      store(a.y[m * a.ldy + n], v + b, a.accumulate);
    }
  }
}

// Runs fn.template operator()<M>() for M in 1..kFusedMaxM.
template <class Fn>
void with_m(int64_t M, Fn&& fn) {
  switch (M) {
    case 1:
      fn.template operator()<1>();
      break;
    case 2:
      fn.template operator()<2>();
      break;
    case 3:
      fn.template operator()<3>();
      break;
    case 4:
      fn.template operator()<4>();
      break;
    default:
      LLMK_FAIL("linear: fused path got M = {} > {}", M, kFusedMaxM);
  }
}
static_assert(kFusedMaxM == 4, "with_m covers M = 1..4");

// x rows in groups of up to kFusedMaxM; within a group every weight block is decoded once.
void linear_fused(const LinearArgs& a) {
  for (int64_t m0 = 0; m0 < a.M; m0 += kFusedMaxM) {
    LinearArgs g = a;
    g.M = std::min(kFusedMaxM, a.M - m0);
    g.x = a.x + m0 * a.ldx;
    g.y = a.y + m0 * a.ldy;
    const bool is_block_type = detail::visit_codec(g.wtype, [&](auto codec) {
      using C = decltype(codec);
      std::vector<float> xsum;
      int64_t xsum_ld = 0;
      if constexpr (C::kHasMin) group_sums(g, xsum, xsum_ld);
      with_m(g.M, [&]<int M>() {
        cpu_pool().parallel_for(g.N, kFusedGrain, [&](int64_t n0, int64_t n1) {
          if constexpr (detail::HasLanes<C>) {
            fused_lane_rows<C, M>(g, xsum.data(), xsum_ld, n0, n1);
          } else {
            fused_block_rows<C, M>(g, xsum.data(), xsum_ld, n0, n1);
          }
        });
      });
    });
    if (is_block_type) continue;
    auto plain = [&]<class L>() {
      with_m(g.M, [&]<int M>() {
        cpu_pool().parallel_for(g.N, kFusedGrain,
                                [&](int64_t n0, int64_t n1) { fused_plain_rows<L, M>(g, n0, n1); });
      });
    };
    switch (g.wtype) {
      case DType::F32:
        plain.template operator()<LoadF32>();
        break;
      case DType::F16:
        plain.template operator()<LoadF16>();
        break;
      case DType::BF16:
        plain.template operator()<LoadBF16>();
        break;
      default:
        LLMK_FAIL("linear: weight dtype {} is not supported", dtype_name(g.wtype));
    }
  }
}

// ---- 8-bit activations (LinearPath::Int8): Q8_0, Q4_1 -----------------------------------------

// Each x row quantised per 32 as Q8_0 quantises its weights (d = max |x| / 127, q = round(x / d),
// so |q| <= 127), with the sums of the quantised x per 32 and per 16 beside it: a block's dot is
// then its integer products summed exactly in int32, scaled once in f32, plus (for a type with a
// minimum) the minimum times that sum. So each output is exactly the dot of the weights with the
// quantised x, up to f32 rounding: it moves from the f32 path's by at most sum_k |w_k| d_x / 2.
// (The minimum times the exact sum of x instead leaves the error sum_k (w_k - min) d_x / 2, which
// with Q4_1's and the K-quants' unsigned integers is about twice as large: SmolLM2's logits moved
// twice as far from the f32 path's.)
struct Q8Acts {
  std::vector<int8_t> q;      // [M][K]
  std::vector<float> d, sum;  // [M][K / 32]: scales, d * sum of q
  std::vector<float> sum16;   // [M][K / 16]: d * sum of q per group of 16 (block_int8_rows' minima)
};

void quantize_acts(const LinearArgs& a, Q8Acts& out) {
  const int64_t nb = a.K / 32;
  out.q.resize(static_cast<size_t>(a.M * a.K));
  out.d.resize(static_cast<size_t>(a.M * nb));
  out.sum.resize(static_cast<size_t>(a.M * nb));
  out.sum16.resize(static_cast<size_t>(a.M * 2 * nb));
  for (int64_t m = 0; m < a.M; ++m) {
    for (int64_t b = 0; b < nb; ++b) {
      const float* x = a.x + m * a.ldx + 32 * b;
      float amax = 0.0f;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
      const float d = amax / 127.0f, inv = d > 0.0f ? 1.0f / d : 0.0f;
      int8_t* q = out.q.data() + m * a.K + 32 * b;
      int sum[2] = {0, 0};
      for (int j = 0; j < 32; ++j) {
        q[j] = static_cast<int8_t>(std::nearbyint(x[j] * inv));
        sum[j / 16] += q[j];
      }
      const size_t at = static_cast<size_t>(m * nb + b);
      out.d[at] = d;
      out.sum[at] = d * static_cast<float>(sum[0] + sum[1]);
      out.sum16[2 * at] = d * static_cast<float>(sum[0]);
      out.sum16[2 * at + 1] = d * static_cast<float>(sum[1]);
    }
  }
}

// The 32 products of unsigned 8-bit u (at most 128 here: |w| of int8 weights, or small unsigned
// values) and signed 8-bit s (|s| <= 127), as 8 int32 sums: maddubs (pairs summed in int16, at
// most 2 * 128 * 127, no saturation) then madd.
inline __m256i dot_u8s8(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}
// The same for signed weights w: |w| times x with w's sign.
inline __m256i dot_s8s8(__m256i w, __m256i x) {
  return dot_u8s8(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
}

// The int8 view of a weight block of 32: its scale, minimum (or none) and the 32 products with a
// block of int8 activations as 8 int32 sums.
template <DType T>
struct Int8Block;

template <>
struct Int8Block<DType::Q8_0> {  // w = d q, q int8
  static constexpr int64_t kBytes = sizeof(BlockQ8_0);
  static constexpr bool kHasMin = false;
  static float d(const uint8_t* b) { return detail::f16_at(b); }
  static float m(const uint8_t*) { return 0.0f; }
  static __m256i dot(const uint8_t* b, __m256i x) {
    return dot_s8s8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2)), x);
  }
};

template <>
struct Int8Block<DType::Q4_1> {  // w = d q + m, q the nibbles 0..15
  static constexpr int64_t kBytes = sizeof(BlockQ4_1);
  static constexpr bool kHasMin = true;
  static float d(const uint8_t* b) { return detail::f16_at(b); }
  static float m(const uint8_t* b) { return detail::f16_at(b + 2); }
  static __m256i dot(const uint8_t* b, __m256i x) {
    return dot_u8s8(detail::nibbles_lo_then_hi(b + 4), x);
  }
};

// One output row's sums for M x rows: the scaled integer dots (8 lanes) and the minima's terms;
// store() writes y[m, n] = their total + bias.
template <int M>
struct Int8Sums {
  __m256 acc[M];
  float macc[M];
  Int8Sums() {
    for (int m = 0; m < M; ++m) {
      acc[m] = _mm256_setzero_ps();
      macc[m] = 0.0f;
    }
  }
  void store_row(const LinearArgs& a, int64_t n) const {
    const float bias = a.bias ? a.bias[n] : 0.0f;
    for (int m = 0; m < M; ++m) {
      store(a.y[m * a.ldy + n], hsum(acc[m]) + macc[m] + bias, a.accumulate);
    }
  }
};

template <DType T, int M>
void int8_rows(const LinearArgs& a, const Q8Acts& xs, int64_t n0, int64_t n1) {
  using B = Int8Block<T>;
  const int64_t nb = a.K / 32;
  const auto* w = static_cast<const uint8_t*>(a.w);
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w + n * a.w_row_bytes;
    Int8Sums<M> r;
    auto& acc = r.acc;
    auto& macc = r.macc;
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = row + b * B::kBytes;
      const float dw = B::d(blk);
      for (int m = 0; m < M; ++m) {
        const size_t at = static_cast<size_t>(m * nb + b);
        const __m256i xq =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xs.q.data() + m * a.K + 32 * b));
        const __m256 dot = _mm256_cvtepi32_ps(B::dot(blk, xq));
        acc[m] = _mm256_fmadd_ps(_mm256_set1_ps(dw * xs.d[at]), dot, acc[m]);
        if constexpr (B::kHasMin) macc[m] += B::m(blk) * xs.sum[at];
      }
    }
    r.store_row(a, n);
  }
}

// Every other block type: each block decoded to int8 values with a scale (and minimum) per 16
// (detail::decode_block, as the f32 fused path decodes them), then per 32 weights the integer
// dot in the two 128-bit halves (16 weights each, under their own scale), scaled in f32; the
// minima times the x sums of their 16.
template <class C, int M>
void block_int8_rows(const LinearArgs& a, const Q8Acts& xs, int64_t n0, int64_t n1) {
  constexpr int kBlockBytes = static_cast<int>(sizeof(typename C::Block));
  constexpr int kGroups = C::kElems / kGroup;
  const int64_t nblocks = a.K / C::kElems, nb32 = a.K / 32;
  const auto* w = static_cast<const uint8_t*>(a.w);
  alignas(32) int8_t q[C::kElems];
  alignas(32) float sc[kGroups], mn[kGroups];
  std::fill(std::begin(mn), std::end(mn), 0.0f);
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w + n * a.w_row_bytes;
    Int8Sums<M> r;
    auto& acc = r.acc;
    auto& macc = r.macc;
    for (int64_t b = 0; b < nblocks; ++b) {
      detail::decode_block<C>(row + b * kBlockBytes, q, sc, mn);
      for (int g = 0; g < C::kElems / 32; ++g) {
        const __m256i wq = _mm256_load_si256(reinterpret_cast<const __m256i*>(q + 32 * g));
        const __m256 scales = _mm256_set_m128(_mm_set1_ps(sc[2 * g + 1]), _mm_set1_ps(sc[2 * g]));
        const int64_t xb = b * (C::kElems / 32) + g;  // x's block of 32
        for (int m = 0; m < M; ++m) {
          const __m256i xq =
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xs.q.data() + m * a.K + 32 * xb));
          const __m256i p = dot_s8s8(wq, xq);
          const __m256 dx = _mm256_set1_ps(xs.d[static_cast<size_t>(m * nb32 + xb)]);
          acc[m] = _mm256_fmadd_ps(_mm256_mul_ps(scales, dx), _mm256_cvtepi32_ps(p), acc[m]);
          if constexpr (C::kHasMin) {
            const float* s16 = xs.sum16.data() + m * 2 * nb32 + 2 * xb;
            macc[m] += mn[2 * g] * s16[0] + mn[2 * g + 1] * s16[1];
          }
        }
      }
    }
    r.store_row(a, n);
  }
}

void linear_int8(const LinearArgs& a) {
  Q8Acts xs;
  for (int64_t m0 = 0; m0 < a.M; m0 += kFusedMaxM) {
    LinearArgs g = a;
    g.M = std::min(kFusedMaxM, a.M - m0);
    g.x = a.x + m0 * a.ldx;
    g.y = a.y + m0 * a.ldy;
    quantize_acts(g, xs);
    // rows.template operator()<M>(n0, n1) over the output rows, on the pool.
    const auto run = [&](auto rows) {
      with_m(g.M, [&]<int M>() {
        cpu_pool().parallel_for(
            g.N, kFusedGrain, [&](int64_t n0, int64_t n1) { rows.template operator()<M>(n0, n1); });
      });
    };
    if (g.wtype == DType::Q4_1) {
      run([&]<int M>(int64_t n0, int64_t n1) { int8_rows<DType::Q4_1, M>(g, xs, n0, n1); });
    } else if (g.wtype == DType::Q8_0) {
      run([&]<int M>(int64_t n0, int64_t n1) { int8_rows<DType::Q8_0, M>(g, xs, n0, n1); });
    } else {
      detail::visit_codec(g.wtype, [&](auto codec) {
        using C = decltype(codec);
        run([&]<int M>(int64_t n0, int64_t n1) { block_int8_rows<C, M>(g, xs, n0, n1); });
      });
    }
  }
}

#endif  // __AVX2__

// ---- tiled path -------------------------------------------------------------------------------

// y[i, j] (+)= dot(x row i, w row j) + bias[j] for i < MR_, j < NR_, over K8 (a multiple of 8;
// both operands are zero-padded to it).
template <int MR_, int NR_>
void micro_kernel(const float* x, int64_t ldx, const float* w, int64_t ldw, int64_t K8,
                  const float* bias, float* y, int64_t ldy, bool accumulate) {
#if defined(__AVX2__)
  __m256 acc[MR_][NR_];
  for (int i = 0; i < MR_; ++i)
    for (int j = 0; j < NR_; ++j) acc[i][j] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K8; k += 8) {
    __m256 wv[NR_];
    for (int j = 0; j < NR_; ++j) wv[j] = _mm256_loadu_ps(w + j * ldw + k);
    for (int i = 0; i < MR_; ++i) {
      const __m256 xv = _mm256_loadu_ps(x + i * ldx + k);
      for (int j = 0; j < NR_; ++j) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < MR_; ++i)
    for (int j = 0; j < NR_; ++j)
      store(y[i * ldy + j], hsum(acc[i][j]) + (bias ? bias[j] : 0.0f), accumulate);
#else
  float acc[MR_][NR_] = {};
  for (int64_t k = 0; k < K8; ++k)
    for (int i = 0; i < MR_; ++i)
      for (int j = 0; j < NR_; ++j) acc[i][j] += x[i * ldx + k] * w[j * ldw + k];
  for (int i = 0; i < MR_; ++i)
    for (int j = 0; j < NR_; ++j)
      store(y[i * ldy + j], acc[i][j] + (bias ? bias[j] : 0.0f), accumulate);
#endif
}

using MicroFn = void (*)(const float*, int64_t, const float*, int64_t, int64_t, const float*,
                         float*, int64_t, bool);

MicroFn micro_for(int mr, int nr) {
  // Every (mr, nr) up to (kMR, kNR): full tiles use the largest, edges the smaller ones.
  static const MicroFn table[kMR][kNR] = {
      {micro_kernel<1, 1>, micro_kernel<1, 2>, micro_kernel<1, 3>},
      {micro_kernel<2, 1>, micro_kernel<2, 2>, micro_kernel<2, 3>},
      {micro_kernel<3, 1>, micro_kernel<3, 2>, micro_kernel<3, 3>},
      {micro_kernel<4, 1>, micro_kernel<4, 2>, micro_kernel<4, 3>},
  };
  static_assert(kMR == 4 && kNR == 3, "update the micro-kernel table");
  return table[mr - 1][nr - 1];
}

void linear_tiled(const LinearArgs& a) {
  const int64_t K8 = round_up(a.K, 8);
  // x with rows padded to K8 when K is not a multiple of 8 (only plain weight types allow it).
  std::vector<float> xpad;
  const float* x = a.x;
  int64_t ldx = a.ldx;
  if (K8 != a.K) {
    xpad.assign(static_cast<size_t>(a.M * K8), 0.0f);
    for (int64_t m = 0; m < a.M; ++m) {
      std::memcpy(xpad.data() + m * K8, a.x + m * a.ldx, static_cast<size_t>(a.K) * sizeof(float));
    }
    x = xpad.data();
    ldx = K8;
  }
  const int64_t fit = kTileBytes / (K8 * static_cast<int64_t>(sizeof(float)));
  const int64_t tile_rows = std::clamp<int64_t>(fit / kNR * kNR, kNR, kMaxTileRows);
  const int64_t ntiles = (a.N + tile_rows - 1) / tile_rows;
  const auto* w = static_cast<const uint8_t*>(a.w);
  cpu_pool().parallel_for(ntiles, 1, [&](int64_t t0, int64_t t1) {
    thread_local std::vector<float> tile;
    tile.resize(static_cast<size_t>(tile_rows * K8));
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n0 = t * tile_rows;
      const int64_t nt = std::min(tile_rows, a.N - n0);
      for (int64_t r = 0; r < nt; ++r) {
        float* dst = tile.data() + r * K8;
        dequantize_row(a.wtype, w + (n0 + r) * a.w_row_bytes, dst, a.K);
        std::fill(dst + a.K, dst + K8, 0.0f);
      }
      for (int64_t m0 = 0; m0 < a.M; m0 += kMR) {
        const int mr = static_cast<int>(std::min<int64_t>(kMR, a.M - m0));
        for (int64_t j0 = 0; j0 < nt; j0 += kNR) {
          const int nr = static_cast<int>(std::min<int64_t>(kNR, nt - j0));
          micro_for(mr, nr)(x + m0 * ldx, ldx, tile.data() + j0 * K8, K8, K8,
                            a.bias ? a.bias + n0 + j0 : nullptr, a.y + m0 * a.ldy + n0 + j0, a.ldy,
                            a.accumulate);
        }
      }
    }
  });
}

}  // namespace

bool linear_supports(DType wtype) { return can_dequantize(wtype); }

bool linear_int8_supports(DType wtype) {
#if defined(__AVX2__)
  return detail::visit_codec(wtype, [](auto) {});
#else
  (void)wtype;
  return false;
#endif
}

LinearPath linear_choose_path(const LinearArgs& a) {
#if defined(__AVX2__)
  if (a.M <= kFusedMaxM && int8_activations() && linear_int8_supports(a.wtype)) {
    return LinearPath::Int8;
  }
  return a.M <= kFusedMaxM ? LinearPath::Fused : LinearPath::Tiled;
#else
  (void)a;
  return LinearPath::Tiled;
#endif
}

void linear(const LinearArgs& a, LinearPath path) {
  LLMK_CHECK(linear_supports(a.wtype), "linear: weight dtype {} is not supported",
             dtype_name(a.wtype));
  LLMK_CHECK(a.K % block_size(a.wtype) == 0, "linear: K = {} is not whole {} blocks", a.K,
             dtype_name(a.wtype));
  if (a.M == 0 || a.N == 0) return;
  if (a.K == 0) {
    for (int64_t m = 0; m < a.M; ++m)
      for (int64_t n = 0; n < a.N; ++n)
        store(a.y[m * a.ldy + n], a.bias ? a.bias[n] : 0.0f, a.accumulate);
    return;
  }
  if (path == LinearPath::Auto) path = LLMK_CPU_ISA::linear_choose_path(a);
  LLMK_CHECK(path != LinearPath::Int8 || linear_int8_supports(a.wtype),
             "linear: no 8-bit activation path for weight dtype {}", dtype_name(a.wtype));
#if defined(__AVX2__)
  if (path == LinearPath::Fused) {
    linear_fused(a);
    return;
  }
  if (path == LinearPath::Int8) {
    linear_int8(a);
    return;
  }
#endif
  linear_tiled(a);
}

}  // namespace llmk::cpu::LLMK_CPU_ISA
