// The decode of kernels/quant_layout.h's GPU layout shared by qlinear.cu (qgemv, qdequant) and
// gemm_act.cu (the quantised-weight GEMM): a chunk is 16 bytes of values (32 weights of the 4-,
// 5- and 6-bit types, 16 of Q8_0); Quad<T> reads a group of four chunks. qlinear.cu's header
// comment says how qgemv uses it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "core/dtype.h"
#include "kernels/cuda/common.cuh"

namespace llmk::cuda::qdec {

__device__ __forceinline__ uint32_t word(const uint4& v, int j) {
  return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

// Weights a chunk (16 bytes of values): 32 of the 4-, 5- and 6-bit types, 16 of Q8_0.
__host__ __device__ constexpr int chunk_elems(DType t) { return t == DType::Q8_0 ? 16 : 32; }
// Chunks a row: 32 weights each (16 bytes of nibbles; Q6_K's 16 bytes of low nibbles with their
// 8 bytes of high bits), 16 of Q8_0.
inline int chunks_per_row(DType t, int64_t K) { return static_cast<int>(K / chunk_elems(t)); }

__device__ __forceinline__ uint32_t bf2(__nv_bfloat162 v) {
  return *reinterpret_cast<const uint32_t*>(&v);
}

// (a & b) | c in one instruction (the compiler splits it when b and c are both constants).
__device__ __forceinline__ uint32_t and_or(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// 128 + the 4-bit values in bits 0-3 and 16-19 of `spread` (plus `high`, bits 4 and 5 of each
// half): two exact bf16 values in the mantissas of 128.0.
__device__ __forceinline__ uint32_t nibble_pair(uint32_t spread, uint32_t high) {
  return and_or(spread, 0x000F000Fu, high | 0x43004300u);
}
// The 5-bit types' pair: bits k and k + 16 of x (k a constant once inlined) as the fifth bits
// (bits 4 and 20) of the nibbles in bits 0-3 and 16-19 of `spread`: a shift and two lop3.
__device__ __forceinline__ uint32_t nibble_pair5(uint32_t spread, uint32_t x, int k) {
  const uint32_t y = k <= 4 ? x << (4 - k) : x >> (k - 4);
  return and_or(spread, 0x000F000Fu, and_or(y, 0x00100010u, 0x43004300u));
}

// ---- qgemv's staging: per group of 4 chunks of 16 rows, each lane's values (qvecs 16-byte
// vectors a row) and each row's meta span, copied by cp.async into the warp's ring ----

// The values of chunk c as 16-byte vectors in a row's values (their byte offset; at: from the
// row's first byte): Q6_K's low nibbles, then high bits; Q5_K's nibbles, then its half's fifth
// bits (kernels/quant_layout.h); the others' one vector.
template <DType T>
__host__ __device__ constexpr int qvec_offset(int c, int v) {
  if constexpr (T == DType::Q6_K) {
    const int sb = c / 8, n = (c % 8) / 4, a = c % 4;
    return 192 * sb + (v == 0 ? 64 * n + 16 * a : 128 + 32 * n + 16 * (a % 2));
  } else if constexpr (T == DType::Q5_K) {
    const int sb = c / 8;
    return 160 * sb + (v == 0 ? 32 + 16 * (c % 8) : 16 * ((c % 8) / 4));
  } else {
    return 16 * c;
  }
}
template <DType T>
__device__ __forceinline__ const uint8_t* qvec_at(const uint8_t* qrow, int c, int v) {
  return qrow + qvec_offset<T>(c, v);
}
template <DType T>
inline constexpr int kQVecs = T == DType::Q6_K || T == DType::Q5_K ? 2 : 1;
// The k-quants whose meta is one aligned 16-byte vector a super-block (d, dmin, scales[12]).
template <DType T>
inline constexpr bool kKMeta = T == DType::Q4_K || T == DType::Q5_K;

// The bytes of a row's meta a group (chunks c0 .. c0 + 3) reads: [start, start + len).
template <DType T>
__host__ __device__ constexpr int meta_start(int c0) {
  switch (T) {
    case DType::Q4_0:
      return 2 * c0;
    case DType::Q4_1:
      return 4 * c0;
    case DType::Q5_0:
      return 6 * c0;
    case DType::Q5_1:
      return 8 * c0;
    case DType::Q8_0:
      return 2 * (c0 / 2);
    case DType::Q4_K:
    case DType::Q5_K:
      return 16 * (c0 / 8);
    default:  // Q6_K
      return 18 * (c0 / 8);
  }
}
// 4-byte words staged a row: any span of at most 24 bytes, 2-aligned, or 32 bytes 4-aligned
// (Q5_1's four blocks).
constexpr int kMetaWords = 8;

__device__ __forceinline__ uint32_t u16_at(const uint8_t* p) {
  return *reinterpret_cast<const unsigned short*>(p);
}
__device__ __forceinline__ float half_bits(uint32_t h) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(h)));
}

