// Decode attention: up to 8 query tokens per sequence over a long KV cache, contiguous or paged.
// Memory-bound: every K/V row must be read once per KV head, so one block serves 16 query rows
// (query token x query head of one KV group; unused rows are zero) and all of them share each
// loaded tile.
//
// Grid (split, Hkv * groups, B); 128 threads (4 warps). Block (s, hk * groups + grp, b) takes
// the s-th of `split` equal, tile-aligned shares of the keys sequence b's queries see (their
// count is read on the device, so the grid depends only on host-known values and a captured
// launch replays at every position). The share streams through shared memory in kStages-deep
// tiles of 64 keys, loaded by one of two builds (DecodeLoader in attention.h): cp.async 16-byte
// copies by every thread, or the bulk tensor copy engine (TMA: one copy per page, or 64 keys, and
// 64-dim panel, on an mbarrier per stage). Pool rows are looked up in the page table, from a
// copy of the block's page-table entries in shared memory when they fit.
// In a tile warp w takes 16 keys: S = Q K^T and O += P V on the tensor cores (mma.sync
// m16n8k16, bf16 (or fp16) in, fp32 accumulate, P rounded to 16 bits as in the prefill kernel),
// with the warp's own online softmax in registers. At the end the 4 warps merge through shared
// memory. With split > 1 each block writes an unnormalised partial and its (max, sum) to a
// workspace; the last block of a (sequence, KV head, row group) to arrive (an acquire-release
// atomic counter) combines them and resets the counter: one launch, no host sync. 8-bit caches
// (AttentionArgs::kv_format; head dims 64 and 128): cp.async (or at head dim 128 TMA) copies each
// tile's codes and its keys' scales into the stage, and the products run on fp16 tensor cores
// with the codes turned into their operand fragments in registers (e4m3x4_to_f16x2 and the
// helpers below it); the scales are applied per key to S and to P, not to every element. Memory
// traffic: K/V tiles are read with an L2 evict-first policy (read once per launch, they should not
// push out what is reused: the partials, page table, q), the partials are written evict-last. Under
// programmatic dependent launch the next kernel's blocks are released early: at the first tile when
// a block streams 8 tiles or more, else when 3 tiles remain (an earlier release costs short
// launches more than their next launch's early reads gain).
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/cuda/check.h"
#include "core/cuda/device.h"
#include "core/cuda/stream.h"
#include "kernels/cuda/attention/attention.h"
#include "kernels/cuda/attention/launch.h"
#include "kernels/cuda/attention/tiles.cuh"
#include "kernels/cuda/vec.cuh"

