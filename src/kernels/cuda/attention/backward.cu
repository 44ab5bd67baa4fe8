// The backward of flash attention (backward.h): FA2's algorithm in three builds, mma.sync
// m16n8k16 (bwd_main_kernel, any sm_80+ GPU), warpgroup MMA (bwd_wgmma_kernel, sm_90a) and, at
// head dim 128 on sm_90a, two warpgroups on 128 keys (bwd_h2_kernel; each described there), which
// share the order and the element-wise steps.
//
// Main kernel: one block of 4 warps per (64-key tile, KV head, sequence). Warp w owns keys
// [16 w, 16 w + 16) of the tile: it computes S^T = K Q^T for its keys (keys are the M dimension,
// so P^T and dS^T sit in registers as the A operands of dV += P^T dO and dK += dS^T Q) and keeps
// its rows of dK and dV in registers across every query tile and every query head of the group.
// dQ = dS K needs a sum over the tile's keys, which four warps hold: dS^T goes to shared memory
// and each warp forms 16 query rows of dQ from it, added to an fp32 accumulator with atomics.
//
// Scores in the log2 domain: P = exp2(s log2(e) - lse2), lse2 = lse log2(e) from the row pass
// (+inf for a row that saw no key, so its P is 0). With a softcap the cap's derivative 1 -
// (s / cap)^2 is formed from P itself: s = (log2 P + lse2) ln 2 (P > 0; where P is 0, so is dS).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "core/cuda/check.h"
#include "core/cuda/device.h"
#include "core/cuda/stream.h"
#include "kernels/cuda/attention/backward.h"
#include "kernels/cuda/attention/launch.h"
#include "kernels/cuda/attention/prefill_wgmma.cuh"
#include "kernels/cuda/attention/tiles.cuh"

