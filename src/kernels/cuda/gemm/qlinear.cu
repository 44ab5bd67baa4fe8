// Quantised linear layers: see qlinear.h; the weights' layout is kernels/quant_layout.h's.
//
// qgemv: a block of 8 warps owns 16 output rows; warp w takes every 8th group of 4 chunks of the
// rows' quantised bytes (a chunk: 16 bytes of values, 32 weights of the 4-, 5- and 6-bit types, 16
// of Q8_0), lane (g, t) = (lane / 4, lane % 4) chunk t of the group in rows g and g + 8. Each warp
// streams its groups through a ring of kStages slots in shared memory: cp.async copies a group's
// values (each lane its own 16-byte vectors) and the 16 rows' meta spans (4-byte words, 8 a row)
// while the warp computes the group kStages - 1 before it. A chunk's weights become bf16 pairs in
// registers:
//   the nibbles (plus high bits) of two bytes go into the mantissas of 128.0 in one bf16x2
//   (byte_perm to spread the bytes, then a mask and an or), 128 is subtracted (exact), then
//   w = q * scale + min in one bf16x2 fma (the scale and min rounded to bf16 first);
//   Q8_0's signed bytes go through fp32 (2^23 + 128 + q, less 2^23 + 128, times d) and are packed
//   to bf16 pairs, rounded once.
// Each pair is an A register of mma.sync m16n8k16: a chunk's 4-byte word j gives two k-steps (its
// low nibbles, then its high ones), each of 16 weights a row over the four lanes t. The k order
// inside a step is the chunk's own (which weights a lane's registers hold), so x, the B operand,
// is read at the same positions: lane (g, t) loads token g's four values for the step from x
// (8 bytes; above 8 rows token g + 8's too, for a second product) and the rows past M read as
// zeros. fp32 accumulators; the 8 warps' sums meet in
// shared memory and warp 0 writes the 16 x M outputs (+ bias, + out when accumulating).
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "core/cuda/check.h"
#include "kernels/cuda/attention/tiles.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm/qlinear.h"
#include "kernels/quant_layout.h"

