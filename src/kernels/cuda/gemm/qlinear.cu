// Quantised linear layers: see qlinear.h; the weights' layout is kernels/quant_layout.h's.
//
// qgemv: a block of 8 warps owns 16 output rows; warp w takes every 8th group of 4 chunks of the
// rows' quantised bytes (a chunk: 16 bytes of values, 32 weights of the 4-, 5- and 6-bit types, 16
// of Q8_0). Each warp streams its groups through a ring of kStages slots in shared memory:
// cp.async copies a group's values (lane (g, t) = (lane / 4, lane % 4) chunk t's 16-byte vectors
// of rows g and g + 8) and the 16 rows' meta spans (4-byte words, 8 a row) while the warp
// computes the group kStages - 1 before it. The computing lanes read the slot across: lane (g, t)
// word t of each of the 4 chunks (see Quad), so that each k-step of mma.sync m16n8k16 (16 weights
// a row: 4 lanes x 4) lies in one chunk and so under one scale. A word's nibbles (plus high bits)
// go into the mantissas of 128.0 in bf16 pairs (the layout's words hold bytes 0, 2, 1, 3 of the
// file's, so a pair is a shift, a mask and an or),
// less the type's offset (q - 8 for Q4_0; Q8_0's bytes in two parts): the weights' integers,
// exact, as the A fragments; x is the B operand (lane (g, t) loads token g's four values of the
// step from x, 8 bytes; above 8 rows token g + 8's too, for a second product; rows past M read as
// zeros). Each scale group's products start from zero and are scaled in fp32 into the
// accumulators (acc += s C, + b X for the types with a minimum, X the sum of x by an mma with A
// all ones): the products are over the file's weights, as on the CPU. The 8 warps' sums meet in
// shared memory and warp 0 writes the 16 x M outputs (+ bias, + out when accumulating).
//
// qgemv1 (one token over Q4_0, Q4_1 and Q8_0): each block of a warp's window sums into an mma
// column of its own; its section below says how.
//
// qdequant (the bands of rows above 16, the embeddings): a thread a chunk, each weight
// s (128 + q) + b in fp32, rounded once to bf16; a group's four threads stage their run of
// weights in shared memory and store it in whole sectors.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "core/cuda/check.h"
#include "kernels/cuda/attention/tiles.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm/pair_epilogue.cuh"
#include "kernels/cuda/gemm/qdecode.cuh"
#include "kernels/cuda/gemm/qlinear.h"
#include "kernels/cuda/hopper.cuh"
#include "kernels/quant_layout.h"