namespace llmk::cuda {

namespace attn {
namespace {

constexpr int kBwdWarps = 4;
constexpr int kBwdThreads = kBwdWarps * kWarp;
constexpr int kBwdBN = 16 * kBwdWarps;  // keys per block: 16 per warp
constexpr int kBwdBM = 16 * kBwdWarps;  // queries per step: 16 per warp in dQ = dS K

// Padded query rows: sequence b's queries start at row pad_row0(b) of a space of tp =
// padded_rows(T, B) rows, so that each 64-query tile of each sequence has a 64-row block of its
// own (the Hopper kernel adds whole blocks; the rows past a sequence's end are padding).
constexpr int kPadRows = 64;
__host__ __device__ inline int64_t padded_rows(int64_t T, int64_t B) {
  return (T + kPadRows - 1) / kPadRows * kPadRows + kPadRows * B;
}
__device__ __forceinline__ int64_t pad_row0(const int32_t* cu_q, int b) {
  return (static_cast<int64_t>(cu_q[b]) + kPadRows * b) / kPadRows * kPadRows;
}
// The last b in [0, B) with start(b) <= x, for a start() that grows with b (start(0) <= x).
template <class F>
__device__ __forceinline__ int last_seq_at(int B, int64_t x, F start) {
  int lo = 0, hi = B;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (start(mid) <= x) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}
// The padded row of query row t: its sequence is the last b with cu_q[b] <= t.
__device__ __forceinline__ int64_t padded_row(const int32_t* cu_q, int B, int64_t t) {
  const int b = last_seq_at(B, t, [&](int m) { return static_cast<int64_t>(cu_q[m]); });
  return pad_row0(cu_q, b) + (t - cu_q[b]);
}

// The workspace, over padded rows: dQ's fp32 accumulator [Hq, tp, D] (a query tile of one head
// is one contiguous block, for the bulk reductions), then lse2 and delta, [Hq, tp] each (zeros
// in the padding rows), then the deterministic mode's turn counters, [Hq, tp / 64, 2] int32.
struct BwdWs {
  float* dq_acc;
  float* lse2;
  float* delta;
  int* turns;
  int64_t tp;
};
BwdWs bwd_ws(void* ws, int64_t T, int64_t Hq, int64_t D, int64_t B) {
  float* p = static_cast<float*>(ws);
  const int64_t tp = padded_rows(T, B);
  float* delta = p + tp * Hq * D + tp * Hq;
  return {p, p + tp * Hq * D, delta, reinterpret_cast<int*>(delta + tp * Hq), tp};
}
size_t turns_bytes(int64_t tp, int64_t Hq) {
  return static_cast<size_t>(tp / 64 * Hq * 2) * sizeof(int);
}

// The accumulator's float offset of (padded row pr of head h, column col), row-major [Hq, tp, D].
__device__ __forceinline__ int64_t dq_at(const BwdWs& ws, int D, int h, int64_t pr, int col) {
  return (static_cast<int64_t>(h) * ws.tp + pr) * D + col;
}
// The two-warpgroup kernel's accumulator keeps each 64-row query tile of a head (the 64 x D
// floats of its rows) in the order its threads hold dQ: `parts` column parts of `cols` columns
// (head dim 128: two halves, one per warpgroup; else one part of D), and in a part, thread t's
// (of 128) four floats of 8-column block j at (j * 128 + t) * 4: element (r, c) of the part is
// thread (r / 16) * 32 + (r % 8) * 4 + (c % 8) / 2, float ((r % 16) / 8) * 2 + c % 2 of block
// c / 8 (the wgmma accumulator layout). A warp's 16-byte reductions then cover 512 contiguous
// bytes.
__device__ __forceinline__ float* dq_tile(const BwdWs& ws, int D, int h, int64_t pr0) {
  return ws.dq_acc + (static_cast<int64_t>(h) * ws.tp + pr0) * D;
}

template <class T16>
__device__ __forceinline__ float to_f32(T16 x) {
  if constexpr (std::is_same_v<T16, __half>) {
    return __half2float(x);
  } else {
    return __bfloat162float(x);
  }
}

template <class T16>
__device__ __forceinline__ T16 from_f32(float x) {
  if constexpr (std::is_same_v<T16, __half>) {
    return __float2half_rn(x);
  } else {
    return __float2bfloat16_rn(x);
  }
}

// 8 consecutive 16-bit values (16-byte aligned) <-> floats, in one 16-byte access.
template <class T16>
__device__ __forceinline__ void load8(const T16* p, float (&f)[8]) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const T16* h = reinterpret_cast<const T16*>(&raw);
#pragma unroll
  for (int e = 0; e < 8; ++e) f[e] = to_f32(h[e]);
}
template <class T16>
__device__ __forceinline__ void store8(T16* p, const float (&f)[8]) {
  uint4 raw;
  T16* h = reinterpret_cast<T16*>(&raw);
#pragma unroll
  for (int e = 0; e < 8; ++e) h[e] = from_f32<T16>(f[e]);
  *reinterpret_cast<uint4*>(p) = raw;
}

// 16 lanes per (query row, head), 8 elements (16 bytes) each (head dims up to 128): delta = dO .
// O - dlse, lse2, and dQ's accumulator row zeroed. Over the query rows (kPadded false: the
// row-major accumulator of the kernels that add only live rows), or over every padded row
// (kPadded: the two-warpgroup kernel adds whole 64-row tiles in its own order, so a tile's
// padding rows are zeroed too, and their lse2 and delta are zeros).
constexpr int kRowLanes = 16;
template <class T16, bool kPadded>
__global__ void bwd_rows_kernel(const AttentionBwdArgs a, BwdWs ws) {
  const int64_t item = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kRowLanes;
  const int c = static_cast<int>(threadIdx.x % kRowLanes);
  // Whole half-warps: no exit before the shuffles.
  const int64_t rows = kPadded ? ws.tp : static_cast<int64_t>(a.T);
  const bool in = item < rows * a.Hq;
  const int h = in ? static_cast<int>(item % a.Hq) : 0;
  int64_t t = 0, pr = 0;
  bool live = in;
  if (in) {
    if constexpr (kPadded) {
      pr = item / a.Hq;
      const int b = last_seq_at(a.B, pr, [&](int m) { return pad_row0(a.cu_q, m); });
      const int64_t i = pr - pad_row0(a.cu_q, b);
      live = i < a.cu_q[b + 1] - a.cu_q[b];
      t = a.cu_q[b] + i;
    } else {
      t = item / a.Hq;
      pr = padded_row(a.cu_q, a.B, t);
    }
  }
  float dot = 0.0f;
  if (in && c * 8 < a.D) {
    if (live) {
      float o[8], d[8];
      load8(static_cast<const T16*>(a.out) + t * a.out_t + h * a.out_h + c * 8, o);
      load8(static_cast<const T16*>(a.dout) + t * a.dout_t + h * a.dout_h + c * 8, d);
#pragma unroll
      for (int e = 0; e < 8; ++e) dot += o[e] * d[e];
    }
    float4* acc = reinterpret_cast<float4*>(ws.dq_acc + dq_at(ws, a.D, h, pr, c * 8));
    acc[0] = acc[1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
#pragma unroll
  for (int o = kRowLanes / 2; o > 0; o /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, o);
  if (in && c == 0) {
    const int64_t at = static_cast<int64_t>(h) * ws.tp + pr;
    if (live) {
      const int64_t i = static_cast<int64_t>(h) * a.T + t;
      const float lse = a.lse[i];
      ws.lse2[at] = isinf(lse) ? INFINITY : lse * kLog2e;
      ws.delta[at] = dot - (a.dlse != nullptr ? a.dlse[i] : 0.0f);
    } else {
      ws.lse2[at] = 0.0f;
      ws.delta[at] = 0.0f;
    }
  }
}

// dq = the (row-major) accumulator rounded to 16 bits: one thread per 8 elements.
template <class T16>
__global__ void bwd_dq_kernel(const AttentionBwdArgs a, BwdWs ws) {
  const int per_row = a.D / 8;
  const int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (g >= static_cast<int64_t>(a.T) * a.Hq * per_row) return;
  const int64_t row = g / per_row;  // t * Hq + h
  const int c = static_cast<int>(g % per_row);
  const int64_t t = row / a.Hq;
  const int h = static_cast<int>(row % a.Hq);
  const float4* src = reinterpret_cast<const float4*>(
      ws.dq_acc + dq_at(ws, a.D, h, padded_row(a.cu_q, a.B, t), c * 8));
  const float4 x = src[0], y = src[1];
  const float v[8] = {x.x, x.y, x.z, x.w, y.x, y.y, y.z, y.w};
  store8(static_cast<T16*>(a.dq) + t * a.dq_t + h * a.dq_h + c * 8, v);
}

// dq from the two-warpgroup kernel's accumulator (dq_tile's order), times the scale its dS left
// out. One block of 256 threads per 64-row tile of a head: the tile's floats are read in order
// (each warp 512 contiguous bytes an instruction), put row-major into shared memory, and each warp
// then writes whole rows (a lane's four columns, 8 bytes; a row's 2 D bytes at once).
constexpr int kDqThreads = 256;
template <class T16, int kD>
__global__ void __launch_bounds__(kDqThreads)
    bwd_dq_tiles_kernel(const AttentionBwdArgs a, BwdWs ws, int cols) {
  constexpr int kPitch = kD + 8;  // floats a shared row: 64-bit stores of 8 rows, two wavefronts
  constexpr int kF4 = 64 * kD / 4;
  static_assert(kF4 % kDqThreads == 0 && kD % 4 == 0 && kD / 4 <= 32, "whole passes, a warp a row");
  __shared__ __align__(16) float sm[64 * kPitch];
  const int64_t tiles_per_head = ws.tp / 64;
  const int64_t tile = blockIdx.x;  // h * tiles_per_head + padded tile
  const int h = static_cast<int>(tile / tiles_per_head);
  const int64_t pr0 = (tile % tiles_per_head) * 64;
  // The sequence whose padded rows hold this tile.
  const int lo = last_seq_at(a.B, pr0, [&](int m) { return pad_row0(a.cu_q, m); });
  const int64_t i0 = pr0 - pad_row0(a.cu_q, lo);
  const int tq = a.cu_q[lo + 1] - a.cu_q[lo];
  if (i0 >= tq) return;  // padding
  const float4* src = reinterpret_cast<const float4*>(dq_tile(ws, kD, h, pr0));
  float4 f[kF4 / kDqThreads];
#pragma unroll
  for (int k = 0; k < kF4 / kDqThreads; ++k) f[k] = src[k * kDqThreads + threadIdx.x];
  // float4 g of a part (cols columns): thread t = g % 128 of 8-column block g / 128 holds (r, c),
  // (r, c + 1), (r + 8, c), (r + 8, c + 1), r = (t / 32) 16 + (t % 32) / 4, c = (t % 4) 2.
  const int part_f4 = 16 * cols;
#pragma unroll
  for (int k = 0; k < kF4 / kDqThreads; ++k) {
    const int g = k * kDqThreads + static_cast<int>(threadIdx.x);
    const int part = g / part_f4, j = (g % part_f4) / 128, t = g % 128;
    const int r = (t / 32) * 16 + (t % 32) / 4, c = part * cols + j * 8 + (t % 4) * 2;
    *reinterpret_cast<float2*>(&sm[r * kPitch + c]) =
        make_float2(f[k].x * a.scale, f[k].y * a.scale);
    *reinterpret_cast<float2*>(&sm[(r + 8) * kPitch + c]) =
        make_float2(f[k].z * a.scale, f[k].w * a.scale);
  }
  __syncthreads();
  const int warp = static_cast<int>(threadIdx.x) / kWarp,
            lane = static_cast<int>(threadIdx.x) % kWarp;
  const int rows = static_cast<int>(tq - i0 < 64 ? tq - i0 : 64);
  T16* dq = static_cast<T16*>(a.dq) + (a.cu_q[lo] + i0) * a.dq_t + h * a.dq_h + lane * 4;
  for (int r = warp; r < rows; r += kDqThreads / kWarp) {
    if (lane * 4 >= kD) break;
    const float4 v = *reinterpret_cast<const float4*>(&sm[r * kPitch + lane * 4]);
    uint2 out;
    if constexpr (std::is_same_v<T16, __half>) {
      out.x = pack_f16x2(v.x, v.y);
      out.y = pack_f16x2(v.z, v.w);
    } else {
      out.x = pack_bf16x2(v.x, v.y);
      out.y = pack_bf16x2(v.z, v.w);
    }
    *reinterpret_cast<uint2*>(dq + r * a.dq_t) = out;
  }
}

// Where one block's keys sit in its sequence, for the masks.
struct BwdSeq {
  int tk, tq;       // keys and queries of the sequence
  int off;          // query i sits at key position i + off
  int right, left;  // the window (-1: unbounded); causal: right = 0
};

// One block's work: keys [n0, n0 + kBN) (n0 = tile * kBN) of KV head hk of sequence b, the
// queries [i_lo, i_hi) that see some of them, and p0, the sequence's first padded row.
struct BwdBlock {
  int hk, k0, q0, n0, i_lo, i_hi;
  int64_t p0;
  BwdSeq sq;
};
template <int kBN>
__device__ __forceinline__ BwdBlock bwd_block(const AttentionBwdArgs& a, int b, int hk, int tile) {
  BwdBlock bb;
  bb.hk = hk;
  bb.k0 = a.cu_k[b];
  bb.q0 = a.cu_q[b];
  bb.p0 = pad_row0(a.cu_q, b);
  const int tk = a.cu_k[b + 1] - bb.k0, tq = a.cu_q[b + 1] - bb.q0;
  bb.n0 = tile * kBN;
  bb.sq = {tk, tq, tk - tq, a.causal ? 0 : a.window_right, a.window_left};
  bb.i_lo = 0;
  bb.i_hi = tq;
  if (bb.sq.right >= 0) bb.i_lo = max(0, bb.n0 - bb.sq.off - bb.sq.right) / 64 * 64;
  if (bb.sq.left >= 0) bb.i_hi = min(tq, bb.n0 + kBN - bb.sq.off + bb.sq.left);
  return bb;
}

// Deterministic dQ (a.deterministic): the blocks adding to one 64-row query tile of one head (and
// part: the halves of the two-warpgroup kernel) take turns on a counter per (head, tile, part)
// that starts at 0, in descending key-tile order. Every key tile from this block's up to the last
// whose queries start at or before row i0 (i_lo grows with the key tile, as i_hi does) adds to
// the tile, so this block's turn is that last key tile less its own. Blocks walk their query
// tiles upwards and the grid hands out key tiles last first (key_tile), so a block's
// predecessors started no later and reach each tile first (the causal case: two tiles ahead),
// and a block only ever waits for blocks already running.
__device__ __forceinline__ int key_tile(const AttentionBwdArgs& a) {
  return static_cast<int>(a.deterministic ? gridDim.x - 1 - blockIdx.x : blockIdx.x);
}
template <int kBN>
__device__ __forceinline__ int dq_turn(const BwdBlock& bb, int i0) {
  const int n = bb.n0 / kBN, tiles = (bb.sq.tk + kBN - 1) / kBN;
  if (bb.sq.right < 0) return tiles - 1 - n;
  // i_lo(m) = floor64(max(0, m kBN - off - right)) <= i0  iff  m kBN <= i0 + 63 + off + right
  const int x = i0 + 63 + bb.sq.off + bb.sq.right;  // >= n kBN >= 0: this block reaches i0
  return min(tiles - 1, x / kBN) - n;
}
__device__ __forceinline__ int* dq_counter(const BwdWs& ws, int h, int64_t pr0, int part) {
  return ws.turns + (static_cast<int64_t>(h) * ws.tp + pr0) / 64 * 2 + part;
}
__device__ __forceinline__ void wait_turn(const int* counter, int turn) {
  int seen;
  do {
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(seen) : "l"(counter) : "memory");
  } while (seen != turn);
}
// After this thread's additions to the tile, and those of the threads that fenced theirs
// (__threadfence) and then reached a barrier with it.
__device__ __forceinline__ void pass_turn(int* counter) {
  asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(counter) : "memory");
}

// Whether every key of [n0, n0 + 64) is seen by every query of [i0, i0 + 64): no mask needed.
__device__ __forceinline__ bool step_unmasked(const BwdSeq& sq, int n0, int i0) {
  return n0 + kBwdBN <= sq.tk && i0 + kBwdBM <= sq.tq &&
         (sq.right < 0 || n0 + kBwdBN - 1 <= i0 + sq.off + sq.right) &&
         (sq.left < 0 || n0 >= i0 + kBwdBM - 1 + sq.off - sq.left);
}

// Whether the scores are soft-capped: kCap 1 yes, 0 no, -1 decided at run time from a.softcap.
template <int kCap>
__device__ __forceinline__ bool capped_scores(const AttentionBwdArgs& a) {
  if constexpr (kCap < 0) {
    return a.softcap > 0.0f;
  } else {
    return kCap == 1;
  }
}

// P^T over S^T in place (this thread's fragments of 16 keys x kNT * 8 queries, the m16n8 C
// layout: keys key_base + 8 (x / 2), queries i0 + 8 j + 2 (lane % 4) + x % 2): exp2 of the
// log2-domain score less the row's lse2; with kMask, 0 where the key is not seen (masks, the
// ends of the keys and of the queries).
template <bool kMask, int kCap = -1, int kNT>
__device__ __forceinline__ void probs_t(float (&st)[kNT][4], const AttentionBwdArgs& a,
                                        const BwdSeq& sq, int key_base, int i0,
                                        const float* s_lse) {
  const int lane = threadIdx.x % kWarp;
  const bool capped = capped_scores<kCap>(a);
  const float mul = a.scale * kLog2e;
#pragma unroll
  for (int j = 0; j < kNT; ++j)
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      const int col = j * 8 + (lane % 4) * 2 + (x % 2);
      float p;  // exp2 of the score in the log2 domain less lse2
      if (capped) {
        p = prefill_detail::fast_exp2(a.softcap * tanhf(st[j][x] * a.scale / a.softcap) * kLog2e -
                                      s_lse[col]);
      } else {
        p = prefill_detail::fast_exp2(fmaf(st[j][x], mul, -s_lse[col]));
      }
      if constexpr (kMask) {
        const int key = key_base + (x / 2) * 8;
        const int pos = i0 + col + sq.off;
        const bool seen = key < sq.tk && i0 + col < sq.tq &&
                          (sq.right < 0 || key <= pos + sq.right) &&
                          (sq.left < 0 || key >= pos - sq.left);
        p = seen ? p : 0.0f;
      }
      st[j][x] = p;
    }
}
template <int kCap = -1, int kNT>
__device__ __forceinline__ void probs_t(float (&st)[kNT][4], const AttentionBwdArgs& a,
                                        const BwdSeq& sq, int n0, int key_base, int i0,
                                        const float* s_lse) {
  if (step_unmasked(sq, n0, i0)) {
    probs_t<false, kCap>(st, a, sq, key_base, i0, s_lse);
  } else {
    probs_t<true, kCap>(st, a, sq, key_base, i0, s_lse);
  }
}

// dS^T = P^T (dP^T - delta) (x scale with kScaled; x the cap's derivative), into dp, same
// layout.
template <int kCap = -1, bool kScaled = true, int kNT>
__device__ __forceinline__ void dscores_t(float (&dp)[kNT][4], const float (&st)[kNT][4],
                                          const AttentionBwdArgs& a, const float* s_lse,
                                          const float* s_delta) {
  const int lane = threadIdx.x % kWarp;
  const bool capped = capped_scores<kCap>(a);
#pragma unroll
  for (int j = 0; j < kNT; ++j)
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      const int col = j * 8 + (lane % 4) * 2 + (x % 2);
      const float pv = st[j][x];
      float ds = pv * (dp[j][x] - s_delta[col]);
      if constexpr (kScaled) ds *= a.scale;
      if (capped && pv > 0.0f) {
        const float s = (__log2f(pv) + s_lse[col]) * 0.69314718055994531f / a.softcap;
        ds *= 1.0f - s * s;
      }
      dp[j][x] = ds;
    }
}

