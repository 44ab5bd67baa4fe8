// Attention transfer (attention_transfer.h) on tensor cores: mma.sync m16n8k16, 16-bit operands
// and fp32 accumulators, as the flash-attention kernels (attention/tiles.cuh).
//
// A block of 4 warps owns 64 rows of one (batch, relation head) (warp w: rows [16 w, 16 w + 16))
// and walks 64-column tiles. Both sides' row tiles are copied to shared memory once; each step's
// column tiles (teacher and student) are copied with cp.async, two buffers where three tiles of
// the pair fit in 110 KiB (so two blocks share an SM), else one, the next teacher tile then
// copied once the scores are formed. Rows are padded by 16 bytes (conflict-free ldmatrix) and
// relation head dims to a multiple of 16 with zeros, which add nothing to any product. Causal:
// only the column tiles up to (queries) or from (keys) the diagonal, the mask applied only on the
// diagonal tile and the last, partial one. The builds are per (teacher, student) dim bucket, 64,
// 128 or 256 each; the k steps and gradient columns past a call's own dims are skipped.
//
//   forward   rows = queries, columns = keys: scores of both sides in the log2 domain, online
//             max and sum of each, and the teacher-weighted sum of a_t - a_s; kl and the two
//             log-sum-exps per row.
//   backward  one kernel, two launches. Query rows over key tiles: dS = p_s - p_t recomputed
//             from the saved log-sum-exps, dq += dS K_s (dS as 16-bit A fragments, as flash
//             attention takes P; K_s the B operand through ldmatrix .trans). Key rows over query
//             tiles: the transposed scores (K as the A side, Q as B; the log-sum-exps indexed by
//             column, staged in shared memory), dk += dS^T Q_s. Every gradient row is summed by
//             one warp in column order: no atomics, deterministic. dS is rounded to 16 bits
//             unscaled (within [-1, 1]) and g scale_s applied to the fp32 sums, so that fp16 keeps
//             its precision where g is small.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/cuda/check.h"
#include "core/cuda/stream.h"
#include "kernels/cuda/activation.cuh"
#include "kernels/cuda/attention/tiles.cuh"
#include "kernels/cuda/attention_transfer.h"
#include "kernels/cuda/common.cuh"