namespace llmk::cuda {

namespace {

using namespace qdec;

constexpr int kQWarps = 8;
constexpr int kQThreads = kQWarps * kWarp;
constexpr int kStages = 4;  // slots of a warp's ring: groups in flight while one is computed
constexpr int kDequantThreads = 256;  // qdequant's block

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
  GemvRope rope;  // Act = RopeQkv
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

// What advances from one of a warp's groups to its next (32 chunks on): bytes of a row's values
// and meta, weights of x.
template <DType T>
inline constexpr int kQStep = T == DType::Q6_K   ? 4 * 192
                              : T == DType::Q5_K ? 4 * 160
                                                 : 32 * 16;
template <DType T>
inline constexpr int kPStep = T == DType::Q8_0 ? 32 * 16 : 32 * 32;

// Where lane (g, t)'s 16-byte vectors of a row go in a slot: 16-byte unit 4g + (t ^ (g / 2)), so
// that the 4-byte reads of a k-step (word t of chunk i in rows g) hit 32 different banks.
__device__ __forceinline__ int quad_unit(int g, int i) { return 4 * g + (i ^ (g >> 1)); }

// kOne: M = 1, whose products are column 0 of the mma's 8: the folds skip the other columns.
// Act (kOne only): void, the plain output; else pair_epilogue.cuh's epilogue, block b taking its
// units 8 b .. 8 b + 7, unit 8 b + g's two rows as the lanes' rows g and g + 8.
template <DType T, typename TOut, typename TBias, int kTiles, bool kOne, class Act = void>
__global__ void __launch_bounds__(kQThreads, 2) qgemv_kernel(const QKernelArgs a) {
  constexpr bool kPaired = !std::is_void_v<Act>;
  static_assert(!kPaired || kOne, "the epilogues are one token's");
  using Q = Quad<T>;
  using R = Ring<T>;
  constexpr int kV = kQVecs<T>, kG = Q::kGroups;
  extern __shared__ __align__(16) unsigned char ring_raw[];
  __shared__ float red[kQWarps - 1][kWarp][4 * kTiles];
  // Each group's s and b for rows g and g + 8, computed by lane t = grp % 4 of the rows' quad and
  // read by all four (a row of kG + 1 float4 a quad: the 8 quads' reads hit different banks).
  __shared__ float4 factors[kQWarps][8][kG + 1];
  const int warp = static_cast<int>(threadIdx.x) / kWarp,
            lane = static_cast<int>(threadIdx.x) % kWarp;
  const int g = lane / 4, t = lane % 4;
  const int row0 = static_cast<int>(blockIdx.x) * 16 + g, row1 = row0 + 8;
  const int unit = static_cast<int>(blockIdx.x) * 8 + g;  // kPaired
  PairRows pair;
  if constexpr (kPaired) pair = pair_rows<Act>(unit, a.N, a.rope);
  // The rows' weights (past N, or a unit past the last: row N - 1 or 0 re-read, unused).
  const int64_t rr[2] = {kPaired ? (pair.live ? pair.rows[0] : 0) : min(row0, a.N - 1),
                         kPaired ? (pair.live ? pair.rows[1] : 0) : min(row1, a.N - 1)};
  const int groups = (a.chunks + 3) / 4;
  const int mine = warp < groups ? (groups - warp + kQWarps - 1) / kQWarps : 0;
  // The warp's first group (chunks c0 .. c0 + 3; this lane copies chunk c), and what every later
  // one adds: the chunks' place in their super-block, which the decode reads, is the same in all.
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
  const uint16_t* xg[kTiles];  // tokens g and g + 8, at this lane's first position (chunk c0)
  bool has_token[kTiles];
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
    xg[j] = a.x + static_cast<int64_t>(8 * j + g) * a.ldx + chunk_elems(T) * c0 + 4 * t;
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
  // Slot layout: values [row r][vector v][quad_unit] x 16 bytes, then meta [row 0..15][8 words];
  // rows g and g + 8 of the meta: lane t copies words 2t and 2t + 1.
  const uint32_t lane_q = ring_s + quad_unit(g, t) * 16;
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
        if constexpr (kKMeta<T>) {
          // A super-block's 16 aligned bytes, inside the tensor: one copy a row (lanes t = 0, 1).
          if (t == r) {
            attn::cp_async_16_at(row_m + slot + r * 8 * kMetaWords * 4, mn[r] - 8 * t, true);
          }
        } else {
#pragma unroll
          for (int w = 0; w < 2; ++w) {
            const int left = mleft[r] - 4 * w;
            attn::cp_async_4_n(lane_m + slot + (r * 8 * kMetaWords + w) * 4,
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
  int lane_word[4];  // word t of chunk i, rows g: its offset in a slot's values
#pragma unroll
  for (int i = 0; i < 4; ++i) lane_word[i] = quad_unit(g, i) * 16 + 4 * t;
  const unsigned char* slot_meta[2] = {ring + R::kQBytes + g * kMetaWords * 4 + moff[0],
                                       ring + R::kQBytes + (8 + g) * kMetaWords * 4 + moff[1]};
  const uint32_t kOnes[4] = {0x3F803F80u, 0x3F803F80u, 0x3F803F80u, 0x3F803F80u};  // bf16 1.0
  for (int k = 0; k < mine; ++k) {
    __syncwarp();  // every lane is done with slot (k - 1) % kStages, which this issue refills
    issue();
    cp_async_wait<kStages - 1>();
    __syncwarp();  // the values and meta words the other lanes copied
    const unsigned char* slot = ring + (k % kStages) * R::kSlotBytes;
    const int live = min(4, a.chunks - (c0 + 32 * k));  // chunks of the group inside the row
    uint32_t wv[2][4], qh[2][4];
    typename Q::Row row[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        wv[r][i] = *reinterpret_cast<const uint32_t*>(slot + r * kV * kWarp * 16 + lane_word[i]);
        qh[r][i] = kV > 1 ? *reinterpret_cast<const uint32_t*>(slot + (r * kV + 1) * kWarp * 16 +
                                                               lane_word[i])
                          : 0;
      }
      Q::row_bits(slot_meta[r] + (k % kStages) * R::kSlotBytes, row[r]);
    }
#pragma unroll
    for (int grp = t; grp < kG; grp += 4) {
      const int at = (k % kStages) * R::kSlotBytes;
      const float2 f0 = Q::factor(slot_meta[0] + at, c0, grp),
                   f1 = Q::factor(slot_meta[1] + at, c0, grp);
      factors[warp][g][grp] = make_float4(f0.x, f0.y, f1.x, f1.y);
    }
    __syncwarp();
    // The group's chunks all inside the row (every group but a row's last, when the chunks a row
    // are not a multiple of 4): no checks; else a check a step and a group, the same in every
    // lane.
    const auto groups_of = [&](auto full) {
#pragma unroll
      for (int grp = 0; grp < kG; ++grp) {
        // A group lies in whole chunks: live when its first is.
        if (!decltype(full)::value && Q::chunk(grp, 0) >= live) continue;
        float C[kTiles][4] = {}, X[kTiles][4] = {};
        (void)X;  // kSums only
#pragma unroll
        for (int n = 0; n < Q::kGroupSteps; ++n) {
          const int i = Q::chunk(grp, n), hi = Q::high(grp, n);
          if (!decltype(full)::value && i >= live) continue;
          uint32_t A[Q::kParts][4];
#pragma unroll
          for (int part = 0; part < Q::kParts; ++part) {
            uint32_t r0[2], r1[2];
            Q::step(wv[0][i], qh[0][i], row[0], i, hi, t, part, r0);
            Q::step(wv[1][i], qh[1][i], row[1], i, hi, t, part, r1);
            A[part][0] = r0[0];
            A[part][1] = r1[0];
            A[part][2] = r0[1];
            A[part][3] = r1[1];
          }
#pragma unroll
          for (int j = 0; j < kTiles; ++j) {
            uint2 b = make_uint2(0, 0);
            if (has_token[j]) b = __ldg(reinterpret_cast<const uint2*>(xg[j] + Q::xoff(i, hi)));
#pragma unroll
            for (int part = 0; part < Q::kParts; ++part)
              attn::mma_bf16_16816(C[j], A[part], b.x, b.y);
            if constexpr (Q::kSums) attn::mma_bf16_16816(X[j], kOnes, b.x, b.y);
          }
        }
        // acc[j]: rows g (0, 1) and g + 8 (2, 3); kOne: columns 2t only (t = 0: token 0).
        const float4 f = factors[warp][g][grp];
        const float fs[2] = {f.x, f.z}, fb[2] = {f.y, f.w};
        (void)fb;  // kSums only
#pragma unroll
        for (int j = 0; j < kTiles; ++j)
#pragma unroll
          for (int e = 0; e < 4; e += kOne ? 2 : 1) {
            float v = fmaf(fs[e / 2], C[j][e], acc[j][e]);
            if constexpr (Q::kSums) v = fmaf(fb[e / 2], X[j][e], v);
            acc[j][e] = v;
          }
      }
    };
    if (live == 4) {
      groups_of(std::true_type{});
    } else {
      groups_of(std::false_type{});
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
  if constexpr (kPaired) {
    if (t == 0 && pair.live) pair_store<Act>(out, {acc[0][0], acc[0][2]}, pair, unit, bias, a.rope);
  } else {
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
}

// ---- qgemv1: one token (M = 1) over Q4_0, Q4_1 and Q8_0, each block's sum in a column ----
//
// With one token, seven of an mma's eight B columns would multiply zeros. qgemv1 gives them work:
// a warp's window is 4 kV chunks of its 16 rows (lane (g, t) holds chunk t (+ 4 v) of rows g and
// g + 8), and each k-step's B column n carries x only where the step's weights belong to the
// window's block n / 2 (One<T>::act_*: which chunk, vector and nibble half feed column n), zeros
// elsewhere. So after the window's steps C[row][n] holds the block's integer sums, exactly as
// qgemv's per-block products, without zeroing C a block and without one lane a quad decoding the
// scales of all four: lane (g, t) holds columns 2t and 2t + 1, both of its own block, and scales
// only those (acc += s C, + b X for Q4_1's minimum, X the sum of x over the block from an mma
// with A all ones). Lane (g, t) supplies column g's x, so only the lane of each quad whose chunk
// feeds column g copies x (16 values a window); the others read 32 zero bytes. Each warp streams
// its windows (8 apart) through a ring of slots in shared memory by cp.async, as qgemv does: the
// lanes' value vectors ([row][vector][lane], 16 bytes: a lane reads back what it copied), the
// 4-byte-aligned word holding each lane's block scale (and Q4_1's minimum), and x.
// Two sets of sums (steps alternating) halve the chains of dependent mma. The 8 warps' sums meet
// in shared memory in warp order, so a row's sum does not depend on where the block put it (plain
// or paired epilogue). Q5_0, Q4_K and Q6_K stay on qgemv: in qgemv1 their down projections ran
// slower (docs/perf.md); Q5_1 and Q5_K, kept since, were not tried there.
template <DType T>
inline constexpr bool kOneType = T == DType::Q4_0 || T == DType::Q4_1 || T == DType::Q8_0;

template <DType T>
struct One {
  static_assert(kOneType<T>, "qgemv1 is built for Q4_0, Q4_1 and Q8_0");
  // Vectors (chunks) a lane loads a row per window, nibble halves a word.
  static constexpr int kV = T == DType::Q8_0 ? 2 : 1;
  static constexpr int kH = T == DType::Q8_0 ? 1 : 2;
  // Column n's source: the lane column (chunk i of the window's 4), vector v and half hi. A block
  // of 32 puts its two halves side by side (2i + hi); Q8_0 its two chunks (2 (n % 4) .. + 1 of
  // vector n / 4). Either way lane t's columns 2t, 2t + 1 are one block's.
  __device__ static constexpr int act_i(int n) { return kV == 2 ? n % 4 : n / 2; }
  __device__ static constexpr int act_v(int n) { return kV == 2 ? n / 4 : 0; }
  __device__ static constexpr int act_hi(int n) { return kV == 2 ? 0 : n % 2; }
  static constexpr bool kSums = Quad<T>::kSums;
  static constexpr int kMetaBytes = T == DType::Q4_1 ? 4 : 2;  // a block's (d, Q4_1's m)
  static constexpr int kW = 4 * kV;                            // chunks a window
  // A slot (per warp): values [row][vector][lane] 16 bytes, meta [row][lane] 4 bytes, x [g] 32
  // bytes.
  static constexpr int kQBytes = 2 * kV * kWarp * 16;
  static constexpr int kXOff = kQBytes + 2 * kWarp * 4;
  static constexpr int kSlotBytes = kXOff + 8 * 32;
  // Shared memory for kStages windows in flight a warp.
  static constexpr size_t smem(int stages) {
    return static_cast<size_t>(kQWarps) * stages * kSlotBytes + 32;
  }
  // Blocks an SM (registers: 65536 / (256 x this)): four for the 4-bit types (H200,
  // qlinear_bench: Q4_0's down projection 13.3 against 16.4 us at three).
  static constexpr int kBlocks = T == DType::Q8_0 ? 3 : 4;
};

// The aligned word a byte lies in, and the byte's bit offset there.
__device__ __forceinline__ const uint8_t* word_of(const uint8_t* p) {
  return reinterpret_cast<const uint8_t*>(reinterpret_cast<uintptr_t>(p) & ~uintptr_t{3});
}
__device__ __forceinline__ int bits_in_word(const uint8_t* p) {
  return 8 * static_cast<int>(reinterpret_cast<uintptr_t>(p) & 3);
}

template <DType T, typename TOut, typename TBias, class Act, int kStages>
__global__ void __launch_bounds__(kQThreads, One<T>::kBlocks) qgemv1_kernel(const QKernelArgs a) {
  constexpr bool kPaired = !std::is_void_v<Act>;
  using Q = Quad<T>;
  using O = One<T>;
  constexpr int kV = O::kV, kW = O::kW;
  __shared__ float red[kQWarps][8][2];
  extern __shared__ __align__(16) unsigned char one_raw[];  // the warps' rings, then 32 zero bytes
  const int warp = static_cast<int>(threadIdx.x) / kWarp,
            lane = static_cast<int>(threadIdx.x) % kWarp;
  const int g = lane / 4, t = lane % 4;
  const int row0 = static_cast<int>(blockIdx.x) * 16 + g, row1 = row0 + 8;
  const int unit = static_cast<int>(blockIdx.x) * 8 + g;  // kPaired
  PairRows pair;
  if constexpr (kPaired) pair = pair_rows<Act>(unit, a.N, a.rope);
  const int64_t rr[2] = {kPaired ? (pair.live ? pair.rows[0] : 0) : min(row0, a.N - 1),
                         kPaired ? (pair.live ? pair.rows[1] : 0) : min(row1, a.N - 1)};
  const uint8_t* meta_end = a.wm + static_cast<int64_t>(a.N) * a.mrow;
  const int windows = (a.chunks + kW - 1) / kW;
  const int mine = warp < windows ? (windows - warp + kQWarps - 1) / kQWarps : 0;
  // Column g's source; the lane whose chunk it is copies and reads column g's x.
  const int ai = O::act_i(g), av = O::act_v(g), ahi = O::act_hi(g);
  const bool feeds = ai == t;
  const uint32_t ring = smem_addr(one_raw) + warp * kStages * O::kSlotBytes;
  const uint32_t zeros = smem_addr(one_raw) + kQWarps * kStages * O::kSlotBytes;
  if (threadIdx.x < 2) st_shared_v4(zeros + 16 * threadIdx.x, 0, 0, 0, 0);

  // The next window's copies, advanced a window at a time: the warp's windows are kStep chunks
  // apart, so each step adds the same bytes, and the lane's block scale keeps its place in its
  // aligned word (sh).
  constexpr int kStep = kQWarps * kW;
  const int wc0 = warp * kW;                                  // the warp's first window
  const int blk0 = T == DType::Q8_0 ? wc0 / 2 + t : wc0 + t;  // the lane's block in it
  const uint8_t* qn[2];  // the lane's first vector (v = 0) of the next window, a row
  const uint8_t* mn[2];  // the aligned word its block's meta starts in
  int sh[2];             // the meta's bit offset in that word
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const uint8_t* m = a.wm + rr[r] * a.mrow + O::kMetaBytes * blk0;
    qn[r] = a.wq + rr[r] * a.qrow + 16 * (wc0 + t);
    mn[r] = word_of(m);
    sh[r] = bits_in_word(m);
  }
  int cn = wc0 + t;                                   // the lane's chunk (v = 0)
  int mc = T == DType::Q8_0 ? wc0 + 2 * t : wc0 + t;  // the chunk its block starts at
  int wn = 0, xn = 0;                                 // windows issued (values, x)
  int xc = wc0 + ai + 4 * av;                         // the chunk of column g's x
  const uint16_t* xp = a.x + chunk_elems(T) * (xc & ~3) + Q::xoff(xc & 3, ahi);
  // Copies past the row or the tensor read nothing (zero-filled); their pointers go unused.
  const auto issue_w = [&](uint32_t slot) {  // the next window's values and meta
    if (wn >= mine) return;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
#pragma unroll
      for (int v = 0; v < kV; ++v) {
        attn::cp_async_16_at(slot + (r * kV + v) * kWarp * 16 + lane * 16, qn[r] + 64 * v,
                             cn + 4 * v < a.chunks);
      }
      qn[r] += 16 * kStep;
      // The word may end past the tensor (the last row's last block): only its bytes inside.
      const int64_t left = meta_end - mn[r];
      const int n = mc >= a.chunks ? 0 : left >= 4 ? 4 : left > 0 ? static_cast<int>(left) : 0;
      attn::cp_async_4_n(slot + O::kQBytes + (r * kWarp + lane) * 4, mn[r], n);
      mn[r] += O::kMetaBytes * (T == DType::Q8_0 ? kStep / 2 : kStep);
    }
    cn += kStep;
    mc += kStep;
    ++wn;
  };
  const auto issue_x = [&](uint32_t slot) {  // the next window's x of column g, by its feeder
    if (xn >= mine) return;
    if (feeds) {
      const bool live = xc < a.chunks;
      attn::cp_async_16_at(slot + O::kXOff + g * 32, xp, live);
      attn::cp_async_16_at(slot + O::kXOff + g * 32 + 16, xp + 8, live);
    }
    xp += chunk_elems(T) * kStep;
    xc += kStep;
    ++xn;
  };

  float acc[2] = {0.0f, 0.0f};
  const uint32_t kOnes[4] = {0x3F803F80u, 0x3F803F80u, 0x3F803F80u, 0x3F803F80u};  // bf16 1.0
  const auto compute = [&](uint32_t slot) {
    uint4 q[2][kV];
    uint32_t m[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
#pragma unroll
      for (int v = 0; v < kV; ++v) {
        q[r][v] = ld_shared_v4(slot + (r * kV + v) * kWarp * 16 + lane * 16);
      }
      m[r] = ld_shared_u32(slot + O::kQBytes + (r * kWarp + lane) * 4);
    }
    const typename Q::Row bits{};
    float C[2][4] = {}, X[2][4] = {};
#pragma unroll
    for (int v = 0; v < kV; ++v) {
#pragma unroll
      for (int hi = 0; hi < O::kH; ++hi) {
        const uint32_t at = feeds && v == av && hi == ahi ? slot + O::kXOff + g * 32 : zeros;
#pragma unroll
        for (int jw = 0; jw < 4; ++jw) {
          uint32_t A[Q::kParts][4];
#pragma unroll
          for (int part = 0; part < Q::kParts; ++part) {
            uint32_t r0[2], r1[2];
            // Quad's step with word jw as its lane word.
            Q::step(word(q[0][v], jw), 0u, bits, 0, hi, jw, part, r0);
            Q::step(word(q[1][v], jw), 0u, bits, 0, hi, jw, part, r1);
            A[part][0] = r0[0];
            A[part][1] = r1[0];
            A[part][2] = r0[1];
            A[part][3] = r1[1];
          }
          const uint2 b = ld_shared_v2(at + 8 * jw);
          const int set = jw % 2;
#pragma unroll
          for (int part = 0; part < Q::kParts; ++part) {
            attn::mma_bf16_16816(C[set], A[part], b.x, b.y);
          }
          if constexpr (O::kSums) attn::mma_bf16_16816(X[set], kOnes, b.x, b.y);
        }
      }
    }
    // C: (row g, column 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1): the lane's block.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float c = (C[0][2 * r] + C[1][2 * r]) + (C[0][2 * r + 1] + C[1][2 * r + 1]);
      if constexpr (T == DType::Q4_1) {
        const float x = (X[0][2 * r] + X[1][2 * r]) + (X[0][2 * r + 1] + X[1][2 * r + 1]);
        const float d = half_bits(m[r] & 0xFFFFu);  // w = d q + m = d (128 + q) + m - 128 d
        acc[r] = fmaf(fmaf(-128.0f, d, half_bits(m[r] >> 16)), x, fmaf(d, c, acc[r]));
      } else {
        acc[r] = fmaf(half_bits((m[r] >> sh[r]) & 0xFFFFu), c, acc[r]);
      }
    }
  };

  // Windows 0 .. kStages - 2: values and meta now, x once the previous kernel is done (in one
  // commit group each, the first holding every early value copy).
#pragma unroll
  for (int k = 0; k < kStages - 1; ++k) issue_w(ring + k * O::kSlotBytes);
  grid_dependency_wait(a.release_first);
#pragma unroll
  for (int k = 0; k < kStages - 1; ++k) {
    issue_x(ring + k * O::kSlotBytes);
    attn::cp_async_commit();
  }
  __syncthreads();  // the zeros
  // Window k computes from slot k % kStages while window k + kStages - 1 is issued into the slot
  // window k - 1 used.
  uint32_t cslot = ring, islot = ring + (kStages - 1) * O::kSlotBytes;
  const uint32_t ring_end = ring + kStages * O::kSlotBytes;
  for (int k = 0; k < mine; ++k) {
    __syncwarp();  // every lane is done with the slot this issue refills
    issue_w(islot);
    issue_x(islot);
    attn::cp_async_commit();  // empty past the warp's last window: the waits count the same
    cp_async_wait<kStages - 1>();
    compute(cslot);
    cslot = cslot + O::kSlotBytes == ring_end ? ring : cslot + O::kSlotBytes;
    islot = islot + O::kSlotBytes == ring_end ? ring : islot + O::kSlotBytes;
  }
  cp_async_wait<0>();
  // The quad's columns, then the warps in order.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], 1);
    acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], 2);
  }
  if (t == 0) {
    red[warp][g][0] = acc[0];
    red[warp][g][1] = acc[1];
  }
  __syncthreads();
  if (warp != 0 || t != 0) return;
  float sum[2] = {red[0][g][0], red[0][g][1]};
#pragma unroll
  for (int w = 1; w < kQWarps; ++w) {
    sum[0] += red[w][g][0];
    sum[1] += red[w][g][1];
  }
  TOut* out = static_cast<TOut*>(a.out);
  const TBias* bias = static_cast<const TBias*>(a.bias);
  if constexpr (kPaired) {
    if (pair.live) pair_store<Act>(out, sum, pair, unit, bias, a.rope);
  } else {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = r == 0 ? row0 : row1;
      if (row >= a.N) continue;
      float v = sum[r] + (bias ? to_float(bias[row]) : 0.0f);
      if (a.accumulate) v += to_float(out[row]);
      out[row] = from_float<TOut>(v);
    }
  }
}