namespace llmk::cuda {

namespace {

constexpr int kQWarps = 8;
constexpr int kQThreads = kQWarps * kWarp;
constexpr int kStages = 4;  // slots of a warp's ring: groups in flight while one is computed

__device__ __forceinline__ uint32_t word(const uint4& v, int j) {
  return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

__device__ __forceinline__ float half_at(const uint8_t* p) {
  return __half2float(__ushort_as_half(*reinterpret_cast<const unsigned short*>(p)));
}

__device__ __forceinline__ uint32_t bf2(__nv_bfloat162 v) {
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ __nv_bfloat162 as_bf2(uint32_t v) {
  return *reinterpret_cast<const __nv_bfloat162*>(&v);
}

// The scale and minimum of one run of weights, bf16 pairs: w = q * s + m.
struct Affine {
  __nv_bfloat162 s, m;
};
__device__ __forceinline__ Affine affine(float s, float m) {
  return {__floats2bfloat162_rn(s, s), __floats2bfloat162_rn(m, m)};
}

// (a & b) | c in one instruction (the compiler splits it when b and c are both constants).
__device__ __forceinline__ uint32_t and_or(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// 128 + the 4-bit values in bits 0-3 and 16-19 of `spread` (plus `high`, bits 4 and 5 of each
// half), then the affine map: two weights.
__device__ __forceinline__ uint32_t nibble_pair(uint32_t spread, uint32_t high, const Affine& f) {
  const uint32_t v = and_or(spread, 0x000F000Fu, high | 0x43004300u);
  const __nv_bfloat162 q = __hsub2(as_bf2(v), __floats2bfloat162_rn(128.0f, 128.0f));
  return bf2(__hfma2(q, f.s, f.m));
}

// A chunk of a 4-bit-style type: 16 bytes of values, byte k's low nibble weight lo0 + k and its
// high nibble hi0 + k (positions in the row), per-run affine maps lo and hi, and the high bits
// hb(j, half, hi) to or into the pair of word j (half 0: bytes 4j, 4j+1; 1: 4j+2, 4j+3).
// a[2j] = low nibbles of word j, a[2j+1] = its high nibbles; each [0] (bytes 4j, 4j+1) and [1]
// (4j+2, 4j+3).
template <class HighBits>
__device__ __forceinline__ void decode_nibbles(const uint4& q, const Affine& lo, const Affine& hi,
                                               HighBits hb, uint32_t (&a)[8][2]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t w = word(q, j), h = w >> 4;  // h: the high nibbles where the low ones were
    a[2 * j][0] = nibble_pair(__byte_perm(w, 0, 0x4140), hb(j, 0, false), lo);
    a[2 * j][1] = nibble_pair(__byte_perm(w, 0, 0x4342), hb(j, 1, false), lo);
    a[2 * j + 1][0] = nibble_pair(__byte_perm(h, 0, 0x4140), hb(j, 0, true), hi);
    a[2 * j + 1][1] = nibble_pair(__byte_perm(h, 0, 0x4342), hb(j, 1, true), hi);
  }
}

struct NoHigh {
  __device__ __forceinline__ uint32_t operator()(int, int, bool) const { return 0; }
};

// Per type: Raw (one row's loads for a chunk), load, decode (to a[kSteps][2]) and the row
// positions of each step's four weights (pos, pos + 1 in [0]; pos + 2, pos + 3 in [1]).
template <DType T>
struct Dec;

// Legacy 4/5-bit blocks of 32: chunk c = block c; low nibbles weights 32c + k, high 32c + 16 + k.
struct Legacy32 {
  static constexpr int kSteps = 8;
  __device__ static void positions(int c, int (&pos)[kSteps]) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      pos[2 * j] = 32 * c + 4 * j;
      pos[2 * j + 1] = 32 * c + 16 + 4 * j;
    }
  }
  __device__ static const uint8_t* q_at(const uint8_t* qrow, int c) { return qrow + 16 * c; }
};

template <>
struct Dec<DType::Q4_0> : Legacy32 {
  struct Raw {
    uint4 q;
    float d;
  };
  __device__ static Raw load(const uint8_t* qrow, const uint8_t* mrow, int c) {
    return {load_stream(q_at(qrow, c)), half_at(mrow + 2 * c)};
  }
  __device__ static void decode(const Raw& r, uint32_t (&a)[kSteps][2]) {
    const Affine f = affine(r.d, -8.0f * r.d);
    decode_nibbles(r.q, f, f, NoHigh{}, a);
  }
};

template <>
struct Dec<DType::Q4_1> : Legacy32 {
  struct Raw {
    uint4 q;
    float d, m;
  };
  __device__ static Raw load(const uint8_t* qrow, const uint8_t* mrow, int c) {
    return {load_stream(q_at(qrow, c)), half_at(mrow + 4 * c), half_at(mrow + 4 * c + 2)};
  }
  __device__ static void decode(const Raw& r, uint32_t (&a)[kSteps][2]) {
    const Affine f = affine(r.d, r.m);
    decode_nibbles(r.q, f, f, NoHigh{}, a);
  }
};

template <>
struct Dec<DType::Q5_0> : Legacy32 {
  struct Raw {
    uint4 q;
    float d;
    uint32_t qh;  // bit k: the fifth bit of weight k
  };
  __device__ static Raw load(const uint8_t* qrow, const uint8_t* mrow, int c) {
    const auto* m = reinterpret_cast<const unsigned short*>(mrow + 6 * c);
    return {load_stream(q_at(qrow, c)), half_at(mrow + 6 * c),
            static_cast<uint32_t>(m[1]) | static_cast<uint32_t>(m[2]) << 16};
  }
  __device__ static void decode(const Raw& r, uint32_t (&a)[kSteps][2]) {
    const Affine f = affine(r.d, -16.0f * r.d);
    // Weights (4j + 2 half, + 1), or 16 more for the high nibbles: their bits to 4 and 20.
    const auto hb = [&](int j, int half, bool hi) {
      const uint32_t b = r.qh >> (4 * j + 2 * half + (hi ? 16 : 0));
      return ((b & 1u) << 4) | ((b & 2u) << 19);
    };
    decode_nibbles(r.q, f, f, hb, a);
  }
};

template <>
struct Dec<DType::Q4_K> {
  static constexpr int kSteps = 8;
  struct Raw {
    uint4 q, meta;  // meta: d, dmin; scales[12]
  };
  // Chunk c: super-block c / 8, its 64-weight part p = (c % 8) / 2, half h = c % 2: low nibbles
  // weights 256 sb + 64 p + 16 h + k (sub-block 2p), high ones 32 further (sub-block 2p + 1).
  __device__ static void positions(int c, int (&pos)[kSteps]) {
    const int base = 256 * (c / 8) + 64 * ((c % 8) / 2) + 16 * (c % 2);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      pos[2 * j] = base + 4 * j;
      pos[2 * j + 1] = base + 32 + 4 * j;
    }
  }
  __device__ static Raw load(const uint8_t* qrow, const uint8_t* mrow, int c) {
    return {load_stream(qrow + 16 * c), __ldg(reinterpret_cast<const uint4*>(mrow + 16 * (c / 8)))};
  }
  // Sub-block j's 6-bit scale and minimum (ggml's packing of scales[12]), without branches: the
  // lanes of a warp hold different j.
  __device__ static void scale_min(const Raw& r, int j, float& sc, float& m) {
    const int sh = 8 * (j % 4);
    const uint32_t A = (r.meta.y >> sh) & 0xFF, B = (r.meta.z >> sh) & 0xFF,
                   C = (r.meta.w >> sh) & 0xFF;
    const bool lo = j < 4;
    const uint32_t s = lo ? A & 63 : (C & 0xF) | ((A >> 6) << 4);
    const uint32_t n = lo ? B & 63 : (C >> 4) | ((B >> 6) << 4);
    sc = __uint_as_float(0x4B000000u | s) - 8388608.0f;  // exact: s, n < 64
    m = __uint_as_float(0x4B000000u | n) - 8388608.0f;
  }
  __device__ static void decode(const Raw& r, int c, uint32_t (&a)[kSteps][2]) {
    const float d = __half2float(__ushort_as_half(static_cast<unsigned short>(r.meta.x))),
                dmin = __half2float(__ushort_as_half(static_cast<unsigned short>(r.meta.x >> 16)));
    const int p = (c % 8) / 2;
    float sc0, m0, sc1, m1;
    scale_min(r, 2 * p, sc0, m0);
    scale_min(r, 2 * p + 1, sc1, m1);
    decode_nibbles(r.q, affine(d * sc0, -dmin * m0), affine(d * sc1, -dmin * m1), NoHigh{}, a);
  }
};

template <>
struct Dec<DType::Q6_K> {
  static constexpr int kSteps = 8;
  struct Raw {
    uint4 ql, qh;
    float s_lo, s_hi;
  };
  // Chunk c: super-block c / 8, half n = (c % 8) / 4, a = c % 4: ql bytes 64 n + 16 a (low
  // nibbles weights 256 sb + 128 n + 16 a + k, high ones 64 further), qh bytes 32 n + 16 (a % 2)
  // (bits 2 (a / 2) and 4 + 2 (a / 2) of byte k: the top two bits of those weights); scales
  // 8 n + a and 8 n + a + 4.
  __device__ static void positions(int c, int (&pos)[kSteps]) {
    const int base = 256 * (c / 8) + 128 * ((c % 8) / 4) + 16 * (c % 4);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      pos[2 * j] = base + 4 * j;
      pos[2 * j + 1] = base + 64 + 4 * j;
    }
  }
  __device__ static Raw load(const uint8_t* qrow, const uint8_t* mrow, int c) {
    const int sb = c / 8, n = (c % 8) / 4, a = c % 4;
    const uint8_t* q = qrow + 192 * sb;
    const uint8_t* m = mrow + 18 * sb;
    const float d = half_at(m + 16);
    const auto* sc = reinterpret_cast<const int8_t*>(m);
    return {load_stream(q + 64 * n + 16 * a), load_stream(q + 128 + 32 * n + 16 * (a % 2)),
            d * static_cast<float>(sc[8 * n + a]), d * static_cast<float>(sc[8 * n + a + 4])};
  }
  __device__ static void decode(const Raw& r, int c, uint32_t (&a)[kSteps][2]) {
    const int sh = 2 * ((c % 4) / 2);  // the low nibbles' bits in qh; the high ones' 4 above
    const auto hb = [&](int j, int half, bool hi) {
      const uint32_t s = __byte_perm(word(r.qh, j), 0, half ? 0x4342 : 0x4140);
      return hi ? (s >> sh) & 0x00300030u : (s << (4 - sh)) & 0x00300030u;
    };
    decode_nibbles(r.ql, affine(r.s_lo, -32.0f * r.s_lo), affine(r.s_hi, -32.0f * r.s_hi), hb, a);
  }
};