template <int kD>
struct BwdCfg {
  static constexpr int kP = kD + 8;       // Q, dO, K, V tile pitch (elements)
  static constexpr int kPS = kBwdBM + 8;  // dS^T tile pitch, [key][query]
  static constexpr size_t kSmemBytes =
      static_cast<size_t>(2 * kBwdBN + 2 * kBwdBM) * kP * 2 + kBwdBN * kPS * 2 + 2 * kBwdBM * 4;
};

template <int kD, class T16>
__global__ void __launch_bounds__(kBwdThreads, 2)
    bwd_main_kernel(const AttentionBwdArgs a, BwdWs ws) {
  using E = MmaElem<T16>;
  using C = BwdCfg<kD>;
  constexpr int kP = C::kP, kPS = C::kPS, kBN = kBwdBN, kBM = kBwdBM;
  constexpr int kDT = kD / 8;   // n-tiles of 8 over the head dim
  constexpr int kNT = kBM / 8;  // n-tiles of 8 over a step's queries
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t sK = smem_addr(smem_raw), sV = sK + kBN * kP * 2, sQ = sV + kBN * kP * 2,
                 sdO = sQ + kBM * kP * 2, sS = sdO + kBM * kP * 2;
  float* s_lse = reinterpret_cast<float*>(smem_raw + (2 * kBN + 2 * kBM) * kP * 2 + kBN * kPS * 2);
  float* s_delta = s_lse + kBM;

  const BwdBlock bb = bwd_block<kBwdBN>(a, blockIdx.y, blockIdx.z, key_tile(a));
  if (bb.n0 >= bb.sq.tk) return;
  const int hk = bb.hk, k0 = bb.k0, q0 = bb.q0, n0 = bb.n0, tk = bb.sq.tk, tq = bb.sq.tq;
  const int i_lo = bb.i_lo, i_hi = bb.i_hi;
  const BwdSeq& sc = bb.sq;
  const int group = a.Hq / a.Hkv;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;

  const uint16_t* k_base =
      static_cast<const uint16_t*>(a.k) + static_cast<int64_t>(k0 + n0) * a.k_t + hk * a.k_h;
  const uint16_t* v_base =
      static_cast<const uint16_t*>(a.v) + static_cast<int64_t>(k0 + n0) * a.v_t + hk * a.v_h;
  prefill_detail::load_rows<kBN, kD, kP, kBwdThreads>(sK, k_base, a.k_t, tk - n0);
  prefill_detail::load_rows<kBN, kD, kP, kBwdThreads>(sV, v_base, a.v_t, tk - n0);
  cp_async_commit();

  // ldmatrix lane addresses (bytes, relative to a tile): A operand from [row][k] rows 16 w..;
  // B operand from [n][k] storage; B operand (.trans) from [k][n] storage.
  const uint32_t a_lane = ((warp * 16 + lane % 16) * kP + (lane / 16) * 8) * 2;
  const uint32_t b_lane = ((lane % 8 + (lane / 16) * 8) * kP + ((lane / 8) % 2) * 8) * 2;
  const uint32_t bt_lane = ((lane % 8 + ((lane / 8) % 2) * 8) * kP + (lane / 16) * 8) * 2;
  // dS (A operand of dS K, [query][key]) from its [key][query] storage, .trans.
  const uint32_t s_lane =
      sS + ((lane % 8 + (lane / 16) * 8) * kPS + warp * 16 + ((lane / 8) % 2) * 8) * 2;

  float dk[kDT][4], dv[kDT][4];
#pragma unroll
  for (int i = 0; i < kDT; ++i)
#pragma unroll
    for (int x = 0; x < 4; ++x) dk[i][x] = dv[i][x] = 0.0f;

  // This thread's keys within the tile: warp * 16 + lane / 4 + 8 r.
  const int key_base = n0 + warp * 16 + lane / 4;

  for (int g = 0; g < group; ++g) {
    const int h = hk * group + g;
    const uint16_t* q_base = static_cast<const uint16_t*>(a.q) + static_cast<int64_t>(q0) * a.q_t +
                             static_cast<int64_t>(h) * a.q_h;
    const uint16_t* do_base = static_cast<const uint16_t*>(a.dout) +
                              static_cast<int64_t>(q0) * a.dout_t +
                              static_cast<int64_t>(h) * a.dout_h;
    for (int i0 = i_lo; i0 < i_hi; i0 += kBM) {
      __syncthreads();  // the previous step is done with Q, dO, dS and the row values
      const int rows = min(kBM, tq - i0);
      prefill_detail::load_rows<kBM, kD, kP, kBwdThreads>(sQ, q_base + i0 * a.q_t, a.q_t, rows);
      prefill_detail::load_rows<kBM, kD, kP, kBwdThreads>(sdO, do_base + i0 * a.dout_t, a.dout_t,
                                                          rows);
      cp_async_commit();
      if (threadIdx.x < kBM) {
        const int i = i0 + static_cast<int>(threadIdx.x);
        const int64_t at = static_cast<int64_t>(h) * ws.tp + bb.p0 + i;
        s_lse[threadIdx.x] = i < tq ? ws.lse2[at] : INFINITY;
        s_delta[threadIdx.x] = i < tq ? ws.delta[at] : 0.0f;
      }
      cp_async_wait<0>();
      __syncthreads();

      // S^T = K Q^T: the warp's 16 keys x kBM queries.
      float st[kNT][4];
#pragma unroll
      for (int j = 0; j < kNT; ++j) st[j][0] = st[j][1] = st[j][2] = st[j][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        uint32_t ka[4];
        ldsm_x4(ka, sK + a_lane + kk * 32);
#pragma unroll
        for (int j2 = 0; j2 < kBM / 16; ++j2) {
          uint32_t qb[4];
          ldsm_x4(qb, sQ + b_lane + (j2 * 16 * kP + kk * 16) * 2);
          E::mma(st[2 * j2], ka, qb[0], qb[1]);
          E::mma(st[2 * j2 + 1], ka, qb[2], qb[3]);
        }
      }
      // P^T, 0 where a key is not seen (masks, the ends of the keys and of the queries).
      probs_t(st, a, sc, n0, key_base, i0, s_lse);
      // dV += P^T dO.
#pragma unroll
      for (int kk = 0; kk < kBM / 16; ++kk) {
        uint32_t pa[4];
        prefill_detail::p_fragment<E>(pa, *reinterpret_cast<const float(*)[1][kNT][4]>(&st), 0, kk);
#pragma unroll
        for (int dn2 = 0; dn2 < kD / 16; ++dn2) {
          uint32_t ob[4];
          ldsm_x4_t(ob, sdO + bt_lane + (kk * 16 * kP + dn2 * 16) * 2);
          E::mma(dv[2 * dn2], pa, ob[0], ob[1]);
          E::mma(dv[2 * dn2 + 1], pa, ob[2], ob[3]);
        }
      }
      // dP^T = V dO^T.
      float dp[kNT][4];
#pragma unroll
      for (int j = 0; j < kNT; ++j) dp[j][0] = dp[j][1] = dp[j][2] = dp[j][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        uint32_t va[4];
        ldsm_x4(va, sV + a_lane + kk * 32);
#pragma unroll
        for (int j2 = 0; j2 < kBM / 16; ++j2) {
          uint32_t ob[4];
          ldsm_x4(ob, sdO + b_lane + (j2 * 16 * kP + kk * 16) * 2);
          E::mma(dp[2 * j2], va, ob[0], ob[1]);
          E::mma(dp[2 * j2 + 1], va, ob[2], ob[3]);
        }
      }
      // dS^T = P^T (dP^T - delta) scale (x the cap's derivative), into dp.
      dscores_t(dp, st, a, s_lse, s_delta);
      // dK += dS^T Q.
#pragma unroll
      for (int kk = 0; kk < kBM / 16; ++kk) {
        uint32_t sa[4];
        prefill_detail::p_fragment<E>(sa, *reinterpret_cast<const float(*)[1][kNT][4]>(&dp), 0, kk);
#pragma unroll
        for (int dn2 = 0; dn2 < kD / 16; ++dn2) {
          uint32_t qb[4];
          ldsm_x4_t(qb, sQ + bt_lane + (kk * 16 * kP + dn2 * 16) * 2);
          E::mma(dk[2 * dn2], sa, qb[0], qb[1]);
          E::mma(dk[2 * dn2 + 1], sa, qb[2], qb[3]);
        }
      }
      // dS^T to shared memory, [key][query].
      uint16_t* ss = reinterpret_cast<uint16_t*>(smem_raw + (2 * kBN + 2 * kBM) * kP * 2);
#pragma unroll
      for (int j = 0; j < kNT; ++j)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int row = warp * 16 + lane / 4 + 8 * r, col = j * 8 + (lane % 4) * 2;
          *reinterpret_cast<uint32_t*>(ss + row * kPS + col) =
              E::pack(dp[j][2 * r], dp[j][2 * r + 1]);
        }
      __syncthreads();
      // dQ (the warp's 16 query rows) = dS K over the tile's keys, added to the accumulator.
      float dq[kDT][4];
#pragma unroll
      for (int i = 0; i < kDT; ++i) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kBN / 16; ++kk) {
        uint32_t sa[4];
        ldsm_x4_t(sa, s_lane + kk * 16 * kPS * 2);
#pragma unroll
        for (int dn2 = 0; dn2 < kD / 16; ++dn2) {
          uint32_t kb[4];
          ldsm_x4_t(kb, sK + bt_lane + (kk * 16 * kP + dn2 * 16) * 2);
          E::mma(dq[2 * dn2], sa, kb[0], kb[1]);
          E::mma(dq[2 * dn2 + 1], sa, kb[2], kb[3]);
        }
      }
      int* counter = a.deterministic ? dq_counter(ws, h, bb.p0 + i0, 0) : nullptr;
      if (counter != nullptr) {
        if (threadIdx.x == 0) wait_turn(counter, dq_turn<kBN>(bb, i0));
        __syncthreads();
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int i = i0 + warp * 16 + lane / 4 + 8 * r;
        if (i >= tq) continue;
        float* dst = ws.dq_acc + dq_at(ws, kD, h, bb.p0 + i, (lane % 4) * 2);
#pragma unroll
        for (int dn = 0; dn < kDT; ++dn) {
          atomicAdd(reinterpret_cast<float2*>(dst + dn * 8),
                    make_float2(dq[dn][2 * r], dq[dn][2 * r + 1]));
        }
      }
      if (counter != nullptr) {
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) pass_turn(counter);
      }
    }
  }
  cp_async_wait<0>();  // a block whose keys no query sees has only its K/V copies in flight

  // dK and dV of the warp's keys.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = key_base + 8 * r;
    if (key >= tk) continue;
    T16* dkr = static_cast<T16*>(a.dk) + static_cast<int64_t>(k0 + key) * a.dk_t + hk * a.dk_h +
               (lane % 4) * 2;
    T16* dvr = static_cast<T16*>(a.dv) + static_cast<int64_t>(k0 + key) * a.dv_t + hk * a.dv_h +
               (lane % 4) * 2;