// dst row r = w's row n0 + r, or (ids set) row ids[r * ids_stride] (zeros for an id outside
// [0, N)): one thread a chunk, qgemv's decode with the thread as the four lanes of a row (word j
// as lane t = j), each weight s v + b in fp32 (v its integer, or 128 + q: Quad), rounded once.
// Threads go four to a group of four chunks (a row's chunks 4 g .. 4 g + 3, past the row's end
// idle), whose weights are one run of 4 chunk_elems in dst: the quad stages the run in shared
// memory and then writes it 16-byte unit u by lane u % 4, so that each store of a warp covers
// whole 32-byte sectors (a thread storing its own chunk's pieces wrote half-sectors, and the L2
// was the limit: 84% busy, DRAM 29%, on Q4_K).
template <DType T>
__global__ void __launch_bounds__(kDequantThreads)
    qdequant_kernel(__nv_bfloat16* dst, int64_t ld, const uint8_t* wq, const uint8_t* wm,
                    int64_t qrow, int64_t mrow, int64_t N, int64_t n0, int64_t rows, int chunks,
                    const int32_t* ids, int64_t ids_stride) {
  using Q = Quad<T>;
  constexpr int kHalves = T == DType::Q8_0 ? 1 : 2;  // low nibbles, high ones
  constexpr int kUnits = chunk_elems(T) / 2;         // 16-byte units of a group's run
  __shared__ uint4 stage[kDequantThreads / 4][kUnits];
  const int groups = (chunks + 3) / 4;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t r = n / (4 * groups);
  const int g4 = 4 * static_cast<int>(n / 4 % groups), i = static_cast<int>(n % 4), c = g4 + i;
  const int64_t src = r >= rows ? -1 : ids != nullptr ? ids[r * ids_stride] : n0 + r;
  const bool inside = src >= 0 && src < N && c < chunks;
  uint4 q = make_uint4(0, 0, 0, 0), qh = make_uint4(0, 0, 0, 0);
  const uint8_t* m = nullptr;
  typename Q::Row bits{};
  if (inside) {
    q = load_stream(qvec_at<T>(wq + src * qrow, c, 0));
    if constexpr (kQVecs < T >> 1) qh = load_stream(qvec_at<T>(wq + src * qrow, c, 1));
    m = wm + src * mrow + meta_start<T>(g4);
    if constexpr (T == DType::Q5_0 || T == DType::Q5_1) {
      // This chunk's fifth bits only: the group's later chunks may lie past the row (and, in
      // the last row, past the tensor).
      bits.qh[i] = Q::chunk_bits(m, i);
    } else {
      Q::row_bits(m, bits);
    }
  }
  uint4* run = stage[threadIdx.x / 4];
#pragma unroll
  for (int hi = 0; hi < kHalves; ++hi) {
    const float2 f = inside ? Q::factor(m, g4, Q::group(i, hi)) : make_float2(0.0f, 0.0f);
    uint32_t out[8];  // weights +2e, +2e + 1
    decode_half<T>(q, qh, bits, f, i, hi, out);
    uint4* at = run + Q::xoff(i, hi) / 8;
    at[0] = make_uint4(out[0], out[1], out[2], out[3]);
    at[1] = make_uint4(out[4], out[5], out[6], out[7]);
  }
  __syncwarp();
  if (r >= rows) return;
  // The run's units inside the row: whole chunks (a row's last group may hold fewer than four).
  const int live = min(4, chunks - g4) * (kUnits / 4);
  uint4* row = reinterpret_cast<uint4*>(dst + r * ld + chunk_elems(T) * g4);
#pragma unroll
  for (int u = i; u < kUnits; u += 4) {
    if (u < live) row[u] = run[u];
  }
}

