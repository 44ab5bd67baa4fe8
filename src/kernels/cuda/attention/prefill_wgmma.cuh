// The Hopper prefill kernel behind launch_prefill<kD> on sm_90a: the FA2 algorithm of
// prefill_kernel.cuh (same work items, masks, online softmax and epilogue, shared from there)
// with both matrix products on warpgroup MMA (wgmma.mma_async) instead of mma.sync:
//   S = Q K^T   m64 n kBN k16, A (Q) and B (K) read by the tensor cores from shared memory;
//   O += P V    m64 n kD k16, A (P) from registers (the S accumulators packed to 16 bits, the
//               same fragment layout), B (V) from shared memory, N-major.
// mma.sync feeds each warp's tensor core through ldmatrix (every K/V fragment crosses the
// shared-memory port once per 16 query rows); wgmma reads each shared tile once per 64 rows,
// which is what leaves the H100's shared-memory bandwidth out of the way.
//
// A block is kWG warpgroups; warpgroup g owns query rows [64 g, 64 g + 64), warp w of the block
// rows [16 w, 16 w + 16) (the mma.sync kernel's row_base with one m-tile per warp). Q, K and V
// tiles live in shared memory in the 128-byte-swizzle canonical layout: a [rows][kD] tile is
// ceil(kD / 64) panels of [rows][64] (128-byte rows), and the 16-byte chunk c of row r sits at
// chunk c ^ (r % 8). cp.async writes that layout directly; K/V have kStages buffers (2: tile i + 1
// lands during tile i's work). No warp specialisation: the warpgroups of a block (and the
// blocks of an SM, where two fit) drift apart, so one's softmax runs while another's products
// are on the tensor cores.
#pragma once

#include "kernels/cuda/attention/launch.h"
#include "kernels/cuda/attention/prefill_kernel.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace llmk::cuda::attn {

template <int kD_, int kWG_, int kBN_, int kMinBlocks_>
struct WgmmaCfg {
  static constexpr int kD = kD_;
  static constexpr int kWG = kWG_;  // warpgroups per block
  static constexpr int kBM = kWG * 64;
  static constexpr int kBN = kBN_;
  static constexpr int kStages = 2;
  static constexpr int kMinBlocks = kMinBlocks_;
  static constexpr int kThreads = kWG * 128;
  // Tiles are ceil(kD / 64) whole panels of 64 columns (head dims 80, 96, 112: the second
  // panel's columns past kD are never written nor read).
  static constexpr int kPanelCols = (kD + 63) / 64 * 64;
  static constexpr int kQBytes = kBM * kPanelCols * 2;
  static constexpr int kKVBytes = kBN * kPanelCols * 2;  // one K or V tile
  // +1024: the dynamic shared window is re-aligned to the swizzle period.
  static constexpr size_t kSmemBytes = kQBytes + 2 * kStages * kKVBytes + 1024;
  static_assert(kD % 16 == 0 && kBN % 16 == 0, "16-column k steps, 16-key steps");
  static_assert(kBN == 64 || kBN == 128, "S products are built for 64 or 128 keys per tile");
  static_assert(kD == 64 || kD == 80 || kD == 96 || kD == 112 || kD == 128 || kD == 256,
                "O products are built for these head dims (wgmma.cuh)");
};