namespace llmk::cuda::attn {

namespace {

// kTma: K/V tiles by the bulk tensor copy engine (one copy per page, or per 64 keys, and 64-dim
// panel), landing on an mbarrier per stage, in the 128-byte-swizzle panel layout (a [kBlockN][kD]
// tile is ceil(kD / 64) panels of [kBlockN][64], 16-byte chunk c of row r at chunk c ^ (r % 8);
// where kD is not a multiple of 64, the last panel's columns past kD are the copy engine's zero
// fill of a box that reaches past the row); else cp.async 16-byte copies by every thread into
// rows padded to kD + 8 elements. kD: any multiple of 16 up to 256.
// kFmt: the cache's elements: 0 bf16; 1 E4M3, 2 int8 (kernels/kv_quant.h): a tile lands in 8-bit
// rows with its keys' scales after the K and V rows: by cp.async in rows of kPitch8 bytes and one
// scale per key; by TMA (head dim 128) in one 128-byte-swizzle panel of 128-byte rows, and the
// scales of 4 KV heads per key (a box's inner extent is at least 16 bytes), this head's among
// them.
template <int kD, bool kTma, int kFmt = 0>
struct DecodeConfig {
  static constexpr int kRows = 16;    // query rows per block: one m16n8k16 m-tile
  static constexpr int kBlockN = 64;  // keys per tile: 16 per warp
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * kWarp;
  static constexpr int kKeysPerWarp = kBlockN / kWarps;
  static constexpr int kPitch = kD + 8;  // smem row pitch (elements) of q and cp.async tiles
  static constexpr bool k8 = kFmt != 0;
  static constexpr int kPanels = k8 ? (kD + 127) / 128 : (kD + 63) / 64;  // 128-byte TMA panels
  static constexpr int kStages = kD <= 128 ? 3 : 2;
  static constexpr bool kQRegs = kD <= 128;  // q fragments kept in registers (else ldmatrix)
  // Bytes of an 8-bit staging row: at head dim 128 the lanes' 16-byte fragment loads
  // (the 8-bit products in the main loop) then fall on distinct banks.
  static constexpr int kPitch8 = kD + 16;
  static constexpr size_t kTensorBytes =  // one K or V tile
      k8 ? static_cast<size_t>(kBlockN) * (kTma ? 128 : kPitch8)
         : static_cast<size_t>(kBlockN) * (kTma ? kPanels * 64 : kPitch) * sizeof(bf16);
  static constexpr int kScaleHeads = kTma ? 4 : 1;  // scales per key in the stage
  static constexpr size_t kScaleBytes =             // K's, then V's
      k8 ? 2 * kBlockN * kScaleHeads * sizeof(float) : 0;
  static constexpr size_t kStageBytes = 2 * kTensorBytes + kScaleBytes;
  static constexpr size_t kTileBytes = kStages * kStageBytes;
  // (TMA: 1024 bytes to re-align the dynamic window to the swizzle period.) Tiles, then q (bf16)
  // for the block's rows. The warps' final states reuse the tiles.
  static constexpr size_t kAlign = kTma ? 1024 : 0;
  static constexpr size_t kSmemBytes = kAlign + kTileBytes + sizeof(bf16) * kRows * kPitch;
  // Merge rows [kD accumulators | max | sum | pad]: kD + 8 floats, so that the float2 stores of
  // a half-warp (4 rows x 4 lanes) land on 16 distinct bank pairs. 8-bit: kD + kD / 8, so that
  // the float4 stores of a quarter-warp (2 rows x 4 lanes, swizzled: merge_col) do.
  static constexpr int kMergePitch = k8 ? kD + kD / 8 : kD + 8;
  static constexpr size_t kMergeBytes = sizeof(float) * kWarps * kRows * kMergePitch;
  static_assert(kKeysPerWarp == 16, "one k16 step of P V per warp and tile");
  static_assert(kMergeBytes <= kTileBytes, "merge area must fit in the tiles");
  static_assert(!k8 || !kTma || kD == 128, "8-bit TMA tiles: one 128-byte panel");
  static_assert(kD % 16 == 0 && kD <= 256, "k16 steps of the products; 8 warps' accumulators");
};

// The K and V tensor maps of the TMA loader (unused by the cp.async one): 3-d views of the cache
// [dim, KV head, row] (or [dim, row, KV head] for a head-major cache, DecodePlan::tma_head_outer)
// with boxes of 128 bytes (64 dims; 8-bit: 128) x DecodePlan::tma_box_rows rows. 8-bit: also the
// scales, 3-d views [4 heads, Hkv / 4, row] with boxes of 4 heads x tma_box_rows rows.
struct DecodeMaps {
  CUtensorMap k, v, k_scale, v_scale;
};

// Where sequence b's queries and keys are, read from the device.
struct SeqView {
  int q0 = 0;          // first query row (of T)
  int tq = 0;          // query rows
  int64_t pos0 = 0;    // position of the first query; query i sits at pos0 + i
  int64_t key0 = 0;    // contiguous cache: row of key 0
  int64_t n_keys = 0;  // keys 0 .. n_keys - 1 exist (capped by the capacity)
};

__device__ __forceinline__ SeqView seq_view(const AttentionArgs& a, int b, int64_t capacity) {
  SeqView s;
  if (a.cu_q != nullptr) {
    // positions[b] is loaded together with cu_q (one query per sequence puts sequence b's first
    // row at b) and used when cu_q confirms it: one dependent load fewer.
    const int guess = a.cu_k == nullptr ? a.positions[b < a.T ? b : a.T - 1] : 0;
    s.q0 = a.cu_q[b];
    s.tq = a.cu_q[b + 1] - s.q0;
    if (a.cu_k != nullptr) {
      const int64_t tk = a.cu_k[b + 1] - a.cu_k[b];
      s.key0 = a.page_table != nullptr ? 0 : a.cu_k[b];
      s.pos0 = tk - s.tq;
    } else if (s.q0 == b) {
      s.pos0 = guess;
    } else {
      s.pos0 = s.tq > 0 ? a.positions[s.q0] : 0;
    }
  } else {
    s.tq = a.T;
    s.pos0 = a.positions[0];
  }
  const int64_t last = s.pos0 + s.tq - 1;  // keys 0..last are visible to the last query
  s.n_keys = last + 1 < capacity ? last + 1 : capacity;
  if (s.n_keys < 0) s.n_keys = 0;
  return s;
}

// Stores with an L2 cache policy (l2_evict_*_policy, tiles.cuh).
__device__ __forceinline__ void store_policy(float* p, float4 v, uint64_t policy) {
  asm volatile("st.global.L2::cache_hint.v4.f32 [%0], {%1, %2, %3, %4}, %5;\n" ::"l"(p), "f"(v.x),
               "f"(v.y), "f"(v.z), "f"(v.w), "l"(policy)
               : "memory");
}
__device__ __forceinline__ void store_policy(float* p, float2 v, uint64_t policy) {
  asm volatile("st.global.L2::cache_hint.v2.f32 [%0], {%1, %2}, %3;\n" ::"l"(p), "f"(v.x), "f"(v.y),
               "l"(policy)
               : "memory");
}
// Adds 1 to *counter at device scope with acquire-release order and returns the old value: the
// caller's earlier writes (and, through a preceding __syncthreads, its block's) are visible to
// whoever reads the incremented value, and the writes that value's earlier adders released are
// visible to the caller. Cheaper than __threadfence (a sequentially consistent fence) + atomicAdd.
__device__ __forceinline__ int atomic_add_acq_rel(int* counter) {
  int old;
  asm volatile("atom.add.acq_rel.gpu.s32 %0, [%1], 1;\n" : "=r"(old) : "l"(counter) : "memory");
  return old;
}

// ---- 8-bit caches: codes straight into the operands of fp16 m16n8k16 products. Every E4M3 and
// int8 value is an fp16 value, so the operands are exact and unscaled; a key's scale multiplies
// its logit (K) and its probability (V) instead. With g = lane / 4 and t = lane % 4:
// - S = Q K^T sums over dims in any order, so lane t's k16 step kk takes dims t kD/4 + 4 kk
//   + {0, 1} (fragment k 2t, 2t + 1) and + {2, 3} (k 2t + 8, 2t + 9): one 32-bit word of a key's
//   codes per step, the lane's kD/4 bytes of a row read as whole 16-byte vectors. The q fragments
//   follow the same order.
// - O += P V: n-block nb's column g is dim (kD/8) g + nb, so a lane reads bytes [(kD/8) g,
//   (kD/8)(g + 1)) of keys 2t, 2t + 1, 2t + 8, 2t + 9 and pairs them up byte by byte (the k
//   order of the fragment); its accumulator column 2t + c then holds dims (kD/8)(2t + c) + nb.
// E4M3 pairs go through the hardware conversion (cvt.rn.f16x2.e4m3x2); int8 ones by the
// magic-number trick: the code offset by 128 (c ^ 0x80) as the low byte of 0x64xx is the fp16
// 1024 + 128 + c, less 1152.
// Codes 0, 1 and 2, 3 of a word as two fp16 pairs (the halves of w taken as they are: no shift).
__device__ __forceinline__ void e4m3x4_to_f16x2(uint32_t w, uint32_t& lo, uint32_t& hi) {
  asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n"
      " cvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(w));
}
// Bytes sel's nibbles pick from `flipped` (codes ^ 0x80) as the low bytes of an int8 fp16 pair.
__device__ __forceinline__ uint32_t i8x2_to_f16x2(uint32_t flipped, uint32_t sel) {
  const uint32_t magic = __byte_perm(flipped, 0x64646464u, sel);
  __half2 h = *reinterpret_cast<const __half2*>(&magic);
  h = __hsub2(h, __halves2half2(__ushort_as_half(0x6480), __ushort_as_half(0x6480)));  // 1152
  return *reinterpret_cast<const uint32_t*>(&h);
}
// A key's 4 consecutive codes (word w) as the K fragment's b0 (codes 0, 1) and b1 (2, 3).
template <int kFmt>
__device__ __forceinline__ void k_frags(uint32_t w, uint32_t& b0, uint32_t& b1) {
  if constexpr (kFmt == 1) {
    e4m3x4_to_f16x2(w, b0, b1);
  } else {
    const uint32_t f = w ^ 0x80808080u;
    b0 = i8x2_to_f16x2(f, 0x4140);
    b1 = i8x2_to_f16x2(f, 0x4342);
  }
}
// Words a and b (the same 4 dims of two keys) as 4 pairs: out[i] = (a's code i, b's code i).
template <int kFmt>
__device__ __forceinline__ void v_frags(uint32_t a, uint32_t b, uint32_t (&out)[4]) {
  const uint32_t lo = __byte_perm(a, b, 0x5140), hi = __byte_perm(a, b, 0x7362);
  if constexpr (kFmt == 1) {
    e4m3x4_to_f16x2(lo, out[0], out[1]);
    e4m3x4_to_f16x2(hi, out[2], out[3]);
  } else {
    out[0] = i8x2_to_f16x2(lo ^ 0x80808080u, 0x4140);
    out[1] = i8x2_to_f16x2(lo ^ 0x80808080u, 0x4342);
    out[2] = i8x2_to_f16x2(hi ^ 0x80808080u, 0x4140);
    out[3] = i8x2_to_f16x2(hi ^ 0x80808080u, 0x4342);
  }
}
// 4 32-bit words from shared memory at p (16-byte aligned) in one load.
__device__ __forceinline__ void load_words16(const unsigned char* p, uint32_t* w) {
  const uint4 x = *reinterpret_cast<const uint4*>(p);
  w[0] = x.x, w[1] = x.y, w[2] = x.z, w[3] = x.w;
}
// N 32-bit words from shared memory at p (aligned to 4 N bytes) in 8- or 16-byte loads.
template <int N>
__device__ __forceinline__ void load_words(const unsigned char* p, uint32_t (&w)[N]) {
  static_assert(N % 2 == 0, "whole 8-byte loads");
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (int i = 0; i < N; i += 4) load_words16(p + 4 * i, w + i);
  } else {
#pragma unroll
    for (int i = 0; i < N; i += 2) {
      const uint2 x = *reinterpret_cast<const uint2*>(p + 4 * i);
      w[i] = x.x, w[i + 1] = x.y;
    }
  }
}

// T: the element type of q, the cache (kFmt 0) and out: bf16 or fp16.
template <int kD, bool kTma, int kFmt = 0, class T = bf16>
__global__ void __launch_bounds__(DecodeConfig<kD, kTma, kFmt>::kThreads)
    decode_kernel(const AttentionArgs a, const DecodePlan plan,
                  const __grid_constant__ DecodeMaps maps) {
  using C = DecodeConfig<kD, kTma, kFmt>;
  constexpr int kBN = C::kBlockN, kP = C::kPitch, kThreads = C::kThreads, kS = C::kStages;
  constexpr int kR = C::kRows, kNB = kD / 8;  // n-blocks of 8 dims in the accumulator
  extern __shared__ __align__(16) unsigned char smem_raw[];
  // TMA: the window re-aligned to the 1024-byte swizzle period (C::kAlign spare bytes).
  unsigned char* smem = smem_raw;
  if constexpr (C::kAlign > 0) smem += (C::kAlign - smem_addr(smem_raw) % C::kAlign) % C::kAlign;
  T* tiles = reinterpret_cast<T*>(smem);               // [kS][K|V][tile]
  T* sQ = reinterpret_cast<T*>(smem + C::kTileBytes);  // [kR][kP]
  const uint32_t tiles_at = smem_addr(tiles);
  __shared__ __align__(8) uint64_t full[kTma ? kS : 1];  // TMA: stage landed (one per stage)

  // Launched with programmatic stream serialisation (launch_decode): the block may start while
  // the previous kernel in the stream is still finishing, so it waits for that kernel's results
  // (q, the appended K/V, positions, this workspace) before reading or writing global memory;
  // with decode_early_reads, after reading the indices and issuing the first tiles when all
  // their keys precede the sequence's first query (see attention.h).
  const bool early = a.decode_early_reads;
  if (!early) grid_dependency_wait_holding();

  const int G = a.Hq / a.Hkv;
  const int split = blockIdx.x, n_split = plan.split;
  const int hk = blockIdx.y / plan.groups, grp = blockIdx.y % plan.groups;
  const int b = blockIdx.z;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const bool paged = a.page_table != nullptr;
  const int64_t capacity = paged ? static_cast<int64_t>(a.pages_per_seq) * a.page_size : a.L;

  const SeqView sv = seq_view(a, b, capacity);
  const int row0 = grp * kR;  // first row of this block: row r is query r / G, head r % G
  const int n_rows = min(kR, sv.tq * G - row0);
  if (n_rows <= 0) return;  // every block of this (sequence, head, group) returns here

  // Keys any of the block's queries sees: [lo, hi]; this block takes a tile-aligned share. Tiles
  // start at a multiple of 64 keys (lo_tiles): for the TMA loader, so that a tile's pages are
  // whole boxes; for both, so that a key's tile and warp, and with them a query row's sums, do
  // not depend on which other queries share the block (ops::BatchInvariance). The keys before
  // lo are masked (and their V rows zeroed, below).
  const int64_t first_pos = sv.pos0 + row0 / G;
  const int64_t lo = a.window > 0 && first_pos - a.window + 1 > 0 ? first_pos - a.window + 1 : 0;
  const int64_t lo_tiles = lo / kBN * kBN;
  const int64_t hi = sv.n_keys - 1;
  const int64_t n_keys = hi >= lo_tiles ? hi - lo_tiles + 1 : 0;
  const int64_t chunk = ceil_div(ceil_div(n_keys, n_split), kBN) * kBN;
  const int64_t my_lo = lo_tiles + split * chunk;
  const int64_t my_hi = my_lo + chunk - 1 < hi ? my_lo + chunk - 1 : hi;
  const int n_tiles = my_hi >= my_lo ? static_cast<int>(ceil_div(my_hi - my_lo + 1, kBN)) : 0;

  const uint64_t kv_policy = l2_evict_first_policy();
  const int32_t* pages = paged ? a.page_table + static_cast<int64_t>(b) * a.pages_per_seq : nullptr;
  // The block's page-table entries, copied to shared memory once (when they fit) so that the
  // main loop's lookups do not wait on global loads.
  constexpr int kPageCache = 256;
  __shared__ int32_t page_cache[kPageCache];
  const int pc_lo = paged ? static_cast<int>(my_lo / a.page_size) : 0;
  const int pc_n = paged && n_tiles > 0 ? static_cast<int>(my_hi / a.page_size) - pc_lo + 1 : 0;
  const bool pc = paged && pc_n <= kPageCache;
  auto fill_page_cache = [&] {  // visible to the lookups after the loop's first barrier
    for (int i = threadIdx.x; i < pc_n; i += kThreads) page_cache[i] = pages[pc_lo + i];
  };
  // Pool row of key j (< capacity), from the page cache or the page table; pages of a power of
  // two keys by shifts (no integer division in the loop).
  const int page_shift =
      paged && (a.page_size & (a.page_size - 1)) == 0 ? __ffs(a.page_size) - 1 : -1;
  auto pool_row = [&](int64_t j, bool cached) -> int64_t {
    if (!paged) return sv.key0 + j;
    const int j32 = static_cast<int>(j);  // < capacity <= INT32_MAX
    const int pi = page_shift >= 0 ? j32 >> page_shift : j32 / a.page_size;
    const int off = page_shift >= 0 ? j32 & (a.page_size - 1) : j32 % a.page_size;
    const int page = cached ? page_cache[pi - pc_lo] : pages[pi];
    return static_cast<int64_t>(page) * a.page_size + off;
  };

  // ---- cp.async loader. Chunk c = threadIdx.x + i * kThreads (16 bytes) of a tile is row
  // c / kChunks, column (c % kChunks) * 8, where kChunks is the row's kD / 8 chunks rounded up to a
  // power of two (the lanes of columns past kD copy nothing: at head dim 96 a quarter of them, an
  // idle issue slot, not memory traffic). As kThreads and kWarp are multiples of kChunks, warp w
  // copies rows w * kRowsPW + lane / kChunks + i * kWarps * kRowsPW: 16 distinct rows per tile.
  // Their pool rows are looked up once per tile and warp, lane k % 16 taking the warp's k-th row
  // (k = i * kRowsPW + a), and reach the copying lanes by shuffle. One page-table load per lane
  // instead of one per chunk, and it is issued a tile ahead, so its latency is not in front of
  // every tile's copies.
  constexpr int kElems = C::k8 ? 16 : 8;           // elements per 16-byte chunk
  constexpr int kChunks = pow2_ceil(kD / kElems);  // 16-byte chunk columns per row, padded
  constexpr int kIters = kBN * kChunks / kThreads;
  constexpr int kRowsPW = kWarp / kChunks;  // rows one warp covers per copy round
  static_assert(kThreads % kChunks == 0 && kWarp % kChunks == 0, "whole rows per warp");
  static_assert(kIters * kRowsPW == 16, "each warp copies 16 distinct rows of a tile");
  const int my_key =
      warp * kRowsPW + (lane % 16) % kRowsPW + (lane % 16) / kRowsPW * C::kWarps * kRowsPW;
  const T* k_head = reinterpret_cast<const T*>(a.k) + hk * a.k_h;
  const T* v_head = reinterpret_cast<const T*>(a.v) + hk * a.v_h;
  // Pool row of tile it's key my_key (0 for keys past my_hi, which are not copied).
  auto lookup_row = [&](int it, bool cached) -> int64_t {
    const int64_t j = my_lo + static_cast<int64_t>(it) * kBN + my_key;
    return j > my_hi ? 0 : pool_row(j, cached);
  };
  // Copies keys [n0, n0 + kBN) of tile it into its stage; keys before lo (outside every query's
  // window) or past my_hi are zero-filled.
  // `row` is this lane's lookup_row(it). All lanes of the block call it (shuffles).
  // Keys lo..my_hi relative to my_lo (my_hi - my_lo < the share, an int), for the copies' checks.
  const int lo_rel = lo > my_lo ? static_cast<int>(lo - my_lo) : 0;
  const int hi_rel = static_cast<int>(my_hi - my_lo);
  auto load_tile = [&](int it, int64_t row) {
    const int n0_rel = it * kBN;
    if constexpr (C::k8) {  // 8-bit rows; each lane copies one scale (below)
      unsigned char* st = smem + (it % kS) * C::kStageBytes;
      float* sc = reinterpret_cast<float*>(st + 2 * C::kTensorBytes);
      const int col = (threadIdx.x % kChunks) * 16;
      const bool copies = kChunks * 16 == kD || col < kD;
      const auto* k8 = reinterpret_cast<const unsigned char*>(a.k) + hk * a.k_h;
      const auto* v8 = reinterpret_cast<const unsigned char*>(a.v) + hk * a.v_h;
#pragma unroll
      for (int i = 0; i < kIters; ++i) {
        const int r = (threadIdx.x + i * kThreads) / kChunks;
        const int64_t src = __shfl_sync(0xffffffffu, row, i * kRowsPW + lane / kChunks);
        const bool valid = n0_rel + r >= lo_rel && n0_rel + r <= hi_rel;
        if (copies) {  // (with the L2 evict-first hint these copies faulted: illegal instruction)
          cp_async_16_at(smem_addr(st + r * C::kPitch8 + col), k8 + src * a.k_t + col, valid);
          cp_async_16_at(smem_addr(st + C::kTensorBytes + r * C::kPitch8 + col),
                         v8 + src * a.v_t + col, valid);
        }
      }
      // The scale of this lane's own lookup, key my_key (the warp's 16 keys, twice over): K's
      // from lanes 0-15, V's from lanes 16-31.
      const bool v_half = lane >= 16;
      const bool valid = n0_rel + my_key >= lo_rel && n0_rel + my_key <= hi_rel;
      cp_async_4_at(smem_addr(sc + (v_half ? kBN : 0) + my_key),
                    (v_half ? a.v_scale : a.k_scale) + row * a.Hkv + hk, valid);
      return;
    }
    T* sK = tiles + (it % kS) * 2 * kBN * kP;
    T* sV = sK + kBN * kP;
    const int col = (threadIdx.x % kChunks) * 8;
    const bool copies = kChunks * 8 == kD || col < kD;  // false: a padding column
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      const int r = (threadIdx.x + i * kThreads) / kChunks;
      const int64_t src = __shfl_sync(0xffffffffu, row, i * kRowsPW + lane / kChunks);
      const bool valid = n0_rel + r >= lo_rel && n0_rel + r <= hi_rel;
      if (copies) {
        cp_async_16_policy(sK + r * kP + col, k_head + src * a.k_t + col, valid, kv_policy);
        cp_async_16_policy(sV + r * kP + col, v_head + src * a.v_t + col, valid, kv_policy);
      }
    }
  };