#pragma unroll
    for (int dn = 0; dn < kDT; ++dn) {
      *reinterpret_cast<uint32_t*>(dkr + dn * 8) = E::pack(dk[dn][2 * r], dk[dn][2 * r + 1]);
      *reinterpret_cast<uint32_t*>(dvr + dn * 8) = E::pack(dv[dn][2 * r], dv[dn][2 * r + 1]);
    }
  }
}

// The Hopper build of the main kernel (sm_90a): the same blocks, order and elementwise steps,
// the five products on warpgroup MMA. The block's one warpgroup holds its 64 keys as the M rows
// of S^T and dP^T (warp w: keys [16 w, 16 w + 16), the mma.sync kernel's layout), so P^T and
// dS^T are register A operands of dV += P^T dO and dK += dS^T Q. K, V, Q and dO tiles sit in
// shared memory in the 128-byte-swizzle panel layout of prefill_wgmma.cuh, which serves a tile
// both as a K-major operand (S^T = K Q^T, dP^T = V dO^T) and as an N-major one (dO, Q, and K in
// dQ = dS K); dS^T goes through shared memory as dQ's M-major A operand. Q, dO and the rows'
// lse2 and delta are double-buffered: step s + 1's copies land during step s. Each step's dQ
// (fp32, 64 rows) is staged in the step's own Q and dO buffers and added to the accumulator by
// one bulk reduction (cp.reduce.async.bulk ... add.f32), performed by the copy engine in L2,
// instead of per-element atomics (with those, exp2f and masks on every step, a 4 x 2048 x 32 x
// 128 causal backward took 2,960 us against 2,489: docs/runs/2026-11-25-h100-attention-backward-
// wgmma.md). Every product is waited for before the next (no overlap yet).
template <int kD>
struct BwdWgCfg {
  static constexpr int kPanelCols = (kD + 63) / 64 * 64;
  static constexpr uint32_t kTile = 64 * kPanelCols * 2;  // one [64][kD] tile in panels
  static constexpr uint32_t kSTile = 64 * 64 * 2;         // dS^T [64 keys][64 queries]
  // K, V, 2 x (Q, dO), dS^T, 2 x (lse2, delta) [64] floats; + 1024: re-alignment.
  static constexpr size_t kSmemBytes = 6 * kTile + kSTile + 2 * 2 * 64 * 4 + 1024;
};

// A warpgroup's m64 n64 accumulator (P^T or dS^T, keys x 64 queries) as the four 16-bit A
// fragments of a product over those queries.
template <class E>
__device__ __forceinline__ void a_fragments(uint32_t (&f)[4][4], const float (&acc)[32]) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
    prefill_detail::p_fragment<E>(f[kk], *reinterpret_cast<const float(*)[1][8][4]>(&acc[0]), 0,
                                  kk);
}
// dS^T fragments to shared memory at sS, [key][64 queries] rows of 128 bytes in the swizzled
// layout (the 16-byte chunk c of key row r at chunk c ^ (r % 8)); this warp's rows start at key
// row0 + 16 warp.
__device__ __forceinline__ void store_ds_t(uint32_t sS, const uint32_t (&sa)[4][4], int row0) {
  const int warp = (threadIdx.x % 128) / kWarp, lane = threadIdx.x % kWarp;
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      const int r = row0 + warp * 16 + lane / 4 + 8 * (x % 2);
      const int c = kk * 16 + 8 * (x / 2) + (lane % 4) * 2;  // query column (even)
      const uint32_t at = sS + r * 128 + ((((c / 8) ^ (r % 8)) * 16) | ((c % 8) * 2));
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(at), "r"(sa[kk][x]) : "memory");
    }
}