// ---- qgemv's view of a group: four chunks c0 .. c0 + 3 (c0 a multiple of 4) across the four
// lanes t of a row. Lane t takes word t (bytes 4t .. 4t + 3) of every chunk, so the 16 weights a
// row of one k-step (four lanes, four weights each) come from one chunk and share its scale. The
// A fragments hold the weights' integers exactly (q less the type's offset, or 128 + q for the
// types with a minimum), and each scale group's product C is scaled in fp32: acc += s C, plus
// b X for the types with a minimum (kSums: X the sum of x over the group's positions, an mma
// with A all ones). Per type: kGroups scale groups a row per group of chunks, each of
// kGroupSteps k-steps: step n of group grp reads chunk(grp, n), its high nibbles if high(grp, n)
// (group(i, hi) the inverse);
// xoff(i, hi) (the step's first weight less the lane's first, which is 4t past chunk c0's
// first); kParts mma products a step; factor (s and b of group grp, from the row's staged meta),
// row_bits (what step needs of the meta besides) and step (a row's A registers for a step: [0]
// its weights +0, +1, [1] +2, +3). ----

// 128 + (q & 0x7F) and 128 + 128 (q >> 7) of two bytes (bits 0-7, 16-23 of spread): Q8_0's
// bytes q + 128 as two exact parts, each an mma of its own.
__device__ __forceinline__ uint32_t low7_pair(uint32_t spread) {
  return and_or(spread, 0x007F007Fu, 0x43004300u);
}
__device__ __forceinline__ uint32_t top_bit_pair(uint32_t spread) {
  return and_or(spread, 0x00800080u, 0x43004300u);
}

// 128 + the nibbles of word w's four bytes, the low ones or (hi) the high ones: [0] the file's
// bytes 0, 1; [1] bytes 2, 3.
__device__ __forceinline__ void nibble_step(uint32_t w, int hi, uint32_t (&a)[2]) {
  const uint32_t v = hi ? w >> 4 : w;
  a[0] = nibble_pair(v, 0);
  a[1] = nibble_pair(v >> 8, 0);
}

// pair - o, two exact bf16 values whose difference is exact (q - offset from 128 + q).
__device__ __forceinline__ uint32_t minus(uint32_t pair, float o) {
  const __nv_bfloat162 r =
      __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&pair), __floats2bfloat162_rn(o, o));
  return *reinterpret_cast<const uint32_t*>(&r);
}

template <DType T>
struct Quad;

// Blocks of 32: a chunk is a block (low nibbles weights +0..15, high +16..31).
struct LegacyQuad {
  static constexpr int kGroups = 4, kParts = 1;
  static constexpr bool kSums = false;
  static constexpr int kGroupSteps = 2;  // chunk grp: its low nibbles, then its high ones
  __device__ static constexpr int chunk(int grp, int) { return grp; }
  __device__ static constexpr int high(int, int n) { return n; }
  __device__ static constexpr int group(int i, int) { return i; }
  __device__ static constexpr int xoff(int i, int hi) { return 32 * i + 16 * hi; }
};

template <>
struct Quad<DType::Q4_0> : LegacyQuad {
  struct Row {};
  // w = d (q - 8): A holds q - 8, exact.
  __device__ static float2 factor(const uint8_t* m, int, int grp) {
    return {half_bits(u16_at(m + 2 * grp)), 0.0f};
  }
  __device__ static void row_bits(const uint8_t*, Row&) {}
  __device__ static void step(uint32_t w, uint32_t, const Row&, int, int hi, int, int,
                              uint32_t (&a)[2]) {
    nibble_step(w, hi, a);
    a[0] = minus(a[0], 136.0f);
    a[1] = minus(a[1], 136.0f);
  }
};