template <>
struct Dec<DType::Q8_0> {
  static constexpr int kSteps = 4;
  struct Raw {
    uint4 q;
    float d;
  };
  // Chunk c: half c % 2 of block c / 2: weights 16 c + k.
  __device__ static void positions(int c, int (&pos)[kSteps]) {
#pragma unroll
    for (int j = 0; j < 4; ++j) pos[j] = 16 * c + 4 * j;
  }
  __device__ static Raw load(const uint8_t* qrow, const uint8_t* mrow, int c) {
    return {load_stream(qrow + 16 * c), half_at(mrow + 2 * (c / 2))};
  }
  __device__ static void decode(const Raw& r, int, uint32_t (&a)[kSteps][2]) {
    constexpr float kBias = 8388736.0f;  // 2^23 + 128
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t w = word(r.q, j) ^ 0x80808080u;  // signed bytes to q + 128
      float f[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        f[e] = (__uint_as_float(0x4B000000u | __byte_perm(w, 0, 0x4440 + e)) - kBias) * r.d;
      }
      a[j][0] = bf2(__floats2bfloat162_rn(f[0], f[1]));
      a[j][1] = bf2(__floats2bfloat162_rn(f[2], f[3]));
    }
  }
};

// ---- qgemv's staging: per group of 4 chunks of 16 rows, each lane's values (qvecs 16-byte
// vectors a row) and each row's meta span, copied by cp.async into the warp's ring ----