QKernelArgs kernel_args(const QLinearArgs& a) {
  const qlayout::Regions w = qlayout::regions(a.wtype, a.w, a.N, a.K);
  QKernelArgs k{};
  k.out = a.out;
  k.ldo = a.ldo;
  k.x = static_cast<const uint16_t*>(a.x);
  k.ldx = a.ldx;
  k.qrow = w.qrow;
  k.mrow = w.mrow;
  k.wq = w.q;
  k.wm = w.meta;
  k.bias = a.bias;
  k.M = static_cast<int>(a.M);
  k.N = static_cast<int>(a.N);
  k.chunks = chunks_per_row(a.wtype, a.K);
  k.accumulate = a.accumulate;
  k.release_first = release_dependents_first();
  if (a.rope) k.rope = *a.rope;
  return k;
}

// One of the few-row kernels over 16 output rows a block (a paired epilogue: 8 units), its
// shared memory raised once (a template argument: one `raised` a kernel).
template <auto kernel, class Act>
void launch_rows(size_t smem, const QLinearArgs& a) {
  static const bool raised = [&] {
    LLMK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem)));
    return true;
  }();
  (void)raised;
  const int64_t blocks = std::is_void_v<Act> ? ceil_div(a.N, 16) : ceil_div(a.N / 2, 8);
  launch_dependent(kernel, dim3(static_cast<unsigned>(blocks)), dim3(kQThreads), smem,
                   kernel_args(a));
}