namespace llmk::cuda::grad {

namespace {

using attn::cp_async_16_at;
using attn::cp_async_commit;
using attn::cp_async_wait;
using attn::kLog2e;
using attn::ldsm_x4;
using attn::ldsm_x4_t;
using attn::MmaElem;

constexpr int kWarps = 4, kThreads = kWarps * kWarp;
constexpr int kTile = 16 * kWarps;  // rows of a block, columns of a step
static_assert(kThreads == 2 * kTile, "a thread per column log-sum-exp (teacher, student)");
constexpr float kLn2 = 0.69314718055994531f;

// A build's shared memory: the row tiles (teacher, student), kStages column tile pairs, and two
// buffers of the column tile's log-sum-exps (teacher, student; read by the key-row backward).
template <int kDt_, int kDs_>
struct Cfg {
  static constexpr int kDt = kDt_, kDs = kDs_;        // the widest padded dims this build takes
  static constexpr int kPt = kDt + 8, kPs = kDs + 8;  // row pitches, elements
  static constexpr uint32_t kTBytes = kTile * kPt * 2, kSBytes = kTile * kPs * 2;
  static constexpr uint32_t kPair = kTBytes + kSBytes;
  static constexpr uint32_t kLseBytes = 2 * 2 * kTile * 4;
  static constexpr int kStages = 3 * kPair + kLseBytes <= 110 * 1024 ? 2 : 1;
  static constexpr size_t kSmemBytes = (1 + kStages) * kPair + kLseBytes;
  static_assert(kDt % 16 == 0 && kDs % 16 == 0, "dims in steps of 16");
};

struct Args {
  const uint16_t *tq, *tk, *sq, *sk;  // [B, S, R d]
  float *kl, *lse_t_out, *lse_s_out;  // forward: [B, R, S]
  const float *lse_t, *lse_s, *dout;  // backward
  uint16_t* grad;                     // backward: dq (query rows) or dk (key rows), [B, S, R ds]
  int S, R, BR, tiles;                // BR = B R; tiles = ceil(S / 64)
  int dt, ds, kt, ks;                 // relation head dims; k steps of 16 over each (padded)
  float mul_t, mul_s;                 // scale log2(e): scores in the log2 domain
  float grad_mul;                     // scale_s / (B R S), times *dout
  bool causal;
};

// Reductions over the quad of lanes that holds a row of the m16n8 accumulators.
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// The fragment element (j, x) of this thread: row 16 warp + lane / 4 + 8 (x / 2) of the block's
// rows, column 8 j + 2 (lane % 4) + x % 2 of the step's columns.
__device__ __forceinline__ int frag_row(int x) {
  return (threadIdx.x / kWarp) * 16 + (threadIdx.x % kWarp) / 4 + 8 * (x / 2);
}
__device__ __forceinline__ int frag_col(int j, int x) {
  return j * 8 + (threadIdx.x % 4) * 2 + x % 2;
}

// Rows [row0, row0 + 64) of one relation head (src: its row 0; rows `stride` elements apart) to
// a [64][kP] tile at the shared-space address dst: columns [0, d) copied, [d, 16 k16) zeros (the
// last k step's padding), rows past S zeros.
template <int kP>
__device__ __forceinline__ void load_tile(uint32_t dst, const uint16_t* src, int64_t stride,
                                          int row0, int S, int d, int k16) {
  const int chunks = 2 * k16;  // 16-byte chunks of a row that the k steps read
  const int valid = min(kTile, S - row0);
  src += static_cast<int64_t>(row0) * stride;
  for (int t = threadIdx.x; t < kTile * chunks; t += kThreads) {
    const int row = t / chunks, c = t - row * chunks;
    const bool ok = row < valid && c * 8 < d;
    cp_async_16_at(dst + (row * kP + c * 8) * 2, ok ? src + row * stride + c * 8 : src, ok);
  }
}

// s = the warp's 16 rows of the row tile sA times the 64 rows of the column tile sB (both
// [64][kP] at shared-space addresses), over k16 steps of 16 columns.
template <class E, int kD, int kP>
__device__ __forceinline__ void tile_scores(float (&s)[8][4], uint32_t sA, uint32_t sB, int k16) {
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  // ldmatrix lane addresses: the A operand from [row][k] storage, the B operand from [n][k].
  const uint32_t a_lane = sA + ((warp * 16 + lane % 16) * kP + (lane / 16) * 8) * 2;
  const uint32_t b_lane = sB + ((lane % 8 + (lane / 16) * 8) * kP + ((lane / 8) % 2) * 8) * 2;
#pragma unroll
  for (int j = 0; j < 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    if (kk >= k16) break;
    uint32_t fa[4];
    ldsm_x4(fa, a_lane + kk * 32);
#pragma unroll
    for (int j2 = 0; j2 < 4; ++j2) {
      uint32_t fb[4];
      ldsm_x4(fb, b_lane + (j2 * 16 * kP + kk * 16) * 2);
      E::mma(s[2 * j2], fa, fb[0], fb[1]);
      E::mma(s[2 * j2 + 1], fa, fb[2], fb[3]);
    }
  }
}

// The 16-bit A fragment of columns [16 kk, 16 kk + 16) of the accumulators s.
template <class E>
__device__ __forceinline__ void a_fragment(uint32_t (&f)[4], const float (&s)[8][4], int kk) {
  f[0] = E::pack(s[2 * kk][0], s[2 * kk][1]);
  f[1] = E::pack(s[2 * kk][2], s[2 * kk][3]);
  f[2] = E::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
  f[3] = E::pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}

// The block's (batch b, relation r, row tile): blockIdx.x runs over row tiles slowest, so blocks
// of the same work size go together; the tiles with the most column steps (causal) go first.
struct Block {
  int b, r, br, tile;
};
template <bool kKeyRows>
__device__ __forceinline__ Block block_of(const Args& a) {
  const int t = static_cast<int>(blockIdx.x) / a.BR, br = static_cast<int>(blockIdx.x) % a.BR;
  return {br / a.R, br % a.R, br, kKeyRows ? t : a.tiles - 1 - t};
}

// The column tiles [c0, c1) that row tile `tile` meets: causal queries see keys up to the
// diagonal, causal keys are seen by queries from it.
template <bool kKeyRows>
__device__ __forceinline__ void column_tiles(const Args& a, int tile, int& c0, int& c1) {
  c0 = kKeyRows && a.causal ? tile : 0;
  c1 = !kKeyRows && a.causal ? tile + 1 : a.tiles;
}

// Whether the step of column tile n needs the mask: the diagonal tile (causal), or the last one
// where it passes S.
__device__ __forceinline__ bool step_masked(const Args& a, int tile, int n) {
  return (a.causal && n == tile) || (n + 1) * kTile > a.S;
}
// Whether row x meets column y (indices within the sequence): y < S and, causal, key <= query.
template <bool kKeyRows>
__device__ __forceinline__ bool pair_seen(const Args& a, int x, int y) {
  return y < a.S && (!a.causal || (kKeyRows ? x <= y : y <= x));
}

// Row 0 of relation r of batch b in x [B, S, R d].
__device__ __forceinline__ const uint16_t* relation_rows(const uint16_t* x, const Args& a, int b,
                                                         int r, int d) {
  return x + (static_cast<int64_t>(b) * a.S * a.R + r) * d;
}

template <class T16, class C>
__global__ void __launch_bounds__(kThreads, 2) fwd_kernel(const Args a) {
  using E = MmaElem<T16>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t s0 = smem_addr(smem_raw);
  const uint32_t sQt = s0, sQs = s0 + C::kTBytes;
  const Block blk = block_of<false>(a);
  const int row0 = blk.tile * kTile;
  const int64_t wt = static_cast<int64_t>(a.R) * a.dt, ws = static_cast<int64_t>(a.R) * a.ds;
  const uint16_t* kt = relation_rows(a.tk, a, blk.b, blk.r, a.dt);
  const uint16_t* ks = relation_rows(a.sk, a, blk.b, blk.r, a.ds);
  load_tile<C::kPt>(sQt, relation_rows(a.tq, a, blk.b, blk.r, a.dt), wt, row0, a.S, a.dt, a.kt);
  load_tile<C::kPs>(sQs, relation_rows(a.sq, a, blk.b, blk.r, a.ds), ws, row0, a.S, a.ds, a.ks);
  auto sKt = [&](int st) { return s0 + (1 + st) * C::kPair; };
  auto load_keys = [&](int n, int st) {
    load_tile<C::kPt>(sKt(st), kt, wt, n * kTile, a.S, a.dt, a.kt);
    load_tile<C::kPs>(sKt(st) + C::kTBytes, ks, ws, n * kTile, a.S, a.ds, a.ks);
    cp_async_commit();
  };
  int c0, c1;
  column_tiles<false>(a, blk.tile, c0, c1);
  load_keys(c0, 0);

  // Per row (x / 2 of the fragments) in the log2 domain: the running maxima, the sums of
  // 2^(a - m) and the teacher-weighted sum of a_t - a_s (this thread's columns; the quad's sum
  // at the end).
  float m_t[2] = {-INFINITY, -INFINITY}, m_s[2] = {-INFINITY, -INFINITY};
  float z_t[2] = {0.0f, 0.0f}, z_s[2] = {0.0f, 0.0f}, w[2] = {0.0f, 0.0f};
  for (int n = c0; n < c1; ++n) {
    const int st = (n - c0) % C::kStages;
    cp_async_wait<0>();
    __syncthreads();  // tile n has landed; every warp is done with the buffer refilled next
    if constexpr (C::kStages == 2) {
      if (n + 1 < c1) load_keys(n + 1, st ^ 1);
    }
    float s_t[8][4], s_s[8][4];
    tile_scores<E, C::kDt, C::kPt>(s_t, sQt, sKt(st), a.kt);
    tile_scores<E, C::kDs, C::kPs>(s_s, sQs, sKt(st) + C::kTBytes, a.ks);
    if constexpr (C::kStages == 1) {
      if (n + 1 < c1) {
        __syncthreads();
        load_keys(n + 1, 0);
      }
    }
    const bool masked = step_masked(a, blk.tile, n);
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        const bool seen =
            !masked || pair_seen<false>(a, row0 + frag_row(x), n * kTile + frag_col(j, x));
        s_t[j][x] = seen ? s_t[j][x] * a.mul_t : -INFINITY;
        s_s[j][x] = seen ? s_s[j][x] * a.mul_s : -INFINITY;
      }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx_t = -INFINITY, mx_s = -INFINITY;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        mx_t = fmaxf(mx_t, fmaxf(s_t[j][2 * h], s_t[j][2 * h + 1]));
        mx_s = fmaxf(mx_s, fmaxf(s_s[j][2 * h], s_s[j][2 * h + 1]));
      }
      const float new_t = fmaxf(m_t[h], quad_max(mx_t)), new_s = fmaxf(m_s[h], quad_max(mx_s));
      // A row with no column seen yet keeps -inf; subtracting 0 then keeps its terms 0.
      const float use_t = new_t == -INFINITY ? 0.0f : new_t;
      const float use_s = new_s == -INFINITY ? 0.0f : new_s;
      float zt = 0.0f, zs = 0.0f, wt_sum = 0.0f;
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int x = 2 * h; x < 2 * h + 2; ++x) {
          const float e = ex2_ftz(s_t[j][x] - use_t);
          zt += e;
          wt_sum += e > 0.0f ? e * (s_t[j][x] - s_s[j][x]) : 0.0f;  // masked terms add 0
          zs += ex2_ftz(s_s[j][x] - use_s);
        }
      const float alpha_t = ex2_ftz(m_t[h] - use_t), alpha_s = ex2_ftz(m_s[h] - use_s);
      z_t[h] = z_t[h] * alpha_t + zt;
      w[h] = w[h] * alpha_t + wt_sum;
      z_s[h] = z_s[h] * alpha_s + zs;
      m_t[h] = new_t;
      m_s[h] = new_s;
    }
  }

  // kl = ln 2 (w / z_t - (lse2_t - lse2_s)), lse2 = m + log2 z; the difference of the maxima
  // taken first, where it is exact.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float zt = quad_sum(z_t[h]), zs = quad_sum(z_s[h]), wt_sum = quad_sum(w[h]);
    const int i = row0 + frag_row(2 * h);
    if (i >= a.S || threadIdx.x % 4 != 0) continue;
    const int64_t o = static_cast<int64_t>(blk.br) * a.S + i;
    const float l2t = log2f(zt), l2s = log2f(zs);
    a.kl[o] = kLn2 * (wt_sum / zt - (m_t[h] - m_s[h]) - (l2t - l2s));
    a.lse_t_out[o] = (m_t[h] + l2t) * kLn2;
    a.lse_s_out[o] = (m_s[h] + l2s) * kLn2;
  }
}