// The values of chunk c as 16-byte vectors from a row's values: Q6_K's low nibbles, then high
// bits; the others' one vector.
template <DType T>
__device__ __forceinline__ const uint8_t* qvec_at(const uint8_t* qrow, int c, int v) {
  if constexpr (T == DType::Q6_K) {
    const int sb = c / 8, n = (c % 8) / 4, a = c % 4;
    return qrow + 192 * sb + (v == 0 ? 64 * n + 16 * a : 128 + 32 * n + 16 * (a % 2));
  } else {
    return qrow + 16 * c;
  }
}
template <DType T>
inline constexpr int kQVecs = T == DType::Q6_K ? 2 : 1;

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
    case DType::Q8_0:
      return 2 * (c0 / 2);
    case DType::Q4_K:
      return 16 * (c0 / 8);
    default:  // Q6_K
      return 18 * (c0 / 8);
  }
}
constexpr int kMetaWords = 8;  // 4-byte words staged a row: any span (at most 24 bytes, 2-aligned)

__device__ __forceinline__ uint32_t u16_at(const uint8_t* p) {
  return *reinterpret_cast<const unsigned short*>(p);
}
__device__ __forceinline__ float half_bits(uint32_t h) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(h)));
}

// Raw of chunk c (group start c0) from its staged values q and its row's staged meta m (m[0] is
// the span's first byte).
template <DType T>
__device__ __forceinline__ typename Dec<T>::Raw staged_raw(const uint4* q, const uint8_t* m, int c,
                                                           int c0) {
  const int j = c - c0;
  if constexpr (T == DType::Q4_0) {
    return {q[0], half_bits(u16_at(m + 2 * j))};
  } else if constexpr (T == DType::Q4_1) {
    return {q[0], half_bits(u16_at(m + 4 * j)), half_bits(u16_at(m + 4 * j + 2))};
  } else if constexpr (T == DType::Q5_0) {
    return {q[0], half_bits(u16_at(m + 6 * j)),
            u16_at(m + 6 * j + 2) | u16_at(m + 6 * j + 4) << 16};
  } else if constexpr (T == DType::Q8_0) {
    return {q[0], half_bits(u16_at(m + 2 * (c / 2 - c0 / 2)))};
  } else if constexpr (T == DType::Q4_K) {
    // Rows of whole 16-byte metas from a 16-aligned region: the span is 16-aligned, m too.
    return {q[0], *reinterpret_cast<const uint4*>(m)};
  } else {  // Q6_K: scales[16], d
    const int n = (c % 8) / 4, a = c % 4;
    const float d = half_bits(u16_at(m + 16));
    const auto* sc = reinterpret_cast<const int8_t*>(m);
    return {q[0], q[1], d * static_cast<float>(sc[8 * n + a]),
            d * static_cast<float>(sc[8 * n + a + 4])};
  }
}