  // ---- TMA loader: a tile is n_box boxes (tma_box_rows keys: one page, or 64 keys of a
  // contiguous cache or of a larger page) x kPanels 64-dim panels x (K, V) copies, spread over
  // the warps (copy j by lane j / kWarps of warp j % kWarps: at most one per thread and tile)
  // so that no warp's own work waits behind all of them; thread 0 arms the stage's barrier with
  // the bytes to expect (a copy that lands first only drives the byte count below zero until
  // then). As with cp.async, each thread's page lookup is made a tile ahead, the first kS at
  // once. Boxes wholly past my_hi are not copied (their rows, like those before lo, get zero V
  // below).
  const int box_rows = plan.tma_box_rows;
  constexpr int kTensors = C::k8 ? 4 : 2;                        // K, V (8-bit: and their scales)
  constexpr int kMaxCopies = (kBN / 8) * C::kPanels * kTensors;  // 8-row pages
  static_assert(kMaxCopies <= kThreads, "at most one copy per thread and tile");
  const int my_copy = lane * C::kWarps + warp;
  // Worked out once, so that the loop has no divisions: the boxes of a full tile (a power of
  // two) and of the last one (keys <= my_hi only), and this thread's copy in each.
  struct TmaCopy {
    int n_box, bx, panel, tensor;
    bool any;
  };
  auto tma_copy = [&](int n_box) {
    return TmaCopy{n_box, my_copy % n_box, (my_copy / n_box) % C::kPanels,
                   my_copy / (n_box * C::kPanels), my_copy < n_box * C::kPanels * kTensors};
  };
  const TmaCopy full_copy = tma_copy(kTma ? kBN / box_rows : 1);
  const TmaCopy last_copy = tma_copy(
      kTma && n_tiles > 0 ? static_cast<int>((my_hi - (my_lo + (n_tiles - 1) * kBN)) / box_rows) + 1
                          : 1);
  // The pool row this thread's copy of tile it starts at, or -1 when it has none. A row outside
  // the tensor (a corrupt page entry) reads zeros: the map bounds the copy. Pages of at most 64
  // rows are whole boxes: tile it's box bx is page my_lo / page_size + it * (64 / page_size) + bx.
  auto copy_row = [&](int it, bool cached) -> int64_t {
    const TmaCopy c = it == n_tiles - 1 ? last_copy : full_copy;
    if (it >= n_tiles || !c.any) return -1;
    int64_t r;
    if (!paged) {
      r = sv.key0 + my_lo + static_cast<int64_t>(it) * kBN + c.bx * box_rows;
    } else if (a.page_size <= kBN) {
      const int pi = pc_lo + it * full_copy.n_box + c.bx;
      r = static_cast<int64_t>(cached ? page_cache[pi - pc_lo] : pages[pi]) * a.page_size;
    } else {
      r = pool_row(my_lo + static_cast<int64_t>(it) * kBN, cached);
    }
    return r >= 0 && r < a.L ? r : a.L;  // a.L <= INT32_MAX
  };
  // `row` is this thread's copy_row(it). Every thread calls it.
  auto issue_tile = [&](int it, int64_t row) {
    const TmaCopy c = it == n_tiles - 1 ? last_copy : full_copy;
    const uint32_t bar = smem_addr(&full[it % kS]);
    // Bytes per key: K and V rows of 128-byte panels (8-bit: and 4 heads' scales of each).
    constexpr uint32_t kKeyBytes = C::k8 ? 2 * (128 + 16) : C::kPanels * 2 * 128;
    if (threadIdx.x == 0) mbar_arrive_expect_tx(bar, c.n_box * box_rows * kKeyBytes);
    if (row < 0) return;
    const uint32_t stage = tiles_at + (it % kS) * static_cast<uint32_t>(C::kStageBytes);
    if constexpr (C::k8) {
      if (c.tensor >= 2) {  // scales: the 4 heads hk belongs to, [key][4] floats
        const uint32_t dst = stage + 2 * static_cast<uint32_t>(C::kTensorBytes) +
                             (c.tensor - 2) * (kBN * 16) + c.bx * box_rows * 16;
        tma_load_3d(dst, c.tensor == 2 ? &maps.k_scale : &maps.v_scale, 0, hk / 4,
                    static_cast<int>(row), bar, kv_policy);
        return;
      }
    }
    const uint32_t dst = stage + c.tensor * static_cast<uint32_t>(C::kTensorBytes) +
                         c.panel * (kBN * 128) + c.bx * box_rows * 128;
    const void* map = c.tensor == 0 ? &maps.k : &maps.v;
    const int col = c.panel * (C::k8 ? 128 : 64);  // the panel's first element
    if (plan.tma_head_outer) {
      tma_load_3d(dst, map, col, static_cast<int>(row), hk, bar, kv_policy);
    } else {
      tma_load_3d(dst, map, col, hk, static_cast<int>(row), bar, kv_policy);
    }
  };