template <DType T, typename TOut, typename TBias, int kTiles, bool kOne = false, class Act = void>
void launch_tiles(const QLinearArgs& a) {
  launch_rows<qgemv_kernel<T, TOut, TBias, kTiles, kOne, Act>, Act>(Ring<T>::kSmemBytes, a);
}

// One token: qgemv1 for Q4_0, Q4_1 and Q8_0, qgemv's one-token build for the others.
// LLMK_QGEMV1=0 runs qgemv's build for every type, for comparison.
template <DType T, typename TOut, typename TBias, class Act = void>
void launch_one(const QLinearArgs& a) {
  static const bool off = [] {
    const char* e = std::getenv("LLMK_QGEMV1");
    return e != nullptr && std::string(e) == "0";
  }();
  if constexpr (kOneType<T>) {
    if (!off) {
      // Four windows in flight a warp; three for Q8_0 rows up to 8,192, whose 60 KB leave room
      // for three blocks an SM where four stages (80 KB) leave two (H200, M = 1: gate/up 18.1
      // against 20.1 us, lm_head 165-168 against 173, but down 23.6 against 18.0).
      if constexpr (T == DType::Q8_0) {
        if (a.K <= 8192) {
          return launch_rows<qgemv1_kernel<T, TOut, TBias, Act, 3>, Act>(One<T>::smem(3), a);
        }
      }
      return launch_rows<qgemv1_kernel<T, TOut, TBias, Act, 4>, Act>(One<T>::smem(4), a);
    }
  }
  launch_tiles<T, TOut, TBias, 1, true, Act>(a);
}