namespace wgmma_detail {

// A [kRows][kD] tile of 16-bit elements, global -> shared in the swizzled panel layout (dst a
// 1024-aligned shared-space byte address); rows >= valid are zero-filled and not read. Thread t
// copies chunk column t % kChunks of rows t / kChunks + j * kStep (one 64-bit source pointer
// stepping by kStep rows), kChunks being kD / 8 rounded up to a power of two: the threads of
// columns past kD (the unused half of head dim 96's second panel) copy nothing.
template <int kRows, int kD, int kThreads>
__device__ __forceinline__ void load_swizzled(uint32_t dst, const uint16_t* src, int64_t stride,
                                              int valid) {
  constexpr int kChunks = pow2_ceil(kD / 8);
  static_assert(kThreads % kChunks == 0, "whole rows per pass");
  constexpr int kStep = kThreads / kChunks;
  static_assert(kRows % kStep == 0, "whole passes");
  const int c = static_cast<int>(threadIdx.x) % kChunks;
  const int r0 = static_cast<int>(threadIdx.x) / kChunks;
  if (kChunks * 8 != kD && c * 8 >= kD) return;
  const uint16_t* g = src + r0 * stride + c * 8;
  const int64_t step = kStep * stride;
  dst += (c / 8) * (kRows * 128) + r0 * 128;
#pragma unroll
  for (int j = 0; j < kRows / kStep; ++j) {
    const int r = r0 + j * kStep;
    const bool ok = r < valid;
    const uint32_t at = dst + j * kStep * 128 + (((c % 8) ^ (r % 8)) << 4);
    cp_async_16_at(at, ok ? g : src, ok);
    g += step;
  }
}

// S (+)= Q K^T over the head dim, issued and committed (not waited for): Q's rows at q_rows
// (panels kBM rows apart) and the K tile at k_tile (panels kBN rows apart), both K-major in the
// swizzled panel layout (SBO = 8 rows of 128 bytes; a 16-column step inside a panel advances the
// start address by 32 bytes, the hardware applying the swizzle).
template <class T, int kD, int kBM, int kBN>
__device__ __forceinline__ void issue_qk(float (&s_flat)[kBN / 2], uint32_t q_rows,
                                         uint32_t k_tile) {
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    const uint32_t col = (kk % 4) * 32;
    const uint64_t da = wgmma_desc_sw128(q_rows + (kk / 4) * (kBM * 128) + col, 16, 1024);
    const uint64_t db = wgmma_desc_sw128(k_tile + (kk / 4) * (kBN * 128) + col, 16, 1024);
    wgmma_ss<T, kBN>(s_flat, da, db, kk > 0);
  }
  wgmma_commit();
  wgmma_fence_operand(s_flat);
}

}  // namespace wgmma_detail

template <class C, class T>
__global__ void __launch_bounds__(C::kThreads, C::kMinBlocks)
    prefill_wgmma_kernel(const AttentionArgs a) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();  // wgmma exists on sm_90a only; the host launches this kernel on sm_90 devices only
#else
  using namespace prefill_detail;
  using namespace wgmma_detail;
  using E = MmaElem<T>;
  constexpr int kD = C::kD, kBM = C::kBM, kBN = C::kBN;
  constexpr int kNT = kBN / 8, kDT = kD / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  // Shared-space byte addresses, 1024-aligned: Q [P][kBM][64], K and V [kStages][P][kBN][64]
  // each, P = ceil(kD / 64) panels.
  const uint32_t sQa = (smem_addr(smem_raw) + 1023u) & ~1023u;
  const uint32_t sKa = sQa + C::kQBytes, sVa = sKa + C::kStages * C::kKVBytes;

  const Work w = find_work<kBM>(a);
  if (!w.valid) return;
  const int warp = threadIdx.x / kWarp, wg = warp / 4;
  const int hk = w.h / (a.Hq / a.Hkv);
  const int rows = min(kBM, w.tq - w.m0);
  const KeyTiles kt = key_tiles<kBM, kBN>(a, w, rows);
  const int n_hi = kt.n_hi, n_tiles = kt.count();

  const uint16_t *q_base, *k_base, *v_base;
  tile_bases(a, w, hk, q_base, k_base, v_base);

  const int row_base = warp * 16 + (threadIdx.x % kWarp) / 4;
  float o[1][kDT][4];