  // The build's two steps: this thread's lookup for tile it (made a tile ahead of its copy),
  // and the copy of tile it into its stage (nothing past the last tile; cp.async commits a group
  // either way, so that cp_async_wait counts tiles).
  auto lookup = [&](int it, bool cached) -> int64_t {
    if constexpr (kTma) {
      return copy_row(it, cached);
    } else {
      return lookup_row(it, cached);
    }
  };
  auto fetch = [&](int it, int64_t row) {
    if constexpr (kTma) {
      if (it < n_tiles) issue_tile(it, row);
    } else {
      if (it < n_tiles) load_tile(it, row);
      cp_async_commit();
    }
  };

  // This thread's first kS lookups, all in flight at once; then the first kS - 1 tiles.
  int64_t first_rows[kS];
#pragma unroll
  for (int st = 0; st < kS; ++st) first_rows[st] = lookup(st, false);
  if constexpr (kTma) {
    if (threadIdx.x == 0) {
      for (int st = 0; st < kS; ++st) mbar_init(smem_addr(&full[st]), 1);
      mbar_init_fence();
    }
    __syncthreads();  // the barriers are initialised before any thread issues a copy
  }
  auto load_first_tiles = [&] {
#pragma unroll
    for (int st = 0; st < kS - 1; ++st) fetch(st, first_rows[st]);
  };
  // Keys below the first query's position were not written by the kernel before this one.
  const bool first_tiles_early = early && my_lo + (kS - 1) * kBN <= sv.pos0;
  if (first_tiles_early) load_first_tiles();
  if (early) {
    if (pc) fill_page_cache();  // indices: readable before the wait with early reads
    grid_dependency_wait_holding();
  }
  if (!first_tiles_early) load_first_tiles();
  int64_t next_row = first_rows[kS - 1];  // this thread's lookup for tile it + kS - 1

  // q rows (bf16, unscaled: the scale is applied to the fp32 logits); rows past n_rows are 0.
  for (int e = threadIdx.x; e < kR * (kD / 8); e += kThreads) {
    const int r = e / (kD / 8), d = (e % (kD / 8)) * 8;
    uint4 x = make_uint4(0, 0, 0, 0);
    if (r < n_rows) {
      const int t = (row0 + r) / G, g = (row0 + r) % G;
      x = *reinterpret_cast<const uint4*>(reinterpret_cast<const T*>(a.q) + (sv.q0 + t) * a.q_t +
                                          (hk * G + g) * a.q_h + d);
    }
    *reinterpret_cast<uint4*>(sQ + r * kP + d) = x;
  }
  if (pc && !early) fill_page_cache();
  __syncthreads();
  uint32_t qa[C::kQRegs ? kD / 16 : 1][4];
  // 8-bit: 2^-e of the lane's rows lane / 4 and + 8, whose q went to fp16 times 2^e, e chosen so
  // that the row's largest |q| lies in [2^13, 2^14) (fp16's range and full precision whatever q's
  // scale); the logits are multiplied back.
  float q_unit[2] = {1.0f, 1.0f};
  if constexpr (C::k8) {
    constexpr int kQ = kD / 4;  // dims of a row in this lane's fragments
    const T* rows[2] = {sQ + (lane / 4) * kP + (lane % 4) * kQ,
                        sQ + (lane / 4 + 8) * kP + (lane % 4) * kQ};
    float q_mul[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = 0.0f;
#pragma unroll
      for (int i = 0; i < kQ; i += 2) {
        const float2 x = load_pair(rows[h] + i);
        mx = fmaxf(mx, fmaxf(fabsf(x.x), fabsf(x.y)));
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      int e = 0;
      if (mx > 0.0f && mx <= 3.0e38f) {
        int x = 0;
        (void)frexpf(mx, &x);  // mx < 2^x
        e = max(-100, min(100, 14 - x));
      }
      q_mul[h] = ldexpf(1.0f, e);
      q_unit[h] = ldexpf(1.0f, -e);
    }
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
#pragma unroll
      for (int x = 0; x < 4; ++x) {  // rows (x % 2) * 8 + lane / 4, dims 4 kk + 2 (x / 2) + {0, 1}
        const float2 v = load_pair(rows[x % 2] + 4 * kk + 2 * (x / 2));
        qa[kk][x] = pack_f16x2(v.x * q_mul[x % 2], v.y * q_mul[x % 2]);
      }
    }
  } else if constexpr (C::kQRegs) {
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      ldmatrix_x4(qa[kk], sQ + (lane % 16) * kP + kk * 16 + (lane / 16) * 8);
    }
  }

  // This lane's accumulator: o[nb][x] is row lane / 4 + 8 (x / 2), dim nb * 8 + 2 (lane % 4) +
  // x % 2; m, l of its two rows (the warp's keys only; l is this lane's partial sum).
  float o[kNB][4];