// The backward's two launches: kKeyRows false, rows = queries and columns = keys, grad = dq;
// true, rows = keys and columns = queries, grad = dk.
template <class T16, class C, bool kKeyRows>
__global__ void __launch_bounds__(kThreads, 2) bwd_kernel(const Args a) {
  using E = MmaElem<T16>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t s0 = smem_addr(smem_raw);
  const uint32_t sRt = s0, sRs = s0 + C::kTBytes;
  // The column tiles' log-sum-exps in the log2 domain, [2 buffers][teacher, student][64].
  float* lse_cols = reinterpret_cast<float*>(smem_raw + (1 + C::kStages) * C::kPair);
  const Block blk = block_of<kKeyRows>(a);
  const int row0 = blk.tile * kTile;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t wt = static_cast<int64_t>(a.R) * a.dt, ws = static_cast<int64_t>(a.R) * a.ds;
  const uint16_t* rt = relation_rows(kKeyRows ? a.tk : a.tq, a, blk.b, blk.r, a.dt);
  const uint16_t* rs = relation_rows(kKeyRows ? a.sk : a.sq, a, blk.b, blk.r, a.ds);
  const uint16_t* ct = relation_rows(kKeyRows ? a.tq : a.tk, a, blk.b, blk.r, a.dt);
  const uint16_t* cs = relation_rows(kKeyRows ? a.sq : a.sk, a, blk.b, blk.r, a.ds);
  const float* lse_t = a.lse_t + static_cast<int64_t>(blk.br) * a.S;
  const float* lse_s = a.lse_s + static_cast<int64_t>(blk.br) * a.S;
  load_tile<C::kPt>(sRt, rt, wt, row0, a.S, a.dt, a.kt);
  load_tile<C::kPs>(sRs, rs, ws, row0, a.S, a.ds, a.ks);
  auto sCt = [&](int st) { return s0 + (1 + st) * C::kPair; };
  // The teacher's column tile n (and, for key rows, the columns' log-sum-exps into buffer lb);
  // the student's separately: the one-buffer build refills it only after dS K_s.
  auto load_teacher_cols = [&](int n, int st, int lb) {
    load_tile<C::kPt>(sCt(st), ct, wt, n * kTile, a.S, a.dt, a.kt);
    if constexpr (kKeyRows) {
      const int t = threadIdx.x, col = n * kTile + t % kTile;  // threads 0-63 teacher, 64-127
      const float* src = t < kTile ? lse_t : lse_s;
      lse_cols[lb * 2 * kTile + t] = col < a.S ? src[col] * kLog2e : INFINITY;
    }
  };
  auto load_student_cols = [&](int n, int st) {
    load_tile<C::kPs>(sCt(st) + C::kTBytes, cs, ws, n * kTile, a.S, a.ds, a.ks);
  };
  int c0, c1;
  column_tiles<kKeyRows>(a, blk.tile, c0, c1);
  load_teacher_cols(c0, 0, 0);
  load_student_cols(c0, 0);
  cp_async_commit();

  // Query rows: this thread's two rows' log-sum-exps (+inf past S: p = 0 there).
  float row_lse_t[2], row_lse_s[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int i = row0 + frag_row(2 * h);
    row_lse_t[h] = !kKeyRows && i < a.S ? lse_t[i] * kLog2e : INFINITY;
    row_lse_s[h] = !kKeyRows && i < a.S ? lse_s[i] * kLog2e : INFINITY;
  }
  // ldmatrix lane address of the B operand from [k][n] storage (.trans): the student's column
  // tile as K_s (query rows) or Q_s (key rows).
  const uint32_t bt_lane = ((lane % 8 + ((lane / 8) % 2) * 8) * C::kPs + (lane / 16) * 8) * 2;

  float acc[C::kDs / 8][4];
#pragma unroll
  for (int dn = 0; dn < C::kDs / 8; ++dn) acc[dn][0] = acc[dn][1] = acc[dn][2] = acc[dn][3] = 0.0f;
  for (int n = c0; n < c1; ++n) {
    const int st = (n - c0) % C::kStages, lb = (n - c0) % 2;
    cp_async_wait<0>();
    __syncthreads();  // tile n has landed; every warp is done with the buffers refilled next
    if constexpr (C::kStages == 2) {
      if (n + 1 < c1) {
        load_teacher_cols(n + 1, st ^ 1, lb ^ 1);
        load_student_cols(n + 1, st ^ 1);
        cp_async_commit();
      }
    }
    float s_t[8][4], s_s[8][4];
    tile_scores<E, C::kDt, C::kPt>(s_t, sRt, sCt(st), a.kt);
    tile_scores<E, C::kDs, C::kPs>(s_s, sRs, sCt(st) + C::kTBytes, a.ks);
    if constexpr (C::kStages == 1) {
      if (n + 1 < c1) {
        __syncthreads();
        load_teacher_cols(n + 1, 0, lb ^ 1);
        cp_async_commit();
      }
    }
    // dS / (g scale_s) = p_s - p_t into s_s; 0 where the pair is masked.
    const bool masked = step_masked(a, blk.tile, n);
    const float* cl = lse_cols + lb * 2 * kTile;
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        const int col = frag_col(j, x);
        const float l_t = kKeyRows ? cl[col] : row_lse_t[x / 2];
        const float l_s = kKeyRows ? cl[kTile + col] : row_lse_s[x / 2];
        const float d =
            ex2_ftz(fmaf(s_s[j][x], a.mul_s, -l_s)) - ex2_ftz(fmaf(s_t[j][x], a.mul_t, -l_t));
        const bool seen = !masked || pair_seen<kKeyRows>(a, row0 + frag_row(x), n * kTile + col);
        s_s[j][x] = seen ? d : 0.0f;
      }
    // acc += dS [16 rows x 64 columns] times the student's column tile [64][ds].
    const uint32_t sB = sCt(st) + C::kTBytes + bt_lane;
#pragma unroll
    for (int kk = 0; kk < kTile / 16; ++kk) {
      uint32_t fa[4];
      a_fragment<E>(fa, s_s, kk);
#pragma unroll
      for (int dn2 = 0; dn2 < C::kDs / 16; ++dn2) {
        if (dn2 >= a.ks) break;
        uint32_t fb[4];
        ldsm_x4_t(fb, sB + (kk * 16 * C::kPs + dn2 * 16) * 2);
        E::mma(acc[2 * dn2], fa, fb[0], fb[1]);
        E::mma(acc[2 * dn2 + 1], fa, fb[2], fb[3]);
      }
    }
    if constexpr (C::kStages == 1) {
      if (n + 1 < c1) {
        __syncthreads();
        load_student_cols(n + 1, 0);
        cp_async_commit();
      }
    }
  }

  // The gradient rows: acc times d loss / d kl_i (*dout / (B R S)) times scale_s.
  const float g = *a.dout * a.grad_mul;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int x = row0 + warp * 16 + lane / 4 + 8 * h;
    if (x >= a.S) continue;
    uint16_t* dst = a.grad + (static_cast<int64_t>(blk.b) * a.S + x) * ws +
                    static_cast<int64_t>(blk.r) * a.ds + (lane % 4) * 2;