// Decode for the types whose decode takes no chunk index.
template <DType T, class R, int S>
__device__ __forceinline__ void decode_chunk(const R& r, int c, uint32_t (&a)[S][2]) {
  if constexpr (T == DType::Q4_K || T == DType::Q6_K || T == DType::Q8_0) {
    Dec<T>::decode(r, c, a);
  } else {
    Dec<T>::decode(r, a);
  }
}

struct QKernelArgs {
  void* out;
  int64_t ldo;
  const uint16_t* x;
  int64_t ldx;
  const uint8_t* wq;   // the values region
  const uint8_t* wm;   // the meta region
  int64_t qrow, mrow;  // bytes a row in each
  const void* bias;
  int M, N, chunks;  // chunks a row
  bool accumulate;
  bool release_first;
};

// kTiles: tokens 8 at a time (M <= 8 x kTiles), one mma each a step. Each warp streams its
// groups through a ring of kStages slots in shared memory (cp.async, one commit group a slot):
// while it computes group k, groups k + 1 .. k + kStages - 1 are in flight.
template <DType T>
struct Ring {
  static constexpr int kQBytes = 2 * kQVecs<T> * kWarp * 16;  // two rows' vectors, every lane
  static constexpr int kMetaBytes = 16 * kMetaWords * 4;      // 16 rows' spans
  static constexpr int kSlotBytes = kQBytes + kMetaBytes;
  static constexpr size_t kSmemBytes = static_cast<size_t>(kQWarps) * kStages * kSlotBytes;
};

// attn::cp_async_wait without a memory clobber would let the compiler read the slot early.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// 4 bytes global -> shared of which the first n (0..4) are read, the rest zero-filled.
__device__ __forceinline__ void cp_async_4_n(uint32_t dst, const void* src, int n) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}

// What advances from one of a warp's groups to its next (32 chunks on): bytes of a row's values
// and meta, weights of x.
template <DType T>
inline constexpr int kQStep = T == DType::Q6_K ? 4 * 192 : 32 * 16;
template <DType T>
inline constexpr int kPStep = T == DType::Q8_0 ? 32 * 16 : 32 * 32;