// Keeps fragment registers a wgmma still reads from being reused before its wait.
template <int N>
__device__ __forceinline__ void hold(const uint32_t (&r)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int x = 0; x < 4; ++x) asm volatile("" ::"r"(r[i][x]) : "memory");
}

template <int kD, class T16>
__global__ void __launch_bounds__(kBwdThreads, 2)
    bwd_wgmma_kernel(const AttentionBwdArgs a, BwdWs ws) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();  // wgmma exists on sm_90a only; the host launches this kernel on sm_90 devices only
#else
  using E = MmaElem<T16>;
  using C = BwdWgCfg<kD>;
  using wgmma_detail::load_swizzled;
  constexpr int kBN = kBwdBN, kBM = kBwdBM;
  constexpr int kNT = kBM / 8;  // n-tiles of 8 over a step's queries
  constexpr uint32_t kTile = C::kTile;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t raw = smem_addr(smem_raw);
  const uint32_t sK = (raw + 1023u) & ~1023u, sV = sK + kTile, sQ0 = sV + kTile;
  const uint32_t sS = sQ0 + 4 * kTile, sRows = sS + C::kSTile;
  const float* rows_f = reinterpret_cast<const float*>(smem_raw + (sRows - raw));

  const BwdBlock bb = bwd_block<kBwdBN>(a, blockIdx.y, blockIdx.z, key_tile(a));
  if (bb.n0 >= bb.sq.tk) return;
  const int hk = bb.hk, q0 = bb.q0, n0 = bb.n0, tk = bb.sq.tk, tq = bb.sq.tq;
  const int group = a.Hq / a.Hkv;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;

  const uint16_t* k_base =
      static_cast<const uint16_t*>(a.k) + static_cast<int64_t>(bb.k0 + n0) * a.k_t + hk * a.k_h;
  const uint16_t* v_base =
      static_cast<const uint16_t*>(a.v) + static_cast<int64_t>(bb.k0 + n0) * a.v_t + hk * a.v_h;
  load_swizzled<kBN, kD, kBwdThreads>(sK, k_base, a.k_t, tk - n0);
  load_swizzled<kBN, kD, kBwdThreads>(sV, v_base, a.v_t, tk - n0);

  // Steps: (query head g of the group, query tile i0 of [i_lo, i_hi)), head by head.
  const int per_head = bb.i_hi > bb.i_lo ? (bb.i_hi - bb.i_lo + kBM - 1) / kBM : 0;
  const int n_steps = per_head * group;
  auto load_step = [&](int s) {
    if (s >= n_steps) return;
    const int buf = s & 1, h = hk * group + s / per_head;
    const int i0 = bb.i_lo + (s % per_head) * kBM, rows = min(kBM, tq - i0);
    const uint32_t sQ = sQ0 + buf * 2 * kTile;
    load_swizzled<kBM, kD, kBwdThreads>(
        sQ, static_cast<const uint16_t*>(a.q) + static_cast<int64_t>(q0 + i0) * a.q_t + h * a.q_h,
        a.q_t, rows);
    load_swizzled<kBM, kD, kBwdThreads>(sQ + kTile,
                                        static_cast<const uint16_t*>(a.dout) +
                                            static_cast<int64_t>(q0 + i0) * a.dout_t + h * a.dout_h,
                                        a.dout_t, rows);
    // Threads 0-63: lse2 of row t; 64-127: delta of row t - 64.
    const int t = threadIdx.x % kBM;
    const float* src = (threadIdx.x < kBM ? ws.lse2 : ws.delta) + static_cast<int64_t>(h) * ws.tp +
                       bb.p0 + min(i0 + t, tq - 1);
    cp_async_4_at(sRows + ((buf * 2 + threadIdx.x / kBM) * kBM + t) * 4, src, i0 + t < tq);
  };
  load_step(0);
  cp_async_commit();

  float dk[kD / 2], dv[kD / 2];
#pragma unroll
  for (int i = 0; i < kD / 2; ++i) dk[i] = dv[i] = 0.0f;
  // This thread's keys within the tile: warp * 16 + lane / 4 + 8 r.
  const int key_base = n0 + warp * 16 + lane / 4;

  for (int s = 0; s < n_steps; ++s) {
    const int buf = s & 1, h = hk * group + s / per_head;
    const int i0 = bb.i_lo + (s % per_head) * kBM;
    const uint32_t sQ = sQ0 + buf * 2 * kTile, sdO = sQ + kTile;
    const float* s_lse = rows_f + buf * 2 * kBM;
    const float* s_delta = s_lse + kBM;
    // Step s - 1's dQ reduction has read its staging (the buffers load_step(s + 1) takes).
    if (threadIdx.x == 0) asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
    cp_async_wait<0>();
    fence_proxy_async_shared();
    __syncthreads();  // step s's tiles landed and are visible to wgmma; step s - 1 is done
    load_step(s + 1);
    cp_async_commit();

    // S^T = K Q^T and dP^T = V dO^T: K-major A and B, 16-column steps inside 64-column panels.
    float st[kBM / 2], dp[kBM / 2];
    auto keys_by_queries = [](float(&acc)[kBM / 2], uint32_t a_tile, uint32_t b_tile) {
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        const uint32_t col = (kk / 4) * (64 * 128) + (kk % 4) * 32;
        wgmma_ss<T16, kBM>(acc, wgmma_desc_sw128(a_tile + col, 16, 1024),
                           wgmma_desc_sw128(b_tile + col, 16, 1024), kk > 0);
      }
      wgmma_commit();
    };
    wgmma_fence();
    keys_by_queries(st, sK, sQ);
    keys_by_queries(dp, sV, sdO);
    wgmma_fence_operand(st);
    wgmma_fence_operand(dp);
    wgmma_wait<0>();
    wgmma_fence_operand(st);
    wgmma_fence_operand(dp);

    auto& st4 = *reinterpret_cast<float(*)[kNT][4]>(&st[0]);
    auto& dp4 = *reinterpret_cast<float(*)[kNT][4]>(&dp[0]);
    probs_t(st4, a, bb.sq, n0, key_base, i0, s_lse);
    dscores_t(dp4, st4, a, s_lse, s_delta);
    uint32_t pa[kBM / 16][4], sa[kBM / 16][4];
    a_fragments<E>(pa, st);
    a_fragments<E>(sa, dp);
    // dV += P^T dO, dK += dS^T Q: B N-major, LBO = one 64-column panel, SBO = 8 queries.
    wgmma_fence_operand(dv);
    wgmma_fence_operand(dk);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBM / 16; ++kk)
      wgmma_rs<T16, kD>(dv, pa[kk], wgmma_desc_sw128(sdO + kk * 16 * 128, kBM * 128, 1024));
#pragma unroll
    for (int kk = 0; kk < kBM / 16; ++kk)
      wgmma_rs<T16, kD>(dk, sa[kk], wgmma_desc_sw128(sQ + kk * 16 * 128, kBM * 128, 1024));
    wgmma_commit();
    store_ds_t(sS, sa, 0);
    fence_proxy_async_shared();
    __syncthreads();  // dS^T complete and visible to wgmma
    wgmma_wait<0>();
    hold(pa);
    hold(sa);
    wgmma_fence_operand(dv);
    wgmma_fence_operand(dk);

    // dQ (the step's 64 query rows) = dS K: A = dS^T M-major, B = K N-major.
    float dq[kD / 2];
    __syncthreads();  // every warp is done with this step's Q and dO (the dQ staging below)
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk)
      wgmma_sstt<T16, kD>(dq, wgmma_desc_sw128(sS + kk * 16 * 128, 64 * 128, 1024),
                          wgmma_desc_sw128(sK + kk * 16 * 128, kBN * 128, 1024), kk > 0);
    wgmma_commit();
    wgmma_fence_operand(dq);
    wgmma_wait<0>();
    wgmma_fence_operand(dq);
    // The step's dQ, fp32 [64][kD], staged in its Q and dO buffers (free: dK and dV are done
    // with them, the next step's copies go to the other buffers) and added to the accumulator
    // by one bulk reduction (the copy engine's fp32 add in L2) instead of per-element atomics.
    const uint32_t sDq = sQ;