#pragma unroll
  for (int i = 0; i < kDT; ++i) o[0][i][0] = o[0][i][1] = o[0][i][2] = o[0][i][3] = 0.0f;
  float m[1][2] = {{-INFINITY, -INFINITY}}, l[1][2] = {{0.0f, 0.0f}};
  auto& o_flat = *reinterpret_cast<float(*)[kD / 2]>(&o[0][0][0]);

  if (n_tiles > 0) {
    auto tile_n0 = [&](int i) { return (n_hi - 1 - i) * kBN; };  // last tile first
    auto load_kv = [&](int i) {
      const int n0 = tile_n0(i);
      const uint32_t off = (i % C::kStages) * C::kKVBytes;
      load_swizzled<kBN, kD, C::kThreads>(sKa + off, k_base + n0 * a.k_t, a.k_t, w.tk - n0);
      load_swizzled<kBN, kD, C::kThreads>(sVa + off, v_base + n0 * a.v_t, a.v_t, w.tk - n0);
    };
    load_swizzled<kBM, kD, C::kThreads>(sQa, q_base, a.q_t, rows);
    load_kv(0);
    cp_async_commit();

    const LogitMap lm = logit_map(a);
    // This warpgroup's Q rows: panel p starts at sQa + p * kBM * 128; a 16-column step inside a
    // panel advances the start address by 32 bytes (the hardware applies the swizzle).
    const uint32_t q_rows = sQa + wg * 64 * 128;

    for (int i = 0; i < n_tiles; ++i) {
      const int n0 = tile_n0(i);
      const uint32_t k_tile = sKa + (i % C::kStages) * C::kKVBytes;
      const uint32_t v_tile = sVa + (i % C::kStages) * C::kKVBytes;
      cp_async_wait<0>();
      fence_proxy_async_shared();
      __syncthreads();  // tile i landed and is visible to wgmma; every warp is done with i - 1
      if (i + 1 < n_tiles) load_kv(i + 1);  // into the buffers tile i - 1 used
      cp_async_commit();

      auto tile = [&](auto mask_tag, auto pre_tag) {
        constexpr bool kMask = decltype(mask_tag)::value;
        constexpr bool kPre = decltype(pre_tag)::value;
        // S = Q K^T
        float s[1][kNT][4];
        auto& s_flat = *reinterpret_cast<float(*)[kBN / 2]>(&s[0][0][0]);
        issue_qk<T, kD, kBM, kBN>(s_flat, q_rows, k_tile);
        wgmma_wait<0>();
        wgmma_fence_operand(s_flat);

        if constexpr (kPre) logits_prepass(s, lm);
        if constexpr (kMask) mask_logits(s, a, w, row_base, n0);
        online_softmax(s, o, m, l, lm.fold);

        // O += P V: V N-major, LBO = one 64-column panel, SBO = 8 keys of 128 bytes.
        // (Every P fragment is packed before the fence: a register written between two wgmmas
        // makes the compiler serialise them.)
        uint32_t pa[kBN / 16][4];
#pragma unroll
        for (int kk = 0; kk < kBN / 16; ++kk) p_fragment<E>(pa[kk], s, 0, kk);
        wgmma_fence_operand(o_flat);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBN / 16; ++kk)
          wgmma_rs<T, kD>(o_flat, pa[kk],
                          wgmma_desc_sw128(v_tile + kk * 16 * 128, kBN * 128, 1024));
        wgmma_commit();
        wgmma_fence_operand(o_flat);
        wgmma_wait<0>();
        wgmma_fence_operand(o_flat);
      };
      using T_ = std::true_type;
      using F_ = std::false_type;
      if (tile_needs_mask<kBM, kBN>(a, w, kt, n0)) {
        lm.prepass ? tile(T_{}, T_{}) : tile(T_{}, F_{});
      } else {
        lm.prepass ? tile(F_{}, T_{}) : tile(F_{}, F_{});
      }
    }
    cp_async_wait<0>();
  }

  store_rows<E, T>(a, w, row_base, o, m, l);
#endif
}

// ---- The warp-specialised kernel (FA3's arrangement of the algorithm), head dims 96 and 128 ----
//
// Block: two consumer warpgroups (64 query rows each, kBM = 128) and a producer warpgroup whose
// one thread has the copy engine (TMA) load the block's Q tile once and each key tile's K and V
// into two-stage rings (a "full" barrier per stage counting the bytes, an "empty" one the
// consumer warps arrive on when their products have read it), so the warpgroups never stop at a
// block-wide barrier and drift apart freely. Each consumer overlaps within itself: with P of tile
// i in registers it issues S = Q K^T of tile i + 1 and O += P V of tile i back to back, does tile
// i + 1's softmax while the second product runs, and rescales O only once it has finished.
// Key tiles go last first, as in the kernels above, so the masked tiles come first.

// Q's, K's and V's tensor maps: [rows][heads][kD] 16-bit with their strides, boxes of 64 columns
// x 1 head x 128 rows (128-byte swizzle: the panels the wgmma descriptors above read).
struct PrefillMaps {
  CUtensorMap q, k, v;
};