template <DType T, typename TOut, typename TBias, int kTiles>
__global__ void __launch_bounds__(kQThreads, 2) qgemv_kernel(const QKernelArgs a) {
  using D = Dec<T>;
  using R = Ring<T>;
  constexpr int kSteps = D::kSteps, kV = kQVecs<T>;
  extern __shared__ __align__(16) unsigned char ring_raw[];
  __shared__ float red[kQWarps - 1][kWarp][4 * kTiles];
  const int warp = static_cast<int>(threadIdx.x) / kWarp,
            lane = static_cast<int>(threadIdx.x) % kWarp;
  const int g = lane / 4, t = lane % 4;
  const int row0 = static_cast<int>(blockIdx.x) * 16 + g, row1 = row0 + 8;
  const int64_t rr[2] = {min(row0, a.N - 1), min(row1, a.N - 1)};  // past N: re-read, unused
  const int groups = (a.chunks + 3) / 4;
  const int mine = warp < groups ? (groups - warp + kQWarps - 1) / kQWarps : 0;
  // The warp's first group (chunks c0 .. c0 + 3; this lane's c), and what every later one adds:
  // the chunk's place in its super-block, which the decode reads, is the same in all of them.
  const int c0 = 4 * warp, c = c0 + t;
  const uint8_t* meta_end = a.wm + static_cast<int64_t>(a.N) * a.mrow;
  const uint8_t* qsrc[2][kV];
  const uint8_t* msrc[2];  // the row's meta span, aligned down to 4 bytes
  int moff[2];             // the span's first byte in the staged words
#pragma unroll
  for (int r = 0; r < 2; ++r) {
#pragma unroll
    for (int v = 0; v < kV; ++v) qsrc[r][v] = qvec_at<T>(a.wq + rr[r] * a.qrow, c, v);
    const uint8_t* span = a.wm + rr[r] * a.mrow + meta_start<T>(c0);
    moff[r] = static_cast<int>(reinterpret_cast<uintptr_t>(span) & 3);
    msrc[r] = span - moff[r];
  }
  constexpr int kMStep = meta_start<T>(32);
  int pos[kSteps];
  D::positions(c, pos);
  const uint16_t* xg[kTiles];  // tokens g and g + 8, at this lane's first positions
  bool has_token[kTiles];
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
    xg[j] = a.x + static_cast<int64_t>(8 * j + g) * a.ldx + pos[0];
    has_token[j] = 8 * j + g < a.M;
  }
  unsigned char* ring = ring_raw + static_cast<size_t>(warp) * kStages * R::kSlotBytes;
  const uint32_t ring_s = smem_addr(ring);

  // The next group to issue: its values and meta words (advanced a group at each issue), the
  // bytes of the tensor left from this lane's first meta word on (the last row's span may reach
  // past the tensor's end), its first chunk.
  const uint8_t* qn[2][kV];
  const uint8_t* mn[2];
  int mleft[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
#pragma unroll
    for (int v = 0; v < kV; ++v) qn[r][v] = qsrc[r][v];
    mn[r] = msrc[r] + 8 * t;
    const int64_t left = meta_end - mn[r];
    mleft[r] = left < (int64_t{1} << 30) ? static_cast<int>(left) : 1 << 30;
  }
  int kn = 0;
  // Slot layout: values [row r][vector v][lane] x 16 bytes, then meta [row 0..15][8 words]; rows
  // g and g + 8 of the meta: lane t copies words 2t and 2t + 1.
  const uint32_t lane_q = ring_s + lane * 16;
  const uint32_t lane_m = ring_s + R::kQBytes + (g * kMetaWords + 2 * t) * 4;
  const uint32_t row_m = ring_s + R::kQBytes + g * kMetaWords * 4;
  const auto issue = [&] {
    if (kn < mine) {
      const bool live = c + 32 * kn < a.chunks;
      const uint32_t slot = (kn % kStages) * R::kSlotBytes;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
#pragma unroll
        for (int v = 0; v < kV; ++v) {
          attn::cp_async_16_at(lane_q + slot + (r * kV + v) * kWarp * 16, qn[r][v], live);
          qn[r][v] += kQStep<T>;
        }
        if constexpr (T == DType::Q4_K) {
          // A super-block's 16 aligned bytes, inside the tensor: one copy a row (lanes t = 0, 1).
          if (t == r) {
            attn::cp_async_16_at(row_m + slot + r * 8 * kMetaWords * 4, mn[r] - 8 * t, true);
          }
        } else {
#pragma unroll
          for (int w = 0; w < 2; ++w) {
            const int left = mleft[r] - 4 * w;
            cp_async_4_n(lane_m + slot + (r * 8 * kMetaWords + w) * 4,
                         left > 0 ? mn[r] + 4 * w : msrc[r], left >= 4 ? 4 : max(left, 0));
          }
        }
        mn[r] += kMStep;
        mleft[r] -= kMStep;
      }
    }
    attn::cp_async_commit();  // an empty group past the warp's last: the waits count the same
    ++kn;
  };

  float acc[kTiles][4] = {};
#pragma unroll
  for (int k = 0; k < kStages - 1; ++k) issue();
  grid_dependency_wait(a.release_first);  // the weights are in flight; x is the previous kernel's
  const unsigned char* lane_slot_q = ring + lane * 16;
  const unsigned char* slot_meta[2] = {ring + R::kQBytes + g * kMetaWords * 4 + moff[0],
                                       ring + R::kQBytes + (8 + g) * kMetaWords * 4 + moff[1]};
  for (int k = 0; k < mine; ++k) {
    __syncwarp();  // every lane is done with slot (k - 1) % kStages, which this issue refills
    issue();
    cp_async_wait<kStages - 1>();
    __syncwarp();  // the meta words the row's other lanes copied
    const int slot = (k % kStages) * R::kSlotBytes;
    const bool live = c + 32 * k < a.chunks;
    typename D::Raw raw[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const uint4* q = reinterpret_cast<const uint4*>(lane_slot_q + slot) + r * kV * kWarp;
      const uint4 qv[2] = {q[0], kV > 1 ? q[kWarp] : q[0]};
      raw[r] = staged_raw<T>(qv, slot_meta[r] + slot, c, c0);
    }
    uint32_t w0[kSteps][2], w1[kSteps][2];
    decode_chunk<T>(raw[0], c, w0);
    decode_chunk<T>(raw[1], c, w1);
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      const uint32_t A[4] = {w0[s][0], w1[s][0], w0[s][1], w1[s][1]};
#pragma unroll
      for (int j = 0; j < kTiles; ++j) {
        uint2 b = make_uint2(0, 0);
        if (live && has_token[j])
          b = __ldg(reinterpret_cast<const uint2*>(xg[j] + (pos[s] - pos[0])));
        attn::mma_bf16_16816(acc[j], A, b.x, b.y);
      }
    }