#pragma unroll
    for (int dn = 0; dn < kD / 8; ++dn)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = warp * 16 + lane / 4 + 8 * r, col = dn * 8 + (lane % 4) * 2;
        asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(sDq + (row * kD + col) * 4),
                     "f"(dq[4 * dn + 2 * r]), "f"(dq[4 * dn + 2 * r + 1])
                     : "memory");
      }
    fence_proxy_async_shared();
    __syncthreads();  // the tile is complete and visible to the copy engine
    if (threadIdx.x == 0) {
      const int rows = min(kBM, tq - i0);
      float* dst = ws.dq_acc + dq_at(ws, kD, h, bb.p0 + i0, 0);
      int* counter = a.deterministic ? dq_counter(ws, h, bb.p0 + i0, 0) : nullptr;
      if (counter != nullptr) wait_turn(counter, dq_turn<kBN>(bb, i0));
      asm volatile(
          "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst),
          "r"(sDq), "r"(rows * kD * 4)
          : "memory");
      asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
      if (counter != nullptr) {  // the reduction complete (written) before the next turn
        asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
        __threadfence();
        pass_turn(counter);
      }
    }
  }
  if (threadIdx.x == 0) asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
  cp_async_wait<0>();  // a block whose keys no query sees has only its K/V copies in flight

  // dK and dV of the warp's keys.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = key_base + 8 * r;
    if (key >= tk) continue;
    T16* dkr = static_cast<T16*>(a.dk) + static_cast<int64_t>(bb.k0 + key) * a.dk_t + hk * a.dk_h +
               (lane % 4) * 2;
    T16* dvr = static_cast<T16*>(a.dv) + static_cast<int64_t>(bb.k0 + key) * a.dv_t + hk * a.dv_h +
               (lane % 4) * 2;
#pragma unroll
    for (int dn = 0; dn < kD / 8; ++dn) {
      *reinterpret_cast<uint32_t*>(dkr + dn * 8) =
          E::pack(dk[4 * dn + 2 * r], dk[4 * dn + 2 * r + 1]);
      *reinterpret_cast<uint32_t*>(dvr + dn * 8) =
          E::pack(dv[4 * dn + 2 * r], dv[4 * dn + 2 * r + 1]);
    }
  }
#endif
}

// The Hopper kernel for head dims 64, 96 and 128 (sm_90a), FA3's arrangement of the same
// algorithm: a block of two warpgroups owns 128 keys, warpgroup w keys [64 w, 64 w + 64) with
// their dK and dV in registers, and the two share each step's 64 queries:
//   S^T = K_w Q^T, dP^T = V_w dO^T   m64 n64 kD, from shared memory; P^T and dS^T in registers
//   dV_w += P^T dO, dK_w += dS^T Q   m64 nD k64, P^T / dS^T as register A operands
//   dQ                               at head dim 128: columns [64 w, 64 w + 64) of dS K, m64 n64
//                                    k128 over both warpgroups' dS^T (through shared memory);
//                                    else this warpgroup's keys' share dS_w K_w, m64 nD k64
// so each query tile is loaded once per 128 keys instead of once per 64. Each warpgroup adds its
// dQ to the fp32 accumulator with 16-byte reductions in L2 (red.global.add.v4.f32) in its
// fragment order (dq_tile). Q, dO and the rows' lse2 and delta arrive by the bulk copy engine
// (TMA, three stages on mbarriers), issued by thread 0 once both warpgroups are past the step
// that used the stage; dS^T is double-buffered, so one barrier per step (dS^T complete)
// suffices. The products are issued ahead of the element-wise work that does not need them: P is
// formed while dP^T runs, dS^T stored while dV runs, dQ and dK issued together, dQ added while dK
// runs (issuing dV before dS^T is formed, and leaving dK running into the next step, measured
// within the noise). Outside the deterministic mode a block takes
// two key tiles, n and nt - 1 - n, so that under a causal mask all blocks have the same work (with
// one tile each, key tiles fastest, the last wave held the long tiles of the last heads: the
// backward at 4 x 2048 x 128, 32/8 and 32/32 heads, took 4-7% longer). dS leaves out the scale: dK
// takes it at the end, dQ in bwd_dq_tiles_kernel.
template <int kD_>
struct BwdH2 {
  static constexpr int kD = kD_, kBN = 128, kBM = 64, kThreads = 256;
  static constexpr int kPanels = (kD + 63) / 64;  // 64-column panels of a tile
  // dQ's columns split between the warpgroups (head dim 128), or each warpgroup's dQ over its
  // own keys (the others: a 64 x D product of both would not fit the registers at 128, and
  // halves of the others are no whole panels)
  static constexpr bool kSplitCols = kD == 128;
  static constexpr int kDqCols = kSplitCols ? 64 : kD;     // dQ columns of a warpgroup
  static constexpr uint32_t kKV = kBN * kPanels * 64 * 2;  // K or V: panels of [128][64]
  static constexpr uint32_t kQ = kBM * kPanels * 64 * 2;   // a Q or dO tile: panels of [64][64]
  static constexpr uint32_t kS = kBN * kBM * 2;            // dS^T [128 keys][64 queries], one panel
  static constexpr uint32_t kRows = 2 * kBM * 4;           // lse2 and delta of a stage
  static constexpr int kStages = 3;                        // Q / dO / rows stages
  // K, V | stages x (Q, dO) | 2 x dS^T | stages x rows | stages barriers; + 1024: re-alignment.
  static constexpr uint32_t kOffQ = 2 * kKV, kOffS = kOffQ + kStages * 2 * kQ,
                            kOffRows = kOffS + 2 * kS, kOffBar = kOffRows + kStages * kRows;
  static constexpr size_t kSmemBytes = kOffBar + kStages * 8 + 1024;
};

struct BwdMaps {
  CUtensorMap q, dout;  // [T][Hq][D] 16-bit, boxes of 64 rows x 64 columns, 128-byte swizzle
};

template <class T16, bool kCap, int kD>
__global__ void __launch_bounds__(256, 1)
    bwd_h2_kernel(const AttentionBwdArgs a, const BwdWs ws, const __grid_constant__ BwdMaps maps) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();  // wgmma exists on sm_90a only; the host launches this kernel on sm_90 devices only