template <int kD_>
struct WsCfg {
  static constexpr int kD = kD_, kBM = 128, kBN = 128;
  static constexpr int kThreads = 384;  // warpgroups 0 and 1 consume, 2 produces (one thread)
  static constexpr int kPanels = (kD + 63) / 64;
  static constexpr int kQBytes = kBM * kPanels * 128;
  static constexpr int kKVBytes = kBN * kPanels * 128;  // one K or V tile
  static constexpr int kOffK = kQBytes, kOffV = kOffK + 2 * kKVBytes;
  static constexpr int kOffBar = kOffV + 2 * kKVBytes;  // q, k full x2, v full x2, k/v empty x2
  static constexpr size_t kSmemBytes = 1024 + kOffBar + 9 * 8;
  static_assert(kD == 96 || kD == 128, "built for head dims 96 and 128");
};

// Keeps the compiler from reusing the registers of a wgmma's A operand before the wgmma is known
// to be done (wgmma reads them asynchronously).
template <int N>
__device__ __forceinline__ void keep_registers(uint32_t (&r)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
}

template <class C, class T>
__global__ void __launch_bounds__(C::kThreads, 1)
    prefill_ws_kernel(const AttentionArgs a, const __grid_constant__ PrefillMaps maps) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();  // wgmma and TMA: sm_90a only; the host launches this kernel on sm_90 devices only