#pragma unroll
    for (int dn = 0; dn < C::kDs / 8; ++dn) {
      if (dn * 8 >= a.ds) break;
      *reinterpret_cast<uint32_t*>(dst + dn * 8) =
          E::pack(acc[dn][2 * h] * g, acc[dn][2 * h + 1] * g);
    }
  }
}

// Calls f.template operator()<C>() with C the build of the smallest buckets that hold the
// padded dims (at most 256 each). At a student bucket of 256 the backward holds 128 fp32
// accumulators a thread and takes about 246 registers, without spills (sm_90a, CUDA 13).
template <class F>
void with_cfg(int dt16, int ds16, F&& f) {
  auto student = [&]<int kDt>() {
    if (ds16 <= 64) {
      f.template operator()<Cfg<kDt, 64>>();
    } else if (ds16 <= 128) {
      f.template operator()<Cfg<kDt, 128>>();
    } else {
      f.template operator()<Cfg<kDt, 256>>();
    }
  };
  if (dt16 <= 64) {
    student.template operator()<64>();
  } else if (dt16 <= 128) {
    student.template operator()<128>();
  } else {
    student.template operator()<256>();
  }
}

// The kernel's shared-memory limit is raised once per build (so that a graph capture sees no
// attribute calls).
template <auto kKernel, size_t kSmem>
void launch(const Args& a, const char* what) {
  static const bool raised = [] {
    LLMK_CUDA_CHECK(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(kSmem)));
    return true;
  }();
  (void)raised;
  const unsigned blocks = static_cast<unsigned>(static_cast<int64_t>(a.tiles) * a.BR);
  kKernel<<<blocks, kThreads, kSmem, current_stream()>>>(a);
  check_launch(what);
}