#else
  using E = MmaElem<T16>;
  using C = BwdH2<kD>;
  using wgmma_detail::load_swizzled;
  constexpr int kBM = C::kBM, kNT = kBM / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t raw = smem_addr(smem_raw);
  const uint32_t sK = (raw + 1023u) & ~1023u, sV = sK + C::kKV, sQ0 = sK + C::kOffQ;
  const uint32_t sS0 = sK + C::kOffS, sRows = sK + C::kOffRows;
  const uint32_t full0 = sK + C::kOffBar;  // a barrier per stage, 8 bytes apart
  const float* rows_f = reinterpret_cast<const float*>(smem_raw + (sRows - raw));

  const int group = a.Hq / a.Hkv;
  const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
  const int warp = tid / kWarp, lane = tid % kWarp;

  // This block's key tiles, one after the other: tile key_tile(a) in the deterministic mode,
  // else tiles x and nt - 1 - x of the sequence's nt (x = blockIdx.x < ceil(nt / 2)), so that
  // under a causal mask every block has the same work (the grid's last wave would otherwise hold
  // the long tiles of the last heads).
  const int x = a.deterministic ? key_tile(a) : static_cast<int>(blockIdx.x);
  const BwdBlock bb0 = bwd_block<C::kBN>(a, blockIdx.y, blockIdx.z, x);
  const int hk = bb0.hk, tk = bb0.sq.tk, nt = (tk + C::kBN - 1) / C::kBN;
  if (a.deterministic ? x >= nt : x >= (nt + 1) / 2) return;
  const int n_tiles = a.deterministic || nt - 1 - x == x ? 1 : 2;
  const BwdBlock bb1 = bwd_block<C::kBN>(a, blockIdx.y, blockIdx.z, nt - 1 - x);
  // A tile's steps: (query head g of the group, query tile i0 of [i_lo, i_hi)), head by head, the
  // tiles on the sequence's 64-row grid (its padded blocks).
  auto per_head_of = [&](const BwdBlock& bb) {
    return bb.i_hi > bb.i_lo ? (bb.i_hi - bb.i_lo + kBM - 1) / kBM : 0;
  };
  const int per_head0 = per_head_of(bb0), steps0 = per_head0 * group;
  const int per_head1 = per_head_of(bb1);
  const int n_steps = steps0 + (n_tiles == 2 ? per_head1 * group : 0);
  // Step s of the block (its tiles' steps in turn) as (head, first query row).
  auto step_at = [&](int s, int& h, int& i0) {
    const bool first = s < steps0;
    const int ls = first ? s : s - steps0, per_head = first ? per_head0 : per_head1;
    h = hk * group + ls / per_head;
    i0 = (first ? bb0.i_lo : bb1.i_lo) + (ls % per_head) * kBM;
  };
  // Thread 0: step s's Q, dO (two 64-column panels each), lse2 and delta into stage s % 3.
  auto issue = [&](int s) {
    if (s >= n_steps) return;
    int h, i0;
    step_at(s, h, i0);
    const int st = s % C::kStages;
    const uint32_t bar = full0 + 8 * st, q = sQ0 + st * 2 * C::kQ;
    const uint64_t keep = l2_evict_last_policy();
    mbar_arrive_expect_tx(bar, 2 * C::kQ + C::kRows);
    for (int p = 0; p < C::kPanels; ++p) {
      tma_load_3d(q + p * (kBM * 128), &maps.q, 64 * p, h, bb0.q0 + i0, bar, keep);
      tma_load_3d(q + C::kQ + p * (kBM * 128), &maps.dout, 64 * p, h, bb0.q0 + i0, bar, keep);
    }
    const int64_t row = static_cast<int64_t>(h) * ws.tp + bb0.p0 + i0;
    bulk_load(sRows + st * C::kRows, ws.lse2 + row, kBM * 4, bar);
    bulk_load(sRows + st * C::kRows + kBM * 4, ws.delta + row, kBM * 4, bar);
  };
  if (threadIdx.x == 0) {
    for (int st = 0; st < C::kStages; ++st) mbar_init(full0 + 8 * st, 1);
    mbar_init_fence();
    for (int s = 0; s < C::kStages; ++s) issue(s);
  }

  int s = 0;  // the block's steps so far: the stages run on across its tiles
  for (int t = 0; t < n_tiles; ++t) {
    const BwdBlock bb = t == 0 ? bb0 : bb1;
    const int n0 = bb.n0;
    if (t > 0) __syncthreads();  // the last tile's dK and dV have left K's and V's shared memory
    load_swizzled<C::kBN, kD, C::kThreads>(
        sK,
        static_cast<const uint16_t*>(a.k) + static_cast<int64_t>(bb.k0 + n0) * a.k_t + hk * a.k_h,
        a.k_t, tk - n0);
    load_swizzled<C::kBN, kD, C::kThreads>(
        sV,
        static_cast<const uint16_t*>(a.v) + static_cast<int64_t>(bb.k0 + n0) * a.v_t + hk * a.v_h,
        a.v_t, tk - n0);
    cp_async_commit();

    float dk[kD / 2], dv[kD / 2];
#pragma unroll
    for (int i = 0; i < kD / 2; ++i) dk[i] = dv[i] = 0.0f;
    // This warpgroup's keys, and this thread's within them: n0w + warp * 16 + lane / 4 + 8 r.
    const int n0w = n0 + wg * 64;
    const int key_base = n0w + warp * 16 + lane / 4;
    cp_async_wait<0>();
    fence_proxy_async_shared();
    __syncthreads();  // K and V landed and are visible to wgmma; the barriers are initialised

    const int tile_end = s + (t == 0 ? steps0 : n_steps - steps0);
    for (; s < tile_end; ++s) {
      int h, i0;
      step_at(s, h, i0);
      const int st = s % C::kStages;
      const uint32_t parity = (s / C::kStages) & 1;
      const uint32_t sQ = sQ0 + st * 2 * C::kQ, sdO = sQ + C::kQ, sS = sS0 + (s & 1) * C::kS;
      const float* s_lse = rows_f + st * (2 * kBM);
      const float* s_delta = s_lse + kBM;
      mbar_wait(full0 + 8 * st, parity);

      // S^T = K_w Q^T and dP^T = V_w dO^T: K-major A and B, 16-column steps inside 64-column
      // panels (K and V panels hold 128 rows, this warpgroup's start 64 w rows in).
      float sc[kBM / 2], dp[kBM / 2];
      auto keys_by_queries = [&](float(&acc)[kBM / 2], uint32_t keys, uint32_t queries) {
#pragma unroll
        for (int kk = 0; kk < kD / 16; ++kk) {
          const uint32_t col = (kk % 4) * 32;
          wgmma_ss<T16, kBM>(
              acc, wgmma_desc_sw128(keys + (kk / 4) * (C::kBN * 128) + wg * 8192 + col, 16, 1024),
              wgmma_desc_sw128(queries + (kk / 4) * (kBM * 128) + col, 16, 1024), kk > 0);
        }
        wgmma_commit();
      };
      wgmma_fence();
      keys_by_queries(sc, sK, sQ);
      keys_by_queries(dp, sV, sdO);
      wgmma_fence_operand(sc);
      wgmma_wait<1>();  // S^T is in; dP^T may still run
      wgmma_fence_operand(sc);
      auto& sc4 = *reinterpret_cast<float(*)[kNT][4]>(&sc[0]);
      auto& dp4 = *reinterpret_cast<float(*)[kNT][4]>(&dp[0]);
      probs_t<kCap ? 1 : 0>(sc4, a, bb.sq, n0w, key_base, i0, s_lse);
      uint32_t pa[kBM / 16][4], sa[kBM / 16][4];
      a_fragments<E>(pa, sc);
      wgmma_fence_operand(dp);
      wgmma_wait<0>();
      wgmma_fence_operand(dp);
      dscores_t<kCap ? 1 : 0, false>(dp4, sc4, a, s_lse, s_delta);
      a_fragments<E>(sa, dp);
      // dV += P^T dO: B N-major, LBO = one 64-column panel, SBO = 8 queries.
      wgmma_fence_operand(dv);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBM / 16; ++kk)
        wgmma_rs<T16, kD>(dv, pa[kk], wgmma_desc_sw128(sdO + kk * 16 * 128, kBM * 128, 1024));
      wgmma_commit();
      store_ds_t(sS, sa, wg * 64);  // this warpgroup's 64 key rows
      fence_proxy_async_shared();
      named_barrier_sync(1, C::kThreads);  // both warpgroups' dS^T are in and visible to wgmma
      // Both warpgroups are done with step s - 1, so its stage takes step s + 2.
      if (threadIdx.x == 0 && s >= 1) issue(s + 2);

      // dQ: with kSplitCols its half dS K[:, 64 w ..) (A = dS^T M-major over all 128 keys, B = K
      // panel w N-major), else this warpgroup's keys' share dS_w K_w (all columns); then
      // dK += dS^T Q.
      float dq[C::kDqCols / 2];
      wgmma_fence();
      if constexpr (C::kSplitCols) {
#pragma unroll
        for (int kk = 0; kk < C::kBN / 16; ++kk)
          wgmma_sstt<T16, 64>(
              dq, wgmma_desc_sw128(sS + kk * 16 * 128, kBM * 128, 1024),
              wgmma_desc_sw128(sK + wg * (C::kBN * 128) + kk * 16 * 128, C::kBN * 128, 1024),
              kk > 0);
      } else {
#pragma unroll
        for (int kk = 0; kk < 64 / 16; ++kk)
          wgmma_sstt<T16, kD>(dq, wgmma_desc_sw128(sS + (wg * 64 + kk * 16) * 128, kBM * 128, 1024),
                              wgmma_desc_sw128(sK + (wg * 64 + kk * 16) * 128, C::kBN * 128, 1024),
                              kk > 0);
      }
      wgmma_commit();
      wgmma_fence_operand(dk);
#pragma unroll
      for (int kk = 0; kk < kBM / 16; ++kk)
        wgmma_rs<T16, kD>(dk, sa[kk], wgmma_desc_sw128(sQ + kk * 16 * 128, kBM * 128, 1024));
      wgmma_commit();
      wgmma_fence_operand(dq);
      wgmma_wait<1>();  // dV and dQ are done; dK may still run
      wgmma_fence_operand(dq);
      wgmma_fence_operand(dv);
      hold(pa);

      // Added to the accumulator in fragment order (dq_tile): a warp's 16-byte reductions cover
      // 512 contiguous bytes.
      float* dq_dst = dq_tile(ws, kD, h, bb.p0 + i0) + (C::kSplitCols ? wg * 64 * 64 : 0) + tid * 4;
      // Deterministic (never with kSplitCols: h2_head_dim): the block's two warpgroups take
      // consecutive turns on the tile's counter, each passing its turn on once its additions are
      // done (each thread fences them, then a barrier orders them before the release).
      int* counter = nullptr;
      if (a.deterministic) {
        counter = dq_counter(ws, h, bb.p0 + i0, 0);
        if (tid == 0) wait_turn(counter, 2 * dq_turn<C::kBN>(bb, i0) + wg);
        named_barrier_sync(2 + wg, 128);
      }
#pragma unroll
      for (int j = 0; j < C::kDqCols / 8; ++j)
        asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(dq_dst + j * 512),
                     "f"(dq[4 * j]), "f"(dq[4 * j + 1]), "f"(dq[4 * j + 2]), "f"(dq[4 * j + 3])
                     : "memory");
      if (counter != nullptr) {
        __threadfence();
        named_barrier_sync(2 + wg, 128);
        if (tid == 0) pass_turn(counter);
      }
      wgmma_fence_operand(dk);
      wgmma_wait<0>();
      wgmma_fence_operand(dk);
      hold(sa);
    }

    // dK (times the scale, left out of dS) and dV, staged in K's and V's shared memory as
    // [128 keys][kPanels * 128 bytes] rows with the 16-byte chunk c at c ^ (key % 8)
    // (conflict-free both ways), then written as whole 16-byte chunks.
    constexpr int kPitch = C::kPanels * 128, kChunks = kD / 8;
    __syncthreads();  // both warpgroups' products are done with K and V
#pragma unroll
    for (int dn = 0; dn < kD / 8; ++dn)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = wg * 64 + warp * 16 + lane / 4 + 8 * r;
        const uint32_t at = row * kPitch + ((dn ^ (row % 8)) * 16) + (lane % 4) * 4;
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sK + at),
                     "r"(E::pack(dk[4 * dn + 2 * r] * a.scale, dk[4 * dn + 2 * r + 1] * a.scale))
                     : "memory");
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sV + at),
                     "r"(E::pack(dv[4 * dn + 2 * r], dv[4 * dn + 2 * r + 1]))
                     : "memory");
      }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < (C::kBN * kChunks + C::kThreads - 1) / C::kThreads; ++i) {
      const int idx = i * C::kThreads + threadIdx.x, row = idx / kChunks, c = idx % kChunks;
      if (row >= C::kBN || n0 + row >= tk) continue;
      const uint32_t at = row * kPitch + ((c ^ (row % 8)) * 16);
      uint4 kx, vx;
      asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(kx.x), "=r"(kx.y), "=r"(kx.z), "=r"(kx.w)
                   : "r"(sK + at));
      asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(vx.x), "=r"(vx.y), "=r"(vx.z), "=r"(vx.w)
                   : "r"(sV + at));
      const int64_t key = bb.k0 + n0 + row;
      *reinterpret_cast<uint4*>(static_cast<T16*>(a.dk) + key * a.dk_t + hk * a.dk_h + c * 8) = kx;
      *reinterpret_cast<uint4*>(static_cast<T16*>(a.dv) + key * a.dv_t + hk * a.dv_h + c * 8) = vx;
    }
  }