#pragma unroll
    for (int j = 0; j < kTiles; ++j) xg[j] += kPStep<T>;
  }
  cp_async_wait<0>();
  if (warp > 0) {
#pragma unroll
    for (int j = 0; j < kTiles; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) red[warp - 1][lane][4 * j + i] = acc[j][i];
  }
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int w = 0; w < kQWarps - 1; ++w) {
#pragma unroll
    for (int j = 0; j < kTiles; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[j][i] += red[w][lane][4 * j + i];
  }
  // acc[j]: (row0, token 8 j + 2t), (row0, + 1), (row1, 8 j + 2t), (row1, + 1).
  TOut* out = static_cast<TOut*>(a.out);
  const TBias* bias = static_cast<const TBias*>(a.bias);
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = i < 2 ? row0 : row1, tok = 8 * j + 2 * t + (i % 2);
      if (row >= a.N || tok >= a.M) continue;
      float v = acc[j][i] + (bias ? to_float(bias[row]) : 0.0f);
      TOut* dst = out + static_cast<int64_t>(tok) * a.ldo + row;
      if (a.accumulate) v += to_float(*dst);
      *dst = from_float<TOut>(v);
    }
  }
}

// dst row r = w's row n0 + r, or (ids set) row ids[r * ids_stride] (zeros for an id outside
// [0, N)): one thread a chunk.
template <DType T>
__global__ void qdequant_kernel(__nv_bfloat16* dst, int64_t ld, const uint8_t* wq,
                                const uint8_t* wm, int64_t qrow, int64_t mrow, int64_t N,
                                int64_t n0, int64_t rows, int chunks, const int32_t* ids,
                                int64_t ids_stride) {
  using D = Dec<T>;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * chunks) return;
  const int64_t r = i / chunks;
  const int c = static_cast<int>(i % chunks);
  const int64_t src = ids != nullptr ? ids[r * ids_stride] : n0 + r;
  int pos[D::kSteps];
  D::positions(c, pos);
  __nv_bfloat16* row = dst + r * ld;
  uint32_t w[D::kSteps][2] = {};
  if (src >= 0 && src < N) {
    const typename D::Raw raw = D::load(wq + src * qrow, wm + src * mrow, c);
    decode_chunk<T>(raw, c, w);
  }
  // 16-byte stores: steps s and s + kPair hold 8 weights in a row (pos[s + kPair] = pos[s] + 4):
  // the nibble types' low runs in even steps and high runs in odd ones; Q8_0's steps in order.
  constexpr int kPair = D::kSteps == 8 ? 2 : 1;
#pragma unroll
  for (int s = 0; s < D::kSteps; ++s) {
    if ((s / kPair) % 2 != 0) continue;
    *reinterpret_cast<uint4*>(row + pos[s]) =
        make_uint4(w[s][0], w[s][1], w[s + kPair][0], w[s + kPair][1]);
  }
}

// Chunks a row: 32 weights each (16 bytes of nibbles; Q6_K's 16 bytes of low nibbles with their
// 8 bytes of high bits), 16 of Q8_0.
int chunks_per_row(DType t, int64_t K) {
  return static_cast<int>(K / (t == DType::Q8_0 ? 16 : 32));
}

QKernelArgs kernel_args(const QLinearArgs& a) {
  const qlayout::Layout l = qlayout::layout(a.wtype);
  const int64_t nb = a.K / l.block_elems;
  QKernelArgs k{};
  k.out = a.out;
  k.ldo = a.ldo;
  k.x = static_cast<const uint16_t*>(a.x);
  k.ldx = a.ldx;
  k.qrow = nb * l.q_bytes;
  k.mrow = nb * l.meta_bytes();
  k.wq = static_cast<const uint8_t*>(a.w);
  k.wm = k.wq + a.N * k.qrow;
  k.bias = a.bias;
  k.M = static_cast<int>(a.M);
  k.N = static_cast<int>(a.N);
  k.chunks = chunks_per_row(a.wtype, a.K);
  k.accumulate = a.accumulate;
  k.release_first = release_dependents_first();
  return k;
}