#pragma unroll
  for (int nb = 0; nb < kNB; ++nb) o[nb][0] = o[nb][1] = o[nb][2] = o[nb][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  // 8-bit: o holds the sums in units of v_unit (a V scale of the warp's keys, below), so that P
  // times a key's scale over it stays within fp16's range and precision.
  float v_unit = 0.0f;
  int pos[2];  // query position of the lane's rows (-1: padding row, sees nothing)
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = lane / 4 + 8 * h;
    pos[h] = r < n_rows ? static_cast<int>(sv.pos0 + (row0 + r) / G) : -1;
  }
  const float scale_log2 = a.scale * kLog2e;
  // Where the next kernel's blocks are released (grid_dependents_launch; they still wait for
  // this grid to finish before touching its results): at the first tile for long shares, when 3
  // tiles remain for short ones. Both measured best of the positions tried on the H100 (graph
  // replay of back-to-back decode calls; docs/perf.md): an early release lets the next launch's
  // index and first-tile reads overlap this launch, but in a short launch they then compete with
  // its own last tiles.
  const int release_at = n_tiles >= 8 ? 0 : max(0, n_tiles - 3);

  // TMA: ldmatrix row addresses in the swizzled panels. K (S = Q K^T): lane l reads key
  // 16 warp + l % 8 + 8 (l / 16), chunk 2 (kk % 4) + (l / 8) % 2 of panel kk / 4; V (trans):
  // key 16 warp + l % 8 + 8 ((l / 8) % 2), chunk 2 (dn2 % 4) + l / 16 of panel dn2 / 4. Every
  // key's row index is key % 8 (mod 8), so the chunk a lane reads is its logical chunk ^ (l % 8).
  const uint32_t k_row = (warp * 16 + lane % 8 + (lane / 16) * 8) * 128;
  const uint32_t v_row = (warp * 16 + lane % 8 + ((lane / 8) % 2) * 8) * 128;
  const uint32_t k_xor = ((lane / 8) % 2) ^ (lane % 8), v_xor = (lane / 16) ^ (lane % 8);

  for (int it = 0; it < n_tiles; ++it) {
    const int64_t n0 = my_lo + static_cast<int64_t>(it) * kBN + warp * 16;  // the warp's keys
    if constexpr (kTma) {
      mbar_wait(smem_addr(&full[it % kS]), (it / kS) & 1);
      // Rows outside [lo, my_hi] hold other keys, unwritten rows or nothing copied (stale shared
      // memory): their logits are masked, but p = 0 times a NaN in V would not be; zero them.
      if (n0 < lo || n0 + 15 > my_hi) {
        const uint32_t sv_at = tiles_at + (it % kS) * static_cast<uint32_t>(C::kStageBytes) +
                               static_cast<uint32_t>(C::kTensorBytes);
        for (int e = lane; e < 16 * 8 * C::kPanels; e += kWarp) {
          const int r = e / (8 * C::kPanels), p = (e / 8) % C::kPanels, c = e % 8;
          if (n0 + r < lo || n0 + r > my_hi) {
            asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(
                             sv_at + p * (kBN * 128) + (warp * 16 + r) * 128 + c * 16),
                         "r"(0)
                         : "memory");
          }
        }
        if constexpr (C::k8) {  // and their V scales (a stale one would set the V unit)
          if (lane < 16 && (n0 + lane < lo || n0 + lane > my_hi)) {
            asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(
                             sv_at + static_cast<uint32_t>(C::kTensorBytes) + kBN * 16 +
                             (warp * 16 + lane) * 16),
                         "r"(0)
                         : "memory");
          }
        }
        fence_proxy_async_shared();  // before the copy engine refills this stage
        __syncwarp();
      }
    } else {
      cp_async_wait<kS - 2>();  // this thread's copies of tile it have landed
    }
    __syncthreads();  // everyone's copies have landed; everyone is done with tile it - 1
    if (it == release_at) grid_dependents_launch();
    fetch(it + kS - 1, next_row);    // into the stage tile it - 1 used
    next_row = lookup(it + kS, pc);  // used one iteration later

    const T* sK = tiles + (it % kS) * 2 * kBN * kP + warp * 16 * kP;  // cp.async: warp's keys
    const T* sV = sK + kBN * kP;
    const uint32_t sK_at = tiles_at + (it % kS) * static_cast<uint32_t>(C::kStageBytes);  // TMA
    const uint32_t sV_at = sK_at + static_cast<uint32_t>(C::kTensorBytes);
    // 8-bit: the stage's codes and the scales of this lane's keys 8 j + 2 (lane % 4) + {0, 1}.
    const unsigned char* st8 = smem + (it % kS) * C::kStageBytes;
    float2 k_sc[2], v_sc[2];
    if constexpr (C::k8) {
      const float* sc = reinterpret_cast<const float*>(st8 + 2 * C::kTensorBytes);
      const int key = warp * 16 + 2 * (lane % 4);
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        if constexpr (kTma) {  // [K|V][key][4 heads]
          const int at = (key + 8 * j) * 4 + hk % 4;
          k_sc[j] = make_float2(sc[at], sc[at + 4]);
          v_sc[j] = make_float2(sc[kBN * 4 + at], sc[kBN * 4 + at + 4]);
        } else {
          k_sc[j] = *reinterpret_cast<const float2*>(sc + key + 8 * j);
          v_sc[j] = *reinterpret_cast<const float2*>(sc + kBN + key + 8 * j);
        }
      }
    }

    // S = Q K^T for the warp's 16 keys: s[j][x] is row lane / 4 + 8 (x / 2), key 8 j +
    // 2 (lane % 4) + x % 2.
    float s[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
    if constexpr (C::k8) {  // key 8 j + lane / 4's codes, this lane's kD / 4 of them
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        uint32_t w[kD / 16];
        const int key = warp * 16 + 8 * j + lane / 4;
        if constexpr (kTma) {  // 16-byte chunks 2t, 2t + 1 of the key's row, swizzled (key % 8 = g)
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            load_words16(st8 + key * 128 + (((2 * (lane % 4) + i) ^ (lane / 4)) << 4), w + 4 * i);
          }
        } else {
          load_words(st8 + key * C::kPitch8 + (lane % 4) * (kD / 4), w);
        }
#pragma unroll
        for (int kk = 0; kk < kD / 16; ++kk) {
          uint32_t b0, b1;
          k_frags<kFmt>(w[kk], b0, b1);
          mma_f16_16816(s[j], qa[kk], b0, b1);
        }
      }
    } else {
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        uint32_t qf[4];
        if constexpr (C::kQRegs) {
#pragma unroll
          for (int x = 0; x < 4; ++x) qf[x] = qa[kk][x];
        } else {
          ldmatrix_x4(qf, sQ + (lane % 16) * kP + kk * 16 + (lane / 16) * 8);
        }
        uint32_t kb[4];
        if constexpr (kTma) {
          ldsm_x4(kb, sK_at + (kk / 4) * (kBN * 128) + k_row + ((((kk % 4) * 2) ^ k_xor) << 4));
        } else {
          ldmatrix_x4(kb, sK + (lane % 8 + (lane / 16) * 8) * kP + kk * 16 + ((lane / 8) % 2) * 8);
        }
        MmaElem<T>::mma(s[0], qf, kb[0], kb[1]);
        MmaElem<T>::mma(s[1], qf, kb[2], kb[3]);
      }
    }

    // 8-bit: the warp's V unit, and what o's sums are multiplied by when it changes. It is the
    // largest V scale of a tile's keys, kept while later tiles' stay within a factor 256 of it
    // (P times a key's scale over the unit then stays within fp16's range and precision).
    float v_ratio = 1.0f;
    float2 v_mul[2];
    if constexpr (C::k8) {
      float cv = fmaxf(fmaxf(v_sc[0].x, v_sc[0].y), fmaxf(v_sc[1].x, v_sc[1].y));
      cv = fmaxf(cv, __shfl_xor_sync(0xffffffffu, cv, 1));
      cv = fmaxf(cv, __shfl_xor_sync(0xffffffffu, cv, 2));  // the same in every lane
      if (cv > 0.0f && (v_unit == 0.0f || cv > 256.0f * v_unit || 256.0f * cv < v_unit)) {
        v_ratio = __fdividef(v_unit, cv);  // 0 before the first keys: o is 0 then
        v_unit = cv;
      }
      const float inv = v_unit > 0.0f ? __fdividef(1.0f, v_unit) : 0.0f;  // (all scales 0: 0)
#pragma unroll
      for (int j = 0; j < 2; ++j) v_mul[j] = make_float2(v_sc[j].x * inv, v_sc[j].y * inv);
    }

    // Logits (log2 domain), masked; online softmax per row over the warp's keys. Rows 8-15 of
    // a block with at most 8 (one query's heads of a group up to 8) are padding: P = 0 there,
    // and no softmax. A row that sees all 16 keys skips the masks. o is rescaled only where
    // some lane's factor is not 1 (multiplying by 1 would change nothing).
    const int n_h = n_rows > 8 ? 2 : 1;  // the same in the whole block
    float o_scale[2] = {v_ratio, v_ratio};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (h >= n_h) {
#pragma unroll
        for (int j = 0; j < 2; ++j) s[j][2 * h] = s[j][2 * h + 1] = 0.0f;
        continue;
      }
      const bool all_visible =
          n0 + 15 <= my_hi && n0 + 15 <= pos[h] && (a.window <= 0 || n0 > pos[h] - a.window);
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          float raw = s[j][2 * h + c];
          if constexpr (C::k8) raw *= (c == 0 ? k_sc[j].x : k_sc[j].y) * q_unit[h];
          float x = a.softcap > 0.0f ? logit_log2(raw, a.scale, a.softcap) : raw * scale_log2;
          if (!all_visible) {
            const int64_t key = n0 + 8 * j + 2 * (lane % 4) + c;
            const bool visible =
                key <= my_hi && key <= pos[h] && (a.window <= 0 || key > pos[h] - a.window);
            x = visible ? x : -INFINITY;
          }
          s[j][2 * h + c] = x;
          mx = fmaxf(mx, x);
        }
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m[h], mx);
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // no key yet: keep everything 0
      const float alpha = exp2f(m[h] - m_use);
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const float p = exp2f(s[j][2 * h + c] - m_use);
          s[j][2 * h + c] = p;
          sum += p;
        }
      }
      l[h] = l[h] * alpha + sum;
      m[h] = m_new;
      o_scale[h] = alpha * v_ratio;
    }
    if (__any_sync(0xffffffffu, o_scale[0] != 1.0f || o_scale[1] != 1.0f)) {
#pragma unroll
      for (int nb = 0; nb < kNB; ++nb) {
        o[nb][0] *= o_scale[0];
        o[nb][1] *= o_scale[0];
        o[nb][2] *= o_scale[1];
        o[nb][3] *= o_scale[1];
      }
    }

    // O += P V: P (16-bit) straight from the S accumulators as the A fragment.
    uint32_t pa[4];
    if constexpr (C::k8) {  // P times the key's V scale, in units of v_unit
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        const int j = x / 2, h = x % 2;
        pa[x] = pack_f16x2(s[j][2 * h] * v_mul[j].x, s[j][2 * h + 1] * v_mul[j].y);
      }
      // Keys 2t, 2t + 1, 2t + 8, 2t + 9 (t = lane % 4), this lane's kD / 8 dims of each.
      constexpr int kW = kD / 32;
      uint32_t r0[kW], r1[kW], r8[kW], r9[kW];
      const int key = warp * 16 + 2 * (lane % 4);
      const auto load = [&](int k, uint32_t(&w)[kW]) {
        const unsigned char* v = st8 + C::kTensorBytes;
        if constexpr (kTma) {  // 16-byte chunk g of the key's row, swizzled
          load_words16(v + k * 128 + (((lane / 4) ^ (k % 8)) << 4), w);
        } else {
          load_words(v + k * C::kPitch8 + (lane / 4) * (kD / 8), w);
        }
      };
      load(key, r0);
      load(key + 1, r1);
      load(key + 8, r8);
      load(key + 9, r9);
