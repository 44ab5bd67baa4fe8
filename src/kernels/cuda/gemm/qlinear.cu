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
// qdequant (the bands of rows above 16, the embeddings): a thread a chunk, each weight
// s (128 + q) + b in fp32, rounded once to bf16; a group's four threads stage their run of
// weights in shared memory and store it in whole sectors.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/cuda/check.h"
#include "kernels/cuda/attention/tiles.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm/pair_epilogue.cuh"
#include "kernels/cuda/gemm/qdecode.cuh"
#include "kernels/cuda/gemm/qlinear.h"
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
inline constexpr int kQStep = T == DType::Q6_K ? 4 * 192 : 32 * 16;
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
        if constexpr (T == DType::Q4_K) {
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
    if constexpr (T == DType::Q5_0) {
      // This chunk's fifth bits only: the group's later chunks may lie past the row (and, in
      // the last row, past the tensor).
      bits.qh[i] = u16_at(m + 6 * i + 2) | u16_at(m + 6 * i + 4) << 16;
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

template <DType T, typename TOut, typename TBias, int kTiles, bool kOne = false, class Act = void>
void launch_tiles(const QLinearArgs& a) {
  auto* kernel = qgemv_kernel<T, TOut, TBias, kTiles, kOne, Act>;
  constexpr size_t kSmem = Ring<T>::kSmemBytes;
  static const bool raised = [&] {
    LLMK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(kSmem)));
    return true;
  }();
  (void)raised;
  const int64_t blocks = std::is_void_v<Act> ? ceil_div(a.N, 16) : ceil_div(a.N / 2, 8);
  launch_dependent(kernel, dim3(static_cast<unsigned>(blocks)), dim3(kQThreads), kSmem,
                   kernel_args(a));
}

template <DType T, typename TOut, typename TBias>
void launch_q(const QLinearArgs& a) {
  if constexpr (std::is_same_v<TOut, __nv_bfloat16> && std::is_same_v<TBias, __nv_bfloat16>) {
    if (a.rope) {
      launch_tiles<T, TOut, TBias, 1, true, RopeQkv>(a);
      check_launch("cuda::qgemv");
      return;
    }
    if (a.gated) {
      if (a.act == Activation::SiLU) {
        launch_tiles<T, TOut, TBias, 1, true, SiluMul>(a);
      } else {
        launch_tiles<T, TOut, TBias, 1, true, GeluTanhMul>(a);
      }
      check_launch("cuda::qgemv");
      return;
    }
  }
  if (a.M == 1) {
    launch_tiles<T, TOut, TBias, 1, true>(a);
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
