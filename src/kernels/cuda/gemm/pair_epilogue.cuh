// The one-token epilogues shared by the one-row linear (gemv.cu) and qgemv (qlinear.cu), over a
// unit of two rows' products (gemv.h's GemvArgs says what each computes):
//   gated (Act = SiluMul or GeluTanhMul): unit j multiplies the gate row j and the up row F + j
//     of a stacked [gate; up] (N = 2F) and writes act(g) * u to output j;
//   RoPE (Act = RopeQkv): unit u multiplies the pair i = u % (D/2) of head u / (D/2) that RoPE
//     rotates together ((i, i + D/2), or (2i, 2i + 1) for adjacent pairs), rotates it (value
//     heads: as they are), writes both rows, and key and value heads to the cache row too.
#pragma once

#include <type_traits>

#include "kernels/cuda/activation.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm/gemv.h"
#include "kernels/cuda/rope.cuh"

namespace llmk::cuda {

// The RoPE epilogue's marker (GemvRope).
struct RopeQkv {};

template <class Act>
inline constexpr bool kPairRope = std::is_same_v<Act, RopeQkv>;
template <class Act>
inline constexpr bool kPairGated = !std::is_void_v<Act> && !kPairRope<Act>;

// A unit's two rows of w (N rows) and, for RoPE, its head and pair; `live`: the unit exists
// (unit < N / 2).
struct PairRows {
  int rows[2] = {0, 0};
  int head = 0, pair = 0;
  bool live = false;
};

template <class Act>
__device__ __forceinline__ PairRows pair_rows(int unit, int N, const GemvRope& rope) {
  PairRows p;
  p.live = unit < N / 2;
  if constexpr (kPairRope<Act>) {
    const int half = rope.D / 2;
    p.head = unit / half;
    p.pair = unit % half;
    p.rows[0] = p.head * rope.D + (rope.half_split ? p.pair : 2 * p.pair);
    p.rows[1] = p.rows[0] + (rope.half_split ? half : 1);
  } else {
    p.rows[0] = unit;
    p.rows[1] = unit + N / 2;
  }
  return p;
}

// The unit's epilogue from its two fp32 sums (bias not yet added): each product (+ bias) rounded
// to TOut as the linear's output would be; gated: act(g) * u to out[unit]; RoPE: the rotation
// (query and key heads) rounded again, as cuda::rope does, then the rows and the cache row.
template <class Act, typename TOut, typename TBias>
__device__ __forceinline__ void pair_store(TOut* out, const float (&acc)[2], const PairRows& p,
                                           int unit, const TBias* bias, const GemvRope& rope) {
  float v[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    v[r] = to_float(from_float<TOut>(acc[r] + (bias ? to_float(bias[p.rows[r]]) : 0.0f)));
  }
  if constexpr (kPairGated<Act>) {
    out[unit] = from_float<TOut>(Act{}(v[0], v[1]));
  } else {
    if (p.head < rope.Hq + rope.Hkv) {
      // The frequency's base in device double precision (cuda::rope takes it from the host).
      const float2 cs = rope_cos_sin(pow(rope.theta, -2.0 * p.pair / rope.D), rope.freq_factors,
                                     p.pair, rope.freq_scale, static_cast<double>(*rope.position));
      const float x0 = v[0], x1 = v[1];
      v[0] = x0 * cs.x - x1 * cs.y;
      v[1] = x0 * cs.y + x1 * cs.x;
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) out[p.rows[r]] = from_float<TOut>(v[r]);
    if (p.head >= rope.Hq) {
      const int64_t crow = *rope.cache_row;
      if (crow >= 0 && crow < rope.L) {
        const bool is_v = p.head >= rope.Hq + rope.Hkv;
        const int kvh = p.head - rope.Hq - (is_v ? rope.Hkv : 0);
        TOut* dst = static_cast<TOut*>(is_v ? rope.v_cache : rope.k_cache) +
                    crow * (is_v ? rope.vc_ld_l : rope.kc_ld_l) +
                    kvh * (is_v ? rope.vc_ld_h : rope.kc_ld_h) - p.head * rope.D;
#pragma unroll
        for (int r = 0; r < 2; ++r) dst[p.rows[r]] = from_float<TOut>(v[r]);
      }
    }
  }
}

}  // namespace llmk::cuda