#pragma unroll
      for (int w = 0; w < kW; ++w) {
        uint32_t lo[4], hi[4];
        v_frags<kFmt>(r0[w], r1[w], lo);
        v_frags<kFmt>(r8[w], r9[w], hi);
#pragma unroll
        for (int i = 0; i < 4; ++i) mma_f16_16816(o[4 * w + i], pa, lo[i], hi[i]);
      }
    } else {
      pa[0] = MmaElem<T>::pack(s[0][0], s[0][1]);
      pa[1] = MmaElem<T>::pack(s[0][2], s[0][3]);
      pa[2] = MmaElem<T>::pack(s[1][0], s[1][1]);
      pa[3] = MmaElem<T>::pack(s[1][2], s[1][3]);
#pragma unroll
      for (int dn2 = 0; dn2 < kD / 16; ++dn2) {
        uint32_t vb[4];
        if constexpr (kTma) {
          ldsm_x4_t(vb, sV_at + (dn2 / 4) * (kBN * 128) + v_row + ((((dn2 % 4) * 2) ^ v_xor) << 4));
        } else {
          ldmatrix_x4_trans(
              vb, sV + (lane % 8 + ((lane / 8) % 2) * 8) * kP + dn2 * 16 + (lane / 16) * 8);
        }
        MmaElem<T>::mma(o[2 * dn2], pa, vb[0], vb[1]);
        MmaElem<T>::mma(o[2 * dn2 + 1], pa, vb[2], vb[3]);
      }
    }
  }
  if constexpr (!kTma) cp_async_wait<0>();  // (TMA: every issued tile was waited for)
  __syncthreads();                          // tiles free: the warps' states go there

  // Merge the 4 warps: [kWarps][kR][kMS] = accumulator, then (max, sum).
  float* merge = reinterpret_cast<float*>(smem);
  constexpr int kMS = C::kMergePitch;
  // Where dims d..d + 3 (d % 4 == 0) sit in a merge row. 8-bit: chunk k = d / (kD / 8) (one lane's
  // accumulator column) has its float4s in the order q ^ (k Q / 8) % Q (Q = kD / 32 of them), so
  // that with the pitch a quarter-warp's stores fall on distinct banks.
  auto merge_col = [](int d) {
    if constexpr (C::k8) {
      constexpr int kQ4 = kD / 32;
      const int k = d / (kD / 8), q = (d % (kD / 8)) / 4;
      return k * (kD / 8) + 4 * (q ^ ((k * kQ4 / 8) % kQ4));
    } else {
      return d;
    }
  };
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    float* dst = merge + (warp * kR + lane / 4 + 8 * h) * kMS;
    if constexpr (C::k8) {  // column 2t + c holds dims (kD / 8)(2t + c) + nb, in v_unit units
#pragma unroll
      for (int c = 0; c < 2; ++c) {
#pragma unroll
        for (int q = 0; q < kD / 32; ++q) {
          const int d = (kD / 8) * (2 * (lane % 4) + c) + 4 * q;
          *reinterpret_cast<float4*>(dst + merge_col(d)) =
              make_float4(o[4 * q][2 * h + c] * v_unit, o[4 * q + 1][2 * h + c] * v_unit,
                          o[4 * q + 2][2 * h + c] * v_unit, o[4 * q + 3][2 * h + c] * v_unit);
        }
      }
    } else {
#pragma unroll
      for (int nb = 0; nb < kNB; ++nb) {
        *reinterpret_cast<float2*>(dst + nb * 8 + 2 * (lane % 4)) =
            make_float2(o[nb][2 * h], o[nb][2 * h + 1]);
      }
    }
    if (lane % 4 == 0) {
      dst[kD] = m[h];
      dst[kD + 1] = l[h];
    }
  }
  __syncthreads();

  const int rows_total = a.T * a.Hq;  // workspace rows: (query row, head)
  auto out_row = [&](int r) {         // (query row, head) index of block row r
    const int t = (row0 + r) / G, g = (row0 + r) % G;
    return (sv.q0 + t) * a.Hq + hk * G + g;
  };
  auto store_out = [&](int r, int d, const float(&o4)[4], float m_all, float den) {
    const int t = (row0 + r) / G, g = (row0 + r) % G;
    const float inv = den > 0.0f ? 1.0f / den : 0.0f;
    const float v[4] = {o4[0] * inv, o4[1] * inv, o4[2] * inv, o4[3] * inv};
    T* dst = reinterpret_cast<T*>(a.out) + (sv.q0 + t) * a.out_t + (hk * G + g) * a.out_h + d;
    const auto p = reinterpret_cast<uint32_t*>(dst);  // 8-byte aligned: d % 4 == 0, rows of 8
    p[0] = MmaElem<T>::pack(v[0], v[1]);
    p[1] = MmaElem<T>::pack(v[2], v[3]);
    if (a.lse != nullptr && d == 0) {
      a.lse[static_cast<int64_t>(hk * G + g) * a.T + sv.q0 + t] =
          den > 0.0f ? (m_all + log2f(den)) * 0.6931471805599453f : -INFINITY;
    }
  };
  const uint64_t keep = l2_evict_last_policy();  // partials: read back soon by the combine
  // Each thread: 4 consecutive dims of one row.
  for (int e = threadIdx.x * 4; e < n_rows * kD; e += kThreads * 4) {
    const int r = e / kD, d = e % kD;
    float m_all = -INFINITY;
#pragma unroll
    for (int w = 0; w < C::kWarps; ++w) m_all = fmaxf(m_all, merge[(w * kR + r) * kMS + kD]);
    const float m_use = m_all == -INFINITY ? 0.0f : m_all;
    float o4[4] = {0.0f, 0.0f, 0.0f, 0.0f}, den = 0.0f;
#pragma unroll
    for (int w = 0; w < C::kWarps; ++w) {
      const float* src = merge + (w * kR + r) * kMS;
      const float wt = exp2f(src[kD] - m_use);
      den += src[kD + 1] * wt;
      const float4 x = *reinterpret_cast<const float4*>(src + merge_col(d));
      o4[0] += x.x * wt;
      o4[1] += x.y * wt;
      o4[2] += x.z * wt;
      o4[3] += x.w * wt;
    }
    if (n_split == 1) {
      store_out(r, d, o4, m_all, den);
    } else {
      const int64_t wr = static_cast<int64_t>(split) * rows_total + out_row(r);
      store_policy(plan.part_o + wr * kD + d, make_float4(o4[0], o4[1], o4[2], o4[3]), keep);
      if (d == 0) store_policy(plan.part_ml + wr * 2, make_float2(m_all, den), keep);
    }
  }
  if (n_split == 1) return;

  // The last block of this (sequence, KV head, row group) to arrive combines the partials.
  __shared__ int is_last;
  int* counter = plan.counters + (static_cast<int64_t>(b) * a.Hkv + hk) * plan.groups + grp;
  __syncthreads();  // every thread's partial stores are issued (and ordered before thread 0's)
  if (threadIdx.x == 0) is_last = atomic_add_acq_rel(counter) == n_split - 1;
  __syncthreads();  // the acquire reaches the whole block
  if (!is_last) return;
  // Each thread: 4 consecutive dims of one row. All splits' (max, sum) pairs and partials are
  // loaded together, kRound splits at a time with a running max across rounds: one dependent
  // round of loads for up to kRound splits.
  constexpr int kRound = 16;
  for (int e = threadIdx.x * 4; e < n_rows * kD; e += kThreads * 4) {
    const int r = e / kD, d = e % kD;
    const int64_t orow = out_row(r);
    float m_run = -INFINITY, den = 0.0f;
    float o4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int sp0 = 0; sp0 < n_split; sp0 += kRound) {
      float2 ml[kRound];
      float4 po[kRound];
#pragma unroll
      for (int i = 0; i < kRound; ++i) {
        const int64_t wr = (sp0 + i) * static_cast<int64_t>(rows_total) + orow;
        const bool ok = sp0 + i < n_split;
        ml[i] = ok ? __ldcg(reinterpret_cast<const float2*>(plan.part_ml + wr * 2))
                   : make_float2(-INFINITY, 0.0f);
        po[i] = ok ? __ldcg(reinterpret_cast<const float4*>(plan.part_o + wr * kD + d))
                   : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
      float mx = m_run;
#pragma unroll
      for (int i = 0; i < kRound; ++i) mx = fmaxf(mx, ml[i].x);
      const float m_use = mx == -INFINITY ? 0.0f : mx;  // no split saw a key yet: weights 0
      const float keep = exp2f(m_run - m_use);          // 0 while m_run is -inf
      den *= keep;
#pragma unroll
      for (int x = 0; x < 4; ++x) o4[x] *= keep;
#pragma unroll
      for (int i = 0; i < kRound; ++i) {
        const float wt = exp2f(ml[i].x - m_use);  // 0 for empty and unused splits
        den += ml[i].y * wt;
        o4[0] += po[i].x * wt;
        o4[1] += po[i].y * wt;
        o4[2] += po[i].z * wt;
        o4[3] += po[i].w * wt;
      }
      m_run = mx;
    }
    store_out(r, d, o4, m_run, den);
  }
  if (threadIdx.x == 0) *counter = 0;  // ready for the next launch (stream order)
}