template <>
struct Quad<DType::Q4_1> : LegacyQuad {
  static constexpr bool kSums = true;
  struct Row {};
  // w = d q + m = d (128 + q) + m - 128 d
  __device__ static float2 factor(const uint8_t* m, int, int grp) {
    const float d = half_bits(u16_at(m + 4 * grp));
    return {d, fmaf(-128.0f, d, half_bits(u16_at(m + 4 * grp + 2)))};
  }
  __device__ static void row_bits(const uint8_t*, Row&) {}
  __device__ static void step(uint32_t w, uint32_t, const Row&, int, int hi, int, int,
                              uint32_t (&a)[2]) {
    nibble_step(w, hi, a);
  }
};

// The 5-bit blocks of 32: meta kMeta bytes a block (its scale, Q5_1's minimum, then qh[4]).
template <int kMeta>
struct Legacy5Quad : LegacyQuad {
  struct Row {
    uint32_t qh[4];  // each chunk's fifth bits, permuted (kernels/quant_layout.h: q5_qh_bit)
  };
  // Chunk i's fifth bits (its own only: the group's later chunks may lie past the row).
  __device__ static uint32_t chunk_bits(const uint8_t* m, int i) {
    return u16_at(m + kMeta * i + kMeta - 4) | u16_at(m + kMeta * i + kMeta - 2) << 16;
  }
  __device__ static void row_bits(const uint8_t* m, Row& row) {
#pragma unroll
    for (int i = 0; i < 4; ++i) row.qh[i] = chunk_bits(m, i);
  }
  // 128 + q (q the 5-bit value) of weights 4t + 2 half (+ 16 hi) and the next, whose fifth bits
  // are bits 4t + 2 half + hi and 16 more of the permuted word: one shift by 4t a chunk (shared by
  // its four pairs), then constant shifts.
  __device__ static void step5(uint32_t w, const Row& row, int i, int hi, int t, uint32_t (&a)[2]) {
    const uint32_t v = hi ? w >> 4 : w;
    const uint32_t s = row.qh[i] >> (4 * t);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      a[half] = nibble_pair5(half ? v >> 8 : v, s, 2 * half + hi);
    }
  }
};

template <>
struct Quad<DType::Q5_0> : Legacy5Quad<6> {
  // w = d (q - 16): A holds q - 16, exact.
  __device__ static float2 factor(const uint8_t* m, int, int grp) {
    return {half_bits(u16_at(m + 6 * grp)), 0.0f};
  }
  __device__ static void step(uint32_t w, uint32_t, const Row& row, int i, int hi, int t, int,
                              uint32_t (&a)[2]) {
    step5(w, row, i, hi, t, a);
    a[0] = minus(a[0], 144.0f);
    a[1] = minus(a[1], 144.0f);
  }
};

template <>
struct Quad<DType::Q5_1> : Legacy5Quad<8> {
  static constexpr bool kSums = true;
  // w = d q + m = d (128 + q) + m - 128 d
  __device__ static float2 factor(const uint8_t* m, int, int grp) {
    const float d = half_bits(u16_at(m + 8 * grp));
    return {d, fmaf(-128.0f, d, half_bits(u16_at(m + 8 * grp + 2)))};
  }
  __device__ static void step(uint32_t w, uint32_t, const Row& row, int i, int hi, int t, int,
                              uint32_t (&a)[2]) {
    step5(w, row, i, hi, t, a);
  }
};

// Q8_0: a chunk is half a block (16 weights, one k-step), two chunks a block; the step's bytes
// u = q + 128 in two exact parts, (u & 0x7F) - 256 and 128 + 128 (u >> 7), which sum to q.
template <>
struct Quad<DType::Q8_0> {
  static constexpr int kGroups = 2, kParts = 2;
  static constexpr bool kSums = false;
  struct Row {};
  static constexpr int kGroupSteps = 2;  // the block's two chunks
  __device__ static constexpr int chunk(int grp, int n) { return 2 * grp + n; }
  __device__ static constexpr int high(int, int) { return 0; }
  __device__ static constexpr int group(int i, int) { return i / 2; }
  __device__ static constexpr int xoff(int i, int) { return 16 * i; }
  __device__ static float2 factor(const uint8_t* m, int, int grp) {
    return {half_bits(u16_at(m + 2 * grp)), 0.0f};
  }
  __device__ static void row_bits(const uint8_t*, Row&) {}
  // part 0: (u & 0x7F) - 256 (from 128 + (u & 0x7F)), part 1: 128 + 128 (u >> 7).
  __device__ static void step(uint32_t w, uint32_t, const Row&, int, int, int, int part,
                              uint32_t (&a)[2]) {
    const uint32_t u = w ^ 0x80808080u;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const uint32_t spread = half ? u >> 8 : u;
      a[half] = part == 0 ? minus(low7_pair(spread), 384.0f) : top_bit_pair(spread);
    }
  }
};