#endif
}

// Q's and dO's tensor maps for bwd_h2_kernel: [T][Hq][D] with their strides, boxes of 64
// columns x 1 head x 64 rows; false if the driver refused them.
bool encode_bwd_maps(BwdMaps& m, const AttentionBwdArgs& a) {
  return encode_head_rows(&m.q, a.q, a.T, a.Hq, a.D, a.q_t, a.q_h, 64, a.fp16) &&
         encode_head_rows(&m.dout, a.dout, a.T, a.Hq, a.D, a.dout_t, a.dout_h, 64, a.fp16);
}

template <class T16, bool kCap, int kD>
void launch_h2(const AttentionBwdArgs& a, const BwdWs& ws, const BwdMaps& maps) {
  using C = BwdH2<kD>;
  static const bool raised = [] {
    LLMK_CUDA_CHECK(cudaFuncSetAttribute(bwd_h2_kernel<T16, kCap, kD>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(C::kSmemBytes)));
    return true;
  }();
  (void)raised;
  // Key tiles fastest: the blocks in flight share a few heads' Q, dO and dQ in L2. Outside the
  // deterministic mode a block takes two key tiles (bwd_h2_kernel).
  const int64_t tiles = ceil_div(a.max_tk, C::kBN);
  const dim3 grid(static_cast<unsigned>(a.deterministic ? tiles : ceil_div(tiles, 2)),
                  static_cast<unsigned>(a.B), static_cast<unsigned>(a.Hkv));
  bwd_h2_kernel<T16, kCap, kD><<<grid, C::kThreads, C::kSmemBytes, current_stream()>>>(a, ws, maps);
  check_launch("attention backward");
}

// The two-warpgroup kernel for head dim D, with or without the softcap; false for a head dim it
// is not built for.
template <class T16>
bool launch_h2_for(const AttentionBwdArgs& a, const BwdWs& ws, const BwdMaps& maps) {
  const bool cap = a.softcap > 0.0f;
  switch (a.D) {
    case 64:
      cap ? launch_h2<T16, true, 64>(a, ws, maps) : launch_h2<T16, false, 64>(a, ws, maps);
      return true;
    case 96:
      cap ? launch_h2<T16, true, 96>(a, ws, maps) : launch_h2<T16, false, 96>(a, ws, maps);
      return true;
    case 128:
      cap ? launch_h2<T16, true, 128>(a, ws, maps) : launch_h2<T16, false, 128>(a, ws, maps);
      return true;
    default:
      return false;
  }
}
// Head dims the two-warpgroup kernel takes: 64 and 96, and 128 when not deterministic (its
// deterministic mode at 128, each half taking turns on a counter of its own, gave dq and dk bits
// that changed from run to run on an H100, cause not found; the one-warpgroup kernel takes it).
bool h2_head_dim(const AttentionBwdArgs& a) {
  return a.D == 64 || a.D == 96 || (a.D == 128 && !a.deterministic);
}

// Launches kKernel with kSmem bytes of dynamic shared memory, its limit raised once per kernel
// (so that capture sees no attribute calls).
template <auto kKernel, size_t kSmem>
void launch_main(dim3 grid, const AttentionBwdArgs& a, BwdWs ws) {
  static const bool raised = [] {
    LLMK_CUDA_CHECK(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(kSmem)));
    return true;
  }();
  (void)raised;
  kKernel<<<grid, kBwdThreads, kSmem, current_stream()>>>(a, ws);
}

// The main kernel: the wgmma build on sm_90 devices unless the mma.sync kernels are asked for
// (set_prefill_kernel, which picks the backward's build too), else the mma.sync build.
template <int kD, class T16>
void launch_bwd(const AttentionBwdArgs& a, BwdWs ws) {
  const bool wgmma =
      cuda::prefill_kernel() != PrefillKernel::kMmaSync && device_info().compute_capability() == 90;
  const dim3 grid(static_cast<unsigned>(ceil_div(a.max_tk, kBwdBN)), static_cast<unsigned>(a.B),
                  static_cast<unsigned>(a.Hkv));
  if (wgmma) {
    launch_main<bwd_wgmma_kernel<kD, T16>, BwdWgCfg<kD>::kSmemBytes>(grid, a, ws);
  } else {
    launch_main<bwd_main_kernel<kD, T16>, BwdCfg<kD>::kSmemBytes>(grid, a, ws);
  }
  check_launch("attention backward");
}

// False (nothing launched) for a head dim not built.
template <class T16>
bool run_bwd(const AttentionBwdArgs& a) {
  if (!(a.D >= 64 && a.D <= 128 && a.D % 16 == 0)) return false;
  const BwdWs ws = bwd_ws(a.workspace, a.T, a.Hq, a.D, a.B);
  const int64_t rows = static_cast<int64_t>(a.T) * a.Hq;
  // The two-warpgroup kernel (h2_head_dim) on Hopper (unless the mma.sync kernels are asked
  // for), where the driver encodes its tensor maps.
  BwdMaps maps;
  const bool h2 = h2_head_dim(a) && a.max_tk > 0 && rows > 0 &&
                  cuda::prefill_kernel() != PrefillKernel::kMmaSync &&
                  device_info().compute_capability() == 90 && encode_bwd_maps(maps, a);
  // The turn counters of the deterministic mode start at zero; the row pass zeroes dQ's
  // accumulator (and, for the two-warpgroup kernel, writes every padding row's lse2 and delta).
  if (a.deterministic) {
    LLMK_CUDA_CHECK(cudaMemsetAsync(ws.turns, 0, turns_bytes(ws.tp, a.Hq), current_stream()));
  }
  if (rows > 0) {
    constexpr int kThreads = 256;
    const int64_t items = (h2 ? ws.tp * a.Hq : rows) * kRowLanes;
    const dim3 grid(static_cast<unsigned>(ceil_div(items, kThreads)));
    if (h2) {
      bwd_rows_kernel<T16, true><<<grid, kThreads, 0, current_stream()>>>(a, ws);
    } else {
      bwd_rows_kernel<T16, false><<<grid, kThreads, 0, current_stream()>>>(a, ws);
    }
    check_launch("attention backward rows");
  }
  if (h2) {
    launch_h2_for<T16>(a, ws, maps);
  } else if (a.max_tk > 0) {
    switch (a.D) {
      case 64:
        launch_bwd<64, T16>(a, ws);
        break;
      case 80:
        launch_bwd<80, T16>(a, ws);
        break;
      case 96:
        launch_bwd<96, T16>(a, ws);
        break;
      case 112:
        launch_bwd<112, T16>(a, ws);
        break;
      case 128:
        launch_bwd<128, T16>(a, ws);
        break;
      default:
        return false;
    }
  }
  if (rows > 0) {
    if (h2) {
      const unsigned blocks = static_cast<unsigned>(ws.tp / 64 * a.Hq);
      const int cols = a.D == 128 ? 64 : a.D;  // BwdH2<D>::kDqCols
      switch (a.D) {
        case 64:
          bwd_dq_tiles_kernel<T16, 64><<<blocks, kDqThreads, 0, current_stream()>>>(a, ws, cols);
          break;
        case 96:
          bwd_dq_tiles_kernel<T16, 96><<<blocks, kDqThreads, 0, current_stream()>>>(a, ws, cols);
          break;
        default:
          bwd_dq_tiles_kernel<T16, 128><<<blocks, kDqThreads, 0, current_stream()>>>(a, ws, cols);
          break;
      }
    } else {
      const int64_t n = rows * (a.D / 8);
      bwd_dq_kernel<T16>
          <<<static_cast<unsigned>(ceil_div(n, 256)), 256, 0, current_stream()>>>(a, ws);
    }
    check_launch("attention backward dq");
  }
  return true;
}

}  // namespace
}  // namespace attn

// bwd_ws's layout: dQ's accumulator, lse2 and delta (floats), the turn counters.
size_t attention_backward_workspace(int64_t T, int64_t Hq, int64_t D, int64_t B) {
  const int64_t tp = attn::padded_rows(T, B);
  return static_cast<size_t>(tp * Hq * (D + 2)) * sizeof(float) + attn::turns_bytes(tp, Hq);
}

bool launch_attention_backward(const AttentionBwdArgs& a) {
  return a.fp16 ? attn::run_bwd<__half>(a) : attn::run_bwd<__nv_bfloat16>(a);
}

}  // namespace llmk::cuda