template <DType T, typename TOut, typename TBias, int kTiles>
void launch_tiles(const QLinearArgs& a) {
  auto* kernel = qgemv_kernel<T, TOut, TBias, kTiles>;
  constexpr size_t kSmem = Ring<T>::kSmemBytes;
  static const bool raised = [&] {
    LLMK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(kSmem)));
    return true;
  }();
  (void)raised;
  launch_dependent(kernel, dim3(static_cast<unsigned>(ceil_div(a.N, 16))), dim3(kQThreads), kSmem,
                   kernel_args(a));
}

template <DType T, typename TOut, typename TBias>
void launch_q(const QLinearArgs& a) {
  if (a.M <= 8) {
    launch_tiles<T, TOut, TBias, 1>(a);
  } else {
    launch_tiles<T, TOut, TBias, 2>(a);
  }
  check_launch("cuda::qgemv");
}

template <DType T, typename TOut>
void launch_q_bias(const QLinearArgs& a) {
  if (a.bias != nullptr && a.bias_dtype == DType::F32) {
    launch_q<T, TOut, float>(a);
  } else {
    launch_q<T, TOut, __nv_bfloat16>(a);
  }
}

template <DType T>
void launch_q_out(const QLinearArgs& a) {
  if (a.out_dtype == DType::F32) {
    launch_q_bias<T, float>(a);
  } else {
    launch_q_bias<T, __nv_bfloat16>(a);
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
    case DType::Q8_0:
      return f.template operator()<DType::Q8_0>();
    case DType::Q4_K:
      return f.template operator()<DType::Q4_K>();
    case DType::Q6_K:
      return f.template operator()<DType::Q6_K>();
    default:
      return;
  }
}

bool aligned(const void* p, uintptr_t n) { return reinterpret_cast<uintptr_t>(p) % n == 0; }

}  // namespace

bool qgemv_applies(const QLinearArgs& a) {
  const qlayout::Layout l = qlayout::layout(a.wtype);
  return l.block_elems > 0 && a.K > 0 && a.K % l.block_elems == 0 && a.M >= 1 &&
         a.M <= kQGemvMaxRows && a.N >= 1 && a.N < (int64_t{1} << 31) &&
         (a.out_dtype == DType::BF16 || a.out_dtype == DType::F32) &&
         (a.bias == nullptr || a.bias_dtype == DType::BF16 || a.bias_dtype == DType::F32) &&
         aligned(a.x, 16) && (a.M == 1 || a.ldx % 8 == 0) && aligned(a.w, 16);
}

bool qgemv(const QLinearArgs& a) {
  if (!qgemv_applies(a)) return false;
  for_type(a.wtype, [&]<DType T>() { launch_q_out<T>(a); });
  return true;
}

namespace {

void launch_dequant(void* dst, int64_t ld, const void* w, DType wtype, int64_t N, int64_t K,
                    int64_t n0, int64_t rows, const int32_t* ids, int64_t ids_stride) {
  if (rows <= 0 || K <= 0) return;
  const qlayout::Layout l = qlayout::layout(wtype);
  const int64_t nb = K / l.block_elems;
  const int64_t qrow = nb * l.q_bytes, mrow = nb * l.meta_bytes();
  const auto* wq = static_cast<const uint8_t*>(w);
  const uint8_t* wm = wq + N * qrow;
  const int chunks = chunks_per_row(wtype, K);
  const int64_t n = rows * chunks;
  for_type(wtype, [&]<DType T>() {
    qdequant_kernel<T>
        <<<static_cast<unsigned>(ceil_div(n, int64_t{256})), 256, 0, current_stream()>>>(
            static_cast<__nv_bfloat16*>(dst), ld, wq, wm, qrow, mrow, N, n0, rows, chunks, ids,
            ids_stride);
  });
  check_launch("cuda::qdequant");
}

}  // namespace

void qdequant(void* dst, DType dtype, int64_t ld, const void* w, DType wtype, int64_t N, int64_t K,
              int64_t n0, int64_t rows) {
  (void)dtype;  // BF16 (ops::linear checks)
  launch_dequant(dst, ld, w, wtype, N, K, n0, rows, nullptr, 0);
}

void qembedding(void* out, int64_t ldo, const void* table, DType wtype, int64_t V, int64_t D,
                const int32_t* ids, int64_t ids_stride, int64_t T) {
  launch_dequant(out, ldo, table, wtype, V, D, 0, T, ids, ids_stride);
}

}  // namespace llmk::cuda