// Q4_K: the group's four chunks lie in one super-block (c0 % 8 is 0 or 4): chunk i's low nibbles
// are weights 64 (i / 2) + 16 (i % 2) + k of the group's 128 (sub-block j0 + 2 (i / 2)), its high
// ones 32 further (the next sub-block); j0 = c0 % 8. Group 2 (i / 2) + hi: sub-block j0 + group.
// Q5_K: the same, with fifth bits.
template <>
struct Quad<DType::Q4_K> {
  static constexpr int kGroups = 4, kParts = 1;
  static constexpr bool kSums = true;
  struct Row {};
  static constexpr int kGroupSteps = 2;  // the sub-block's halves in chunks 2 (grp / 2) + n
  __device__ static constexpr int chunk(int grp, int n) { return 2 * (grp / 2) + n; }
  __device__ static constexpr int high(int grp, int) { return grp % 2; }
  __device__ static constexpr int group(int i, int hi) { return 2 * (i / 2) + hi; }
  __device__ static constexpr int xoff(int i, int hi) {
    return 64 * (i / 2) + 16 * (i % 2) + 32 * hi;
  }
  // w = d sc q - dmin m = (d sc) (128 + q) - dmin m - 128 d sc; sc and m of sub-blocks j0 ..
  // j0 + 3 as four bytes each (ggml's packing of scales[12]: the low four directly, the high
  // four from their low bits in scales[8..11] and top bits in the low four's bytes 6-7).
  __device__ static float2 factor(const uint8_t* m, int c0, int grp) {
    const uint4 meta = *reinterpret_cast<const uint4*>(m);  // d, dmin; scales[12]
    const float d = half_bits(meta.x), dmin = half_bits(meta.x >> 16);
    uint32_t sc, mn;
    if (c0 % 8 == 0) {
      sc = meta.y & 0x3F3F3F3Fu;
      mn = meta.z & 0x3F3F3F3Fu;
    } else {
      sc = (meta.w & 0x0F0F0F0Fu) | ((meta.y >> 2) & 0x30303030u);
      mn = ((meta.w >> 4) & 0x0F0F0F0Fu) | ((meta.z >> 2) & 0x30303030u);
    }
    const float s = d * static_cast<float>((sc >> (8 * grp)) & 0xFFu);
    return {s, fmaf(-128.0f, s, -dmin * static_cast<float>((mn >> (8 * grp)) & 0xFFu))};
  }
  __device__ static void row_bits(const uint8_t*, Row&) {}
  __device__ static void step(uint32_t w, uint32_t, const Row&, int, int hi, int, int,
                              uint32_t (&a)[2]) {
    nibble_step(w, hi, a);
  }
};

// qh: word t of the half's fifth-bit vector, whose nibble for a byte holds bit 4 (i % 2) +
// 2 (i / 2) + hi for chunk i (kernels/quant_layout.h).
template <>
struct Quad<DType::Q5_K> : Quad<DType::Q4_K> {
  __device__ static void step(uint32_t w, uint32_t qh, const Row&, int i, int hi, int, int,
                              uint32_t (&a)[2]) {
    const uint32_t v = hi ? w >> 4 : w;
    const int b = 4 * (i % 2) + 2 * (i / 2) + hi;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      a[half] = nibble_pair5(half ? v >> 8 : v, qh, b + 8 * half);
    }
  }
};