#else
  using namespace prefill_detail;
  using E = MmaElem<T>;
  constexpr int kD = C::kD, kBM = C::kBM, kBN = C::kBN;
  constexpr int kNT = kBN / 8, kDT = kD / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t sQ = (smem_addr(smem_raw) + 1023u) & ~1023u;
  const uint32_t sK = sQ + C::kOffK, sV = sQ + C::kOffV, bars = sQ + C::kOffBar;
  const uint32_t q_full = bars;
  auto k_full = [&](int s) { return bars + 8 + 8 * s; };
  auto v_full = [&](int s) { return bars + 24 + 8 * s; };
  auto k_empty = [&](int s) { return bars + 40 + 8 * s; };
  auto v_empty = [&](int s) { return bars + 56 + 8 * s; };

  const Work w = find_work<kBM>(a);
  if (!w.valid) return;
  const int hk = w.h / (a.Hq / a.Hkv);
  const int rows = min(kBM, w.tq - w.m0);
  const KeyTiles kt = key_tiles<kBM, kBN>(a, w, rows);
  const int n_hi = kt.n_hi, n_tiles = kt.count();
  if (threadIdx.x == 0) {
    mbar_init(q_full, 1);
    for (int s = 0; s < 2; ++s) {
      mbar_init(k_full(s), 1);
      mbar_init(v_full(s), 1);
      mbar_init(k_empty(s), 8);  // one arrival per consumer warp
      mbar_init(v_empty(s), 8);
    }
    mbar_init_fence();
  }
  __syncthreads();

  if (threadIdx.x >= 256) {  // the producer warpgroup; one thread issues
    // Registers to the consumers: 40 here, 232 there (2 x 128 x 232 + 128 x 40 <= 64 Ki).
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
    if (threadIdx.x == 256 && n_tiles > 0) {
      const uint64_t keep = l2_evict_last_policy();  // K and V are read by the group's heads
      const uint64_t once = l2_evict_first_policy();
      mbar_arrive_expect_tx(q_full, C::kQBytes);
#pragma unroll
      for (int p = 0; p < C::kPanels; ++p) {
        tma_load_3d(sQ + p * kBM * 128, &maps.q, p * 64, w.h, w.q0 + w.m0, q_full, once);
      }
      for (int i = 0; i < n_tiles; ++i) {
        const int s = i & 1;
        const uint32_t phase = (i >> 1) & 1;
        const int row = w.k0 + (n_hi - 1 - i) * kBN;
        mbar_wait(k_empty(s), phase ^ 1);
        mbar_arrive_expect_tx(k_full(s), C::kKVBytes);
#pragma unroll
        for (int p = 0; p < C::kPanels; ++p) {
          tma_load_3d(sK + s * C::kKVBytes + p * kBN * 128, &maps.k, p * 64, hk, row, k_full(s),
                      keep);
        }
        mbar_wait(v_empty(s), phase ^ 1);
        mbar_arrive_expect_tx(v_full(s), C::kKVBytes);
#pragma unroll
        for (int p = 0; p < C::kPanels; ++p) {
          tma_load_3d(sV + s * C::kKVBytes + p * kBN * 128, &maps.v, p * 64, hk, row, v_full(s),
                      keep);
        }
      }
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
  const int wg = threadIdx.x / 128, lane = threadIdx.x % kWarp;
  const int row_base = (threadIdx.x / kWarp) * 16 + lane / 4;
  float o[1][kDT][4];
#pragma unroll
  for (int i = 0; i < kDT; ++i) o[0][i][0] = o[0][i][1] = o[0][i][2] = o[0][i][3] = 0.0f;
  float m[1][2] = {{-INFINITY, -INFINITY}}, l[1][2] = {{0.0f, 0.0f}};
  auto& o_flat = *reinterpret_cast<float(*)[kD / 2]>(&o[0][0][0]);

  if (n_tiles > 0) {
    const LogitMap lm = logit_map(a);
    const uint32_t q_rows = sQ + wg * 64 * 128;
    auto release = [&](uint32_t bar) {
      if (lane == 0) mbar_arrive(bar);
    };
    // S = Q K^T for the K tile at k_tile, issued and committed (not waited for).
    auto qk = [&](float(&s)[1][kNT][4], uint32_t k_tile) {
      wgmma_detail::issue_qk<T, kD, kBM, kBN>(*reinterpret_cast<float(*)[kBN / 2]>(&s[0][0][0]),
                                              q_rows, k_tile);
    };
    // The logits of the tile starting at key n0 to P, with m and l updated; alpha for O.
    auto softmax = [&](float(&s)[1][kNT][4], int n0, float(&alpha)[1][2]) {
      if (lm.prepass) logits_prepass(s, lm);
      if (tile_needs_mask<kBM, kBN>(a, w, kt, n0)) mask_logits(s, a, w, row_base, n0);
      softmax_tile(s, m, l, lm.fold, alpha);
    };

    mbar_wait(q_full, 0);
    float s[1][kNT][4];
    float alpha[1][2];
    mbar_wait(k_full(0), 0);
    qk(s, sK);
    wgmma_wait<0>();
    wgmma_fence_operand(*reinterpret_cast<float(*)[kBN / 2]>(&s[0][0][0]));
    release(k_empty(0));
    softmax(s, (n_hi - 1) * kBN, alpha);  // O is still zero: nothing to rescale
    // The first tile holds the last keys: its rows past them (the next sequence's, or whatever
    // the cache holds there, NaN included) get P = 0, and 0 x NaN would spoil O. Zero those V rows
    // (both warpgroups, before either reads the tile).
    if (const int valid = w.tk - (n_hi - 1) * kBN; valid < kBN) {
      mbar_wait(v_full(0), 0);
      constexpr int kChunks = C::kPanels * 8;  // 16-byte chunks of a row, over the panels
      for (int c = static_cast<int>(threadIdx.x); c < (kBN - valid) * kChunks; c += 256) {
        const int row = valid + c / kChunks, panel = (c % kChunks) / 8;
        const uint32_t at = sV + panel * kBN * 128 + row * 128 + (c % 8) * 16;
        st_shared_v4(at, 0, 0, 0, 0);
      }
      fence_proxy_async_shared();  // the zeros are what wgmma reads
      named_barrier_sync(1, 256);
    }

    // O += P V of tile i, committed; pa gets P (from s).
    auto issue_pv = [&](uint32_t(&pa)[kBN / 16][4], int i) {
      mbar_wait(v_full(i & 1), (i >> 1) & 1);
      wgmma_fence_operand(o_flat);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBN / 16; ++kk) {
        wgmma_rs<T, kD>(
            o_flat, pa[kk],
            wgmma_desc_sw128(sV + (i & 1) * C::kKVBytes + kk * 16 * 128, kBN * 128, 1024));
      }
      wgmma_commit();
      wgmma_fence_operand(o_flat);
    };
    // Every tile but the last: the next tile's S and this tile's P V in flight together (the
    // same number of groups on every pass, which ptxas needs to keep the products asynchronous).
    for (int i = 0; i + 1 < n_tiles; ++i) {
      uint32_t pa[kBN / 16][4];
#pragma unroll
      for (int kk = 0; kk < kBN / 16; ++kk) p_fragment<E>(pa[kk], s, 0, kk);
      const int sn = (i + 1) & 1;
      mbar_wait(k_full(sn), ((i + 1) >> 1) & 1);
      qk(s, sK + sn * C::kKVBytes);  // S of tile i + 1 (its P is now in pa)
      issue_pv(pa, i);
      wgmma_wait<1>();  // the S product is done; O += P V may still run
      wgmma_fence_operand(*reinterpret_cast<float(*)[kBN / 2]>(&s[0][0][0]));
      release(k_empty(sn));
      softmax(s, (n_hi - 2 - i) * kBN, alpha);
      wgmma_wait<0>();
      wgmma_fence_operand(o_flat);
      keep_registers(pa);
      release(v_empty(i & 1));
      rescale_o(o, alpha);
    }
    uint32_t pa[kBN / 16][4];
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) p_fragment<E>(pa[kk], s, 0, kk);
    issue_pv(pa, n_tiles - 1);
    wgmma_wait<0>();
    wgmma_fence_operand(o_flat);
    keep_registers(pa);
  }
  store_rows<E, T>(a, w, row_base, o, m, l);