// The kernel's dynamic shared memory limit, set once (so capture sees no attribute calls): what
// it needs, or for the 8-bit builds as much as the device allows (DecodePlan::per_sm_cap asks
// for more); and its static shared memory, which counts against the opt-in limit too.
struct SmemLimit {
  size_t dynamic_bytes, static_bytes;
};
template <int kD, bool kTma, int kFmt = 0, class T = bf16>
SmemLimit set_smem_limit_once() {
  static const SmemLimit limit = [] {
    cudaFuncAttributes fa{};
    LLMK_CUDA_CHECK(cudaFuncGetAttributes(&fa, decode_kernel<kD, kTma, kFmt, T>));
    size_t bytes = DecodeConfig<kD, kTma, kFmt>::kSmemBytes;
    if constexpr (kFmt != 0) {
      bytes = std::max(bytes, device_info().max_smem_per_block_optin - fa.sharedSizeBytes);
    }
    LLMK_CUDA_CHECK(cudaFuncSetAttribute(decode_kernel<kD, kTma, kFmt, T>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(bytes)));
    return SmemLimit{bytes, fa.sharedSizeBytes};
  }();
  return limit;
}

// Dynamic shared memory for a launch that needs `need` bytes, so that at most `cap` blocks share
// an SM (cap 0: `need`): a grid of fewer blocks than all SMs hold otherwise ran as if some SMs
// took 3 blocks and others none (attention.cpp, decode_plan).
size_t capped_smem(size_t need, const SmemLimit& limit, int cap) {
  if (cap <= 0) return need;
  static const size_t reserved = [] {
    int r = 0;
    LLMK_CUDA_CHECK(
        cudaDeviceGetAttribute(&r, cudaDevAttrReservedSharedMemoryPerBlock, device_info().id));
    return static_cast<size_t>(r);
  }();
  // cap + 1 blocks of (dynamic + static + reserved) bytes no longer fit in the SM's memory.
  const size_t block = device_info().smem_per_sm / (cap + 1) + 1;
  const size_t fixed = limit.static_bytes + reserved;
  const size_t dyn = block > fixed ? block - fixed : 0;
  return std::min(std::max(need, dyn), limit.dynamic_bytes);
}

template <int kD, bool kTma, int kFmt = 0>
int blocks_per_sm() {
  static const int blocks = [] {  // once per kernel: no API call per launch (fp16's the same)
    set_smem_limit_once<kD, kTma, kFmt>();
    int b = 0;
    LLMK_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &b, decode_kernel<kD, kTma, kFmt>, DecodeConfig<kD, kTma, kFmt>::kThreads,
        DecodeConfig<kD, kTma, kFmt>::kSmemBytes));
    return b > 0 ? b : 1;
  }();
  return blocks;
}