template <class T>
Args args_of(const T* tq, const T* tk, const T* sq, const T* sk, const AttentionTransferParams& p) {
  Args a = {};
  a.tq = reinterpret_cast<const uint16_t*>(tq);
  a.tk = reinterpret_cast<const uint16_t*>(tk);
  a.sq = reinterpret_cast<const uint16_t*>(sq);
  a.sk = reinterpret_cast<const uint16_t*>(sk);
  a.S = static_cast<int>(p.S);
  a.R = static_cast<int>(p.R);
  a.BR = static_cast<int>(p.B * p.R);
  a.tiles = static_cast<int>(ceil_div(p.S, kTile));
  a.dt = static_cast<int>(p.dt);
  a.ds = static_cast<int>(p.ds);
  a.kt = static_cast<int>(ceil_div(p.dt, 16));
  a.ks = static_cast<int>(ceil_div(p.ds, 16));
  a.mul_t = static_cast<float>(p.scale_t() * 1.4426950408889634);
  a.mul_s = static_cast<float>(p.scale_s() * 1.4426950408889634);
  a.grad_mul = static_cast<float>(p.scale_s() / static_cast<double>(p.rows()));
  a.causal = p.causal;
  return a;
}

}  // namespace

template <class T>
void attention_transfer_fwd(float* kl, float* lse_t, float* lse_s, const T* tq, const T* tk,
                            const T* sq, const T* sk, const AttentionTransferParams& p) {
  if (p.rows() == 0) return;
  Args a = args_of(tq, tk, sq, sk, p);
  a.kl = kl;
  a.lse_t_out = lse_t;
  a.lse_s_out = lse_s;
  with_cfg(a.kt * 16, a.ks * 16, [&]<class C>() {
    launch<fwd_kernel<T, C>, C::kSmemBytes>(a, "attention transfer forward");
  });
}