// Q6_K: chunks a = 0..3 of a super-block half n = (c0 % 8) / 4: chunk i's low nibbles weights
// 16 i + k of the half's 128 (scale 8 n + i), high ones 64 further (scale 8 n + i + 4); the top
// two bits in qh vector i % 2 (word t: bytes 4t..4t+3), bits 2 (i / 2) and 4 + 2 (i / 2).
template <>
struct Quad<DType::Q6_K> {
  static constexpr int kGroups = 8, kParts = 1;
  static constexpr bool kSums = false;
  struct Row {};
  static constexpr int kGroupSteps = 1;
  __device__ static constexpr int chunk(int grp, int) { return grp % 4; }
  __device__ static constexpr int high(int grp, int) { return grp / 4; }
  __device__ static constexpr int group(int i, int hi) { return i + 4 * hi; }
  __device__ static constexpr int xoff(int i, int hi) { return 16 * i + 64 * hi; }
  // w = d sc (q - 32): A holds q - 32, exact.
  __device__ static float2 factor(const uint8_t* m, int c0, int grp) {
    const auto* sc = reinterpret_cast<const int8_t*>(m) + 8 * ((c0 % 8) / 4);
    return {half_bits(u16_at(m + 16)) * static_cast<float>(sc[grp]), 0.0f};
  }
  __device__ static void row_bits(const uint8_t*, Row&) {}
  // qh: word t of qh vector i % 2.
  __device__ static void step(uint32_t w, uint32_t qh, const Row&, int i, int hi, int, int,
                              uint32_t (&a)[2]) {
    const uint32_t v = hi ? w >> 4 : w;
    const int sh = 2 * (i / 2);  // the low nibbles' bits in qh; the high ones' 4 above
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const uint32_t q = half ? qh >> 8 : qh;
      const uint32_t top = hi ? (q >> sh) & 0x00300030u : (q << (4 - sh)) & 0x00300030u;
      a[half] = minus(nibble_pair((half ? v >> 8 : v), top), 160.0f);
    }
  }
};

// 16 weights of chunk i (of the group of four from c0) as bf16 pairs, each s v + b in fp32 (v
// its integer, or 128 + q: Quad) rounded once: the low nibbles (hi 0) or the high ones, the
// weights at xoff(i, hi) + 0 .. 15 from chunk c0's first. f: Quad::factor of group(i, hi); q
// the chunk's values, qh its high bits (Q6_K), bits the row's Row.
template <DType T>
__device__ __forceinline__ void decode_half(const uint4& q, const uint4& qh,
                                            const typename Quad<T>::Row& bits, float2 f, int i,
                                            int hi, uint32_t (&out)[8]) {
  using Q = Quad<T>;
#pragma unroll
  for (int j = 0; j < 4; ++j) {  // word j: weights +4j .. +4j + 3
    float v[4];
#pragma unroll
    for (int part = 0; part < Q::kParts; ++part) {
      uint32_t a[2];
      Q::step(word(q, j), word(qh, j), bits, i, hi, j, part, a);
#pragma unroll
      for (int e = 0; e < 4; ++e) {  // bf16 to fp32: the high half as it is, the low shifted
        const uint32_t h = a[e / 2];
        const float x = __uint_as_float(e % 2 ? h & 0xFFFF0000u : h << 16);
        v[e] = part == 0 ? x : v[e] + x;  // (not 0 + x: an add the compiler would have to keep)
      }
    }
#pragma unroll
    for (int e = 0; e < 4; e += 2) {
      out[2 * j + e / 2] =
          bf2(__floats2bfloat162_rn(fmaf(f.x, v[e], f.y), fmaf(f.x, v[e + 1], f.y)));
    }
  }
}

// Calls f.template operator()<T>() for the kept type t.
template <class F>
void for_type(DType t, F&& f) {
  switch (t) {
    case DType::Q4_0:
      return f.template operator()<DType::Q4_0>();
    case DType::Q4_1:
      return f.template operator()<DType::Q4_1>();
    case DType::Q5_0:
      return f.template operator()<DType::Q5_0>();
    case DType::Q5_1:
      return f.template operator()<DType::Q5_1>();
    case DType::Q8_0:
      return f.template operator()<DType::Q8_0>();
    case DType::Q4_K:
      return f.template operator()<DType::Q4_K>();
    case DType::Q5_K:
      return f.template operator()<DType::Q5_K>();
    case DType::Q6_K:
      return f.template operator()<DType::Q6_K>();
    default:
      return;
  }
}

}  // namespace llmk::cuda::qdec