// The 3-d view of one cache (K or V) that DecodeMaps describes; false if the driver refused it.
bool encode_cache_map(CUtensorMap* map, const void* base, int64_t t_stride, int64_t h_stride,
                      const AttentionArgs& a, const DecodePlan& plan) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return false;
  const cuuint64_t rows = static_cast<cuuint64_t>(a.L), heads = static_cast<cuuint64_t>(a.Hkv);
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(a.D), plan.tma_head_outer ? rows : heads,
                              plan.tma_head_outer ? heads : rows};
  const cuuint64_t elem = a.kv_format != 0 ? 1 : sizeof(bf16);  // bytes
  const cuuint64_t t_bytes = static_cast<cuuint64_t>(t_stride) * elem,
                   h_bytes = static_cast<cuuint64_t>(h_stride) * elem;
  const cuuint64_t strides[2] = {plan.tma_head_outer ? t_bytes : h_bytes,
                                 plan.tma_head_outer ? h_bytes : t_bytes};
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(128 / elem),
                             plan.tma_head_outer ? static_cast<cuuint32_t>(plan.tma_box_rows) : 1u,
                             plan.tma_head_outer ? 1u : static_cast<cuuint32_t>(plan.tma_box_rows)};
  const cuuint32_t unit[3] = {1, 1, 1};
  const CUtensorMapDataType type = a.kv_format != 0 ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                   : a.fp16         ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                    : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  return encode(map, type, 3, const_cast<void*>(base), dims, strides, box, unit,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// The 3-d view [4 heads, Hkv / 4, row] of an 8-bit cache's scales ([rows][Hkv] floats, Hkv a
// multiple of 4) that DecodeMaps describes; false if the driver refused it.
bool encode_scale_map(CUtensorMap* map, const float* base, const AttentionArgs& a,
                      const DecodePlan& plan) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return false;
  const cuuint64_t dims[3] = {4, static_cast<cuuint64_t>(a.Hkv / 4), static_cast<cuuint64_t>(a.L)};
  const cuuint64_t strides[2] = {16, static_cast<cuuint64_t>(a.Hkv) * sizeof(float)};
  const cuuint32_t box[3] = {4, 1, static_cast<cuuint32_t>(plan.tma_box_rows)};
  const cuuint32_t unit[3] = {1, 1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3, const_cast<float*>(base), dims, strides,
                box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace

PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      p = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

bool encode_head_rows(CUtensorMap* map, const void* base, int64_t rows, int64_t heads, int D,
                      int64_t t_stride, int64_t h_stride, int box_rows, bool fp16) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return false;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(D), static_cast<cuuint64_t>(heads),
                              static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(h_stride) * 2,
                                 static_cast<cuuint64_t>(t_stride) * 2};
  const cuuint32_t box[3] = {64, 1, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t unit[3] = {1, 1, 1};
  return encode(map, fp16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3,
                const_cast<void*>(base), dims, strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE,
                CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <int kD>
int decode_max_rows() {
  return DecodeConfig<kD, false>::kRows;
}

// The 8-bit builds exist at head dims 64 and 128 (decode_8bit_supported).
template <int kD>
constexpr bool kBuilt8 = kD == 64 || kD == 128;

template <int kD>
size_t decode_smem_bytes(bool tma, int fmt) {
  if constexpr (kBuilt8<kD>) {
    if constexpr (decode_8bit_tma_supported(kD)) {
      if (tma && fmt == 1) return DecodeConfig<kD, true, 1>::kSmemBytes;
      if (tma && fmt == 2) return DecodeConfig<kD, true, 2>::kSmemBytes;
    }
    if (fmt == 1) return DecodeConfig<kD, false, 1>::kSmemBytes;
    if (fmt == 2) return DecodeConfig<kD, false, 2>::kSmemBytes;
  }
  return tma ? DecodeConfig<kD, true>::kSmemBytes : DecodeConfig<kD, false>::kSmemBytes;
}

template <int kD>
int decode_blocks_per_sm(bool tma, int fmt) {
  if constexpr (kBuilt8<kD>) {
    if constexpr (decode_8bit_tma_supported(kD)) {
      if (tma && fmt == 1) return blocks_per_sm<kD, true, 1>();
      if (tma && fmt == 2) return blocks_per_sm<kD, true, 2>();
    }
    if (fmt == 1) return blocks_per_sm<kD, false, 1>();
    if (fmt == 2) return blocks_per_sm<kD, false, 2>();
  }
  return tma ? blocks_per_sm<kD, true>() : blocks_per_sm<kD, false>();
}

template <int kD>
bool launch_decode(const AttentionArgs& a, const DecodePlan& plan) {
  DecodeMaps maps = {};
  if (plan.tma && !(encode_cache_map(&maps.k, a.k, a.k_t, a.k_h, a, plan) &&
                    encode_cache_map(&maps.v, a.v, a.v_t, a.v_h, a, plan))) {
    return false;
  }
  if (plan.tma && a.kv_format != 0 &&
      !(encode_scale_map(&maps.k_scale, a.k_scale, a, plan) &&
        encode_scale_map(&maps.v_scale, a.v_scale, a, plan))) {
    return false;
  }
  const dim3 grid(static_cast<unsigned>(plan.split), static_cast<unsigned>(a.Hkv * plan.groups),
                  static_cast<unsigned>(a.B));
  // Programmatic stream serialisation (sm_90+): the grid may be launched before the previous
  // kernel in the stream has finished; the kernel waits for it (grid_dependency_wait) before any
  // global memory access. Kept in stream capture as a programmatic graph edge.
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(DecodeConfig<kD, false>::kThreads);
  cfg.stream = current_stream();
  cfg.attrs = attr;
  cfg.numAttrs = dependent_launch_supported() ? 1 : 0;
  // q and out in bf16 or fp16; the cache in the same, or 8-bit (kv_format 1, 2).
  const auto launch = [&](auto t) {
    using T = decltype(t);
    const auto go = [&](auto kernel, size_t smem) {
      cfg.dynamicSmemBytes = smem;
      LLMK_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, a, plan, maps));
    };
    if constexpr (decode_8bit_tma_supported(kD)) {
      if (plan.tma && a.kv_format == 1) {
        const SmemLimit lim = set_smem_limit_once<kD, true, 1, T>();
        return go(decode_kernel<kD, true, 1, T>,
                  capped_smem(DecodeConfig<kD, true, 1>::kSmemBytes, lim, plan.per_sm_cap));
      }
      if (plan.tma && a.kv_format == 2) {
        const SmemLimit lim = set_smem_limit_once<kD, true, 2, T>();
        return go(decode_kernel<kD, true, 2, T>,
                  capped_smem(DecodeConfig<kD, true, 2>::kSmemBytes, lim, plan.per_sm_cap));
      }
    }
    if constexpr (kBuilt8<kD>) {
      if (a.kv_format == 1) {
        const SmemLimit lim = set_smem_limit_once<kD, false, 1, T>();
        return go(decode_kernel<kD, false, 1, T>,
                  capped_smem(DecodeConfig<kD, false, 1>::kSmemBytes, lim, plan.per_sm_cap));
      }
      if (a.kv_format == 2) {
        const SmemLimit lim = set_smem_limit_once<kD, false, 2, T>();
        return go(decode_kernel<kD, false, 2, T>,
                  capped_smem(DecodeConfig<kD, false, 2>::kSmemBytes, lim, plan.per_sm_cap));
      }
    }
    if (plan.tma) {
      set_smem_limit_once<kD, true, 0, T>();
      go(decode_kernel<kD, true, 0, T>, DecodeConfig<kD, true>::kSmemBytes);
    } else {
      set_smem_limit_once<kD, false, 0, T>();
      go(decode_kernel<kD, false, 0, T>, DecodeConfig<kD, false>::kSmemBytes);
    }
  };
  if (a.fp16) {
    launch(__half{});
  } else {
    launch(bf16{});
  }
  check_launch("attention decode");
  return true;
}

#define LLMK_INSTANTIATE_DECODE(D)                 \
  template int decode_max_rows<D>();               \
  template size_t decode_smem_bytes<D>(bool, int); \
  template int decode_blocks_per_sm<D>(bool, int); \
  template bool launch_decode<D>(const AttentionArgs&, const DecodePlan&);
LLMK_INSTANTIATE_DECODE(64)
LLMK_INSTANTIATE_DECODE(80)
LLMK_INSTANTIATE_DECODE(96)
LLMK_INSTANTIATE_DECODE(112)
LLMK_INSTANTIATE_DECODE(128)
LLMK_INSTANTIATE_DECODE(256)
#undef LLMK_INSTANTIATE_DECODE

}  // namespace llmk::cuda::attn