template <class T>
void attention_transfer_bwd(T* dq, T* dk, const T* tq, const T* tk, const T* sq, const T* sk,
                            const float* lse_t, const float* lse_s, const float* dout,
                            const AttentionTransferParams& p) {
  if (p.rows() == 0) return;
  Args a = args_of(tq, tk, sq, sk, p);
  a.lse_t = lse_t;
  a.lse_s = lse_s;
  a.dout = dout;
  with_cfg(a.kt * 16, a.ks * 16, [&]<class C>() {
    if (dq) {
      a.grad = reinterpret_cast<uint16_t*>(dq);
      launch<bwd_kernel<T, C, false>, C::kSmemBytes>(a, "attention transfer backward (dq)");
    }
    if (dk) {
      a.grad = reinterpret_cast<uint16_t*>(dk);
      launch<bwd_kernel<T, C, true>, C::kSmemBytes>(a, "attention transfer backward (dk)");
    }
  });
}

template void attention_transfer_fwd<__nv_bfloat16>(float*, float*, float*, const __nv_bfloat16*,
                                                    const __nv_bfloat16*, const __nv_bfloat16*,
                                                    const __nv_bfloat16*,
                                                    const AttentionTransferParams&);
template void attention_transfer_fwd<__half>(float*, float*, float*, const __half*, const __half*,
                                             const __half*, const __half*,
                                             const AttentionTransferParams&);
template void attention_transfer_bwd<__nv_bfloat16>(__nv_bfloat16*, __nv_bfloat16*,
                                                    const __nv_bfloat16*, const __nv_bfloat16*,
                                                    const __nv_bfloat16*, const __nv_bfloat16*,
                                                    const float*, const float*, const float*,
                                                    const AttentionTransferParams&);
template void attention_transfer_bwd<__half>(__half*, __half*, const __half*, const __half*,
                                             const __half*, const __half*, const float*,
                                             const float*, const float*,
                                             const AttentionTransferParams&);

}  // namespace llmk::cuda::grad