#endif
}

// The warp-specialised kernel's tensor maps: Q [T][Hq][kD], K and V [L][Hkv][kD] with their
// strides (head dim 96: the second panel's columns past 96 read as zeros).
inline bool encode_prefill_maps(PrefillMaps& m, const AttentionArgs& a) {
  return encode_head_rows(&m.q, a.q, a.T, a.Hq, a.D, a.q_t, a.q_h, 128, a.fp16) &&
         encode_head_rows(&m.k, a.k, a.L, a.Hkv, a.D, a.k_t, a.k_h, 128, a.fp16) &&
         encode_head_rows(&m.v, a.v, a.L, a.Hkv, a.D, a.v_t, a.v_h, 128, a.fp16);
}

// launch_prefill_ws<kD>: the warp-specialised kernel; false (nothing launched) where it is not
// built for the arguments or the driver refused the tensor maps.
template <class C, class T>
bool launch_prefill_ws(const AttentionArgs& a) {
  PrefillMaps maps;
  if (!encode_prefill_maps(maps, a)) return false;
  auto* kernel = prefill_ws_kernel<C, T>;
  static const bool raised = [&] {
    LLMK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(C::kSmemBytes)));
    return true;
  }();
  (void)raised;
  const int64_t tiles = ceil_div(a.T, C::kBM) + (a.cu_q != nullptr ? a.B - 1 : 0);
  kernel<<<static_cast<unsigned>(tiles * a.Hq), C::kThreads, C::kSmemBytes, current_stream()>>>(
      a, maps);
  check_launch("attention prefill");
  return true;
}

// launch_prefill<kD>'s body: the kernel k asks for (kAuto: the warp-specialised one where it is
// built for kD and the driver takes its tensor maps, else the wgmma tiling Wg; kMmaSync: the
// mma.sync tiling Mma), bf16 or fp16.
template <class Wg, class Mma>
void launch_prefill_either(const AttentionArgs& a, PrefillKernel k) {
  static_assert(Wg::kD == Mma::kD, "one head dim");
  if (k == PrefillKernel::kAuto) {
    constexpr int kD = Wg::kD;
    // Not at 64: there it ran 0.85x the wgmma kernel (B16 S512, which keeps two blocks per SM).
    if constexpr (kD == 96 || kD == 128) {
      if (a.fp16 ? launch_prefill_ws<WsCfg<kD>, __half>(a)
                 : launch_prefill_ws<WsCfg<kD>, __nv_bfloat16>(a)) {
        return;
      }
    }
    k = PrefillKernel::kWgmma;
  }
  if (k == PrefillKernel::kWgmma) {
    if (a.fp16) return launch_prefill_grid<Wg, prefill_wgmma_kernel<Wg, __half>>(a);
    return launch_prefill_grid<Wg, prefill_wgmma_kernel<Wg, __nv_bfloat16>>(a);
  }
  if (a.fp16) return launch_prefill_grid<Mma, prefill_kernel<Mma, __half>>(a);
  launch_prefill_grid<Mma, prefill_kernel<Mma, __nv_bfloat16>>(a);
}

}  // namespace llmk::cuda::attn