template <DType T, typename TOut, typename TBias>
void launch_q(const QLinearArgs& a) {
  if constexpr (std::is_same_v<TOut, __nv_bfloat16> && std::is_same_v<TBias, __nv_bfloat16>) {
    if (a.rope) {
      launch_one<T, TOut, TBias, RopeQkv>(a);
      check_launch("cuda::qgemv");
      return;
    }
    if (a.gated) {
      if (a.act == Activation::SiLU) {
        launch_one<T, TOut, TBias, SiluMul>(a);
      } else {
        launch_one<T, TOut, TBias, GeluTanhMul>(a);
      }
      check_launch("cuda::qgemv");
      return;
    }
  }
  if (a.M == 1) {
    launch_one<T, TOut, TBias>(a);
  } else if (a.M <= 8) {
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

bool aligned(const void* p, uintptr_t n) { return reinterpret_cast<uintptr_t>(p) % n == 0; }

}  // namespace

bool qgemv_applies(const QLinearArgs& a) {
  const qlayout::Layout l = qlayout::layout(a.wtype);
  return l.block_elems > 0 && a.K > 0 && a.K % l.block_elems == 0 && a.M >= 1 &&
         a.M <= kQGemvMaxRows && a.N >= 1 && a.N < (int64_t{1} << 31) &&
         (a.out_dtype == DType::BF16 || a.out_dtype == DType::F32) &&
         (a.bias == nullptr || a.bias_dtype == DType::BF16 || a.bias_dtype == DType::F32) &&
         aligned(a.x, 16) && (a.M == 1 || a.ldx % 8 == 0) && aligned(a.w, 16) &&
         (!(a.gated || a.rope) ||
          (a.M == 1 && a.out_dtype == DType::BF16 && !a.accumulate &&
           (a.bias == nullptr || a.bias_dtype == DType::BF16) && a.N % 2 == 0)) &&
         (!a.gated || a.act == Activation::SiLU || a.act == Activation::GeluTanh) &&
         (!a.rope || (!a.gated && a.rope->D > 0 && a.rope->D % 2 == 0 &&
                      a.N == int64_t{a.rope->Hq + 2 * a.rope->Hkv} * a.rope->D));
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
  const qlayout::Regions r = qlayout::regions(wtype, w, N, K);
  const int chunks = chunks_per_row(wtype, K);
  const int64_t n = rows * 4 * ((chunks + 3) / 4);  // threads: four a group of four chunks
  for_type(wtype, [&]<DType T>() {
    qdequant_kernel<T><<<static_cast<unsigned>(ceil_div(n, int64_t{kDequantThreads})),
                         kDequantThreads, 0, current_stream()>>>(static_cast<__nv_bfloat16*>(dst),
                                                                 ld, r.q, r.meta, r.qrow, r.mrow, N,
                                                                 n0, rows, chunks, ids, ids_stride);
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
