// gemm_act (gemm_act.h): y = act(x @ w^T + bias) on Hopper, the activation in the epilogue.
//
// Block: three warpgroups. Warpgroup 0 is the producer: one thread walks the block's tiles and
// their K steps, waits for a free stage of the ring, and has the copy engine (TMA) load x's
// 128 x 64 tile and w's kBN x 64 tile into it (128-byte swizzle, the layout wgmma reads), the
// stage's "full" barrier counting the bytes. Warpgroups 1 and 2 are consumers: each waits for a
// stage to fill, issues four wgmma m64 x kBN x k16 over it (its 64 rows of x against all kBN rows
// of w), and frees the stage it used one step earlier once that step's products are done (so
// one group of products is always in flight).
//
// Clusters: the kCs blocks of a cluster take neighbouring tiles that share one operand's tile
// (x's for tiles side by side along N, w's along M), and each loads a 1/kCs slice of it into all
// of them at once (a multicast), so the cluster reads that tile from L2 once. A stage is free
// again only when the consumers of every block of the cluster are done with it.
//
// Epilogue: after the last K step each consumer adds the bias, applies the activation to the
// fp32 sums, rounds to bf16, writes its 64 x 128 halves into shared memory (stmatrix, in the
// 128-byte-swizzled layout of the output's tensor map) and has the copy engine store them; the
// consumers go on to the next tile while the stores drain, and the producer has been filling
// the ring with that tile's first stages all along.
//
// Persistent: as many clusters as fit at once (or tiles), cluster c taking cluster tiles c,
// c + clusters, ... Cluster tiles are numbered in bands of kBand rows, down each band first, so
// the tiles in flight at once cover a few bands' x rows and a few dozen of w's column tiles,
// and both stay in L2.
#include <cuda.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>

#include "core/cuda/check.h"
#include "core/cuda/device.h"
#include "core/cuda/stream.h"
#include "kernels/cuda/activation.cuh"
#include "kernels/cuda/attention/launch.h"
#include "kernels/cuda/attention/tiles.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm/gemm_act.h"
#include "kernels/cuda/gemm/qdecode.cuh"
#include "kernels/cuda/gemm/qlinear.h"
#include "kernels/cuda/hopper.cuh"
#include "kernels/cuda/wgmma.cuh"
#include "kernels/quant_layout.h"

namespace llmk::cuda {

namespace {

using bf16 = __nv_bfloat16;
using cpu::grad::Act;

std::atomic<bool> g_enabled{true};

// A quantised w is staged by units of 4 K steps (256 weights of a row: a super-block of the
// k-quants, 8 blocks of the others): its values, kUnitBytes contiguous bytes a row, and its meta
// from the 16-byte boundary below the unit's first byte (kMetaVecs 16-byte vectors cover it).
template <DType kW>
inline constexpr int kUnitBytes = kW == DType::Q8_0   ? 256
                                  : kW == DType::Q6_K ? 192
                                                      : 128;
// The types qgemm is built for (Q5_1 and Q5_K take the dequantised bands: qlinear.h).
template <DType kW>
inline constexpr bool kQgemmType = !(kW == DType::Q5_1 || kW == DType::Q5_K);
template <DType kW>
inline constexpr int kMetaVecs = kW == DType::Q4_K   ? 1
                                 : kW == DType::Q4_1 ? 3
                                 : kW == DType::Q5_0 ? 4
                                                     : 2;

// A block's tile is 128 x kBN; a cluster's kCs blocks share x's tile (kShareA: tiles side by
// side along N) or w's (along M). kW: w's type, bf16 (loaded by TMA; warpgroup 0 produces, 1 and
// 2 consume) or a quantised one (dequantised into the stages by warpgroups 0 and 3: 128 x 128
// tiles, x shared).
template <int kBN, int kCs, bool kShareA, DType kW = DType::BF16>
struct GemmCfg {
  static constexpr int kBM = 128, kBK = 64, kBand = 8;
  static constexpr bool kQuant = kW != DType::BF16;
  static constexpr int kThreads = kQuant ? 512 : 384;
  static constexpr int kABytes = kBM * kBK * 2;
  static constexpr int kBBytes = kBN * kBK * 2;
  static constexpr int kStageBytes = kABytes + kBBytes;
  // A quantised w: two slots of a unit (4 K steps) of the tile's 128 rows, one being decoded
  // while the next is copied: values (kPitch bytes a row, its 16-byte pieces swizzled by the
  // row), then meta (kMetaVecs x 16 bytes a row).
  static constexpr int kPitch = kQuant ? (kUnitBytes<kW> > 128 ? 256 : 128) : 0;
  static constexpr int kSlotBytes = kQuant ? 128 * (kPitch + kMetaVecs<kW> * 16) : 0;
  static constexpr int kRawBytes = 2 * kSlotBytes;
  static constexpr int kStages = (192 * 1024 - kRawBytes) / kStageBytes;  // bf16: 4 at kBN 256
  static constexpr int kOffRaw = kStages * kStageBytes;
  static constexpr int kOffOut = kOffRaw + kRawBytes;  // 16 KiB per consumer
  static constexpr int kOffBar = kOffOut + 2 * 16384;  // full[s], then empty[s]
  static constexpr int kSmemBytes = 1024 + kOffBar + 2 * kStages * 8;
  // The cluster's tile, in block tiles along M and N, and in elements.
  static constexpr int kCm = kShareA ? 1 : kCs, kCn = kShareA ? kCs : 1;
  static constexpr int kClusterBM = kBM * kCm, kClusterBN = kBN * kCn;
  // Rows of the tensor-map boxes: the shared operand is loaded in kCs slices.
  static constexpr int kBoxA = kShareA ? kBM / kCs : kBM, kBoxB = kShareA ? kBN : kBN / kCs;
  static constexpr uint16_t kMask = (1u << kCs) - 1;
  static_assert(!kQuant || (kBoxB == 128 && kShareA && kStages >= 3),
                "a quantised w: 128-row tiles, x shared, 3 stages or more");
};

struct GemmParams {
  const bf16* bias;
  bf16* y;  // accumulate: y's values are added to the sums (rows ldy elements apart)
  int64_t ldy;
  // A quantised w (kernels/quant_layout.h): the values and meta regions, their bytes a row, and
  // the chunks a row.
  const uint8_t* wq;
  const uint8_t* wm;
  int64_t qrow, mrow;
  int chunks;
  int M, N, K;
  bool z;  // the pre-activation is wanted (maps.z is set)
  bool accumulate;
};

struct GemmMaps {
  CUtensorMap x, w;  // [M][K] and [N][K] bf16, boxes of 64 columns x kBoxA / kBoxB rows
  CUtensorMap y, z;  // [M][N] bf16, boxes of 64 x 64
};

// The cluster tile numbered t: its first row and column. Numbered in bands of kBand cluster-tile
// rows, down each band's rows first.
template <class C>
__device__ __forceinline__ void cluster_tile_origin(int t, int m_ct, int n_ct, int& m0, int& n0) {
  const int band = t / (C::kBand * n_ct), in = t - band * C::kBand * n_ct;
  const int rows = min(C::kBand, m_ct - band * C::kBand);
  m0 = (band * C::kBand + in % rows) * C::kClusterBM;
  n0 = (in / rows) * C::kClusterBN;
}

template <int kBN, int kCs, bool kShareA, Act kAct, DType kW>
__global__ void __cluster_dims__(kCs, 1, 1) __launch_bounds__(kW == DType::BF16 ? 384 : 512, 1)
    gemm_act_kernel(const __grid_constant__ GemmMaps maps, const GemmParams p) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();  // wgmma exists on sm_90a only; the host launches this kernel on sm_90 devices only
#else
  using C = GemmCfg<kBN, kCs, kShareA, kW>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
  const uint32_t full0 = base + C::kOffBar, empty0 = full0 + C::kStages * 8;
  const int wg = threadIdx.x / 128;
  const uint32_t rank = cluster_rank();
  if (threadIdx.x == 0) {
    for (int s = 0; s < C::kStages; ++s) {
      mbar_init(full0 + 8 * s, C::kQuant ? 1 + 8 : 1);  // + each producer warp's rows
      mbar_init(empty0 + 8 * s, 8 * kCs);  // one arrival per consumer warp of every block
    }
    mbar_init_fence();
  }
  cluster_barrier();  // the peers' barriers exist before anything reaches them

  const int m_ct = (p.M + C::kClusterBM - 1) / C::kClusterBM;
  const int n_ct = (p.N + C::kClusterBN - 1) / C::kClusterBN;
  const int tiles = m_ct * n_ct, k_steps = (p.K + 63) / 64;
  const int cluster = blockIdx.x / kCs, clusters = gridDim.x / kCs;
  // This block's tile within its cluster's.
  const int dm = kShareA ? 0 : static_cast<int>(rank) * C::kBM;
  const int dn = kShareA ? static_cast<int>(rank) * kBN : 0;

  if (wg == 0 || wg == 3) {  // wg 3: a quantised w's second producer
    if constexpr (!C::kQuant) {
      if (threadIdx.x == 0) {
        int stage = 0;
        uint32_t phase = 0;
        for (int t = cluster; t < tiles; t += clusters) {
          int m0, n0;
          cluster_tile_origin<C>(t, m_ct, n_ct, m0, n0);
          for (int k = 0; k < k_steps; ++k) {
            mbar_wait(empty0 + 8 * stage, phase ^ 1);  // free in every block
            const uint32_t sa = base + stage * C::kStageBytes, sb = sa + C::kABytes;
            const uint32_t full = full0 + 8 * stage;
            mbar_arrive_expect_tx(full, C::kStageBytes);
            if constexpr (kShareA) {
              tma_load_multicast(sa + rank * (C::kBoxA * 128), &maps.x, k * 64,
                                 m0 + rank * C::kBoxA, full, C::kMask);
              tma_load(sb, &maps.w, k * 64, n0 + dn, full);
            } else {
              tma_load(sa, &maps.x, k * 64, m0 + dm, full);
              tma_load_multicast(sb + rank * (C::kBoxB * 128), &maps.w, k * 64,
                                 n0 + rank * C::kBoxB, full, C::kMask);
            }
            if (++stage == C::kStages) stage = 0, phase ^= 1;
          }
        }
      }
    } else {
      // A quantised w: threads r of warpgroups 0 and 3 (part 0, 1) fill row r of each stage's w
      // tile (the tile's row n0 + dn + r; past N the last row again, whose columns are not
      // stored), each half of a K step's chunks, decoded as qdequant does (each weight's fp32
      // value rounded once to bf16) and written in the 128-byte swizzle TMA would give; thread 0
      // also has TMA load x. The 256 threads copy each unit of 4 K steps (every row's values and
      // meta) together, by cp.async in 16-byte pieces a warp's lanes take along the rows (whole
      // lines), one unit ahead of the decode.
      using Q = qdec::Quad<kW>;
      constexpr int kU = kUnitBytes<kW> / 16, kMV = kMetaVecs<kW>;
      constexpr int kStepChunks = kW == DType::Q8_0 ? 4 : 2;  // a row's chunks a K step
      const int r = static_cast<int>(threadIdx.x % 128), part = wg == 0 ? 0 : 1;
      const int tp = 128 * part + r;
      const uint32_t raw = base + C::kOffRaw;
      const uint8_t* raw_ptr = smem_raw + (raw - smem_addr(smem_raw));
      const uint8_t* meta_end = p.wm + static_cast<int64_t>(p.N) * p.mrow;
      const int units = (k_steps + 3) / 4;
      // The byte offset in a row's values, and the meta span's start, of unit u's first chunk.
      const auto unit_values = [](int u) { return qdec::qvec_offset<kW>(4 * kStepChunks * u, 0); };
      const auto first_row = [&](int t) {
        int m0, n0;
        cluster_tile_origin<C>(t, m_ct, n_ct, m0, n0);
        return n0 + dn;
      };
      // The next unit to copy: its tile, unit and slot.
      int it = cluster, iu = 0, islot = 0;
      int irow0 = it < tiles ? first_row(it) : 0;
      const auto issue = [&] {
        if (it < tiles) {
          const uint32_t slot = raw + islot * C::kSlotBytes;
          const int off = unit_values(iu);
          for (int q = tp; q < 128 * kU; q += 256) {
            const int row = q / kU, piece = q % kU;
            const int64_t n = min(irow0 + row, p.N - 1);
            const bool live = off + 16 * piece + 16 <= p.qrow;  // past the row: zeros
            attn::cp_async_16_at(slot + row * C::kPitch + ((piece ^ (row % 8)) * 16),
                                 live ? p.wq + n * p.qrow + off + 16 * piece : p.wq, live);
          }
          const int moff = qdec::meta_start<kW>(4 * kStepChunks * iu);
          for (int q = tp; q < 128 * kMV; q += 256) {
            const int row = q / kMV, v = q % kMV;
            const uint8_t* span = p.wm + min(irow0 + row, p.N - 1) * p.mrow + moff;
            const uint8_t* from = span - (reinterpret_cast<uintptr_t>(span) & 15) + 16 * v;
            const int64_t left = meta_end - from;  // the bytes past the tensor's end read as zeros
            const int bytes = left >= 16 ? 16 : left > 0 ? static_cast<int>(left) : 0;
            attn::cp_async_16_n(slot + 128 * C::kPitch + (row * kMV + v) * 16,
                                bytes > 0 ? from : p.wm, bytes);
          }
          if (++iu == units) {
            iu = 0;
            it += clusters;
            if (it < tiles) irow0 = first_row(it);
          }
        }
        attn::cp_async_commit();
        islot ^= 1;
      };
      issue();
      int stage = 0, slot = 0;
      uint32_t phase = 0;
      const uint4 zero = make_uint4(0, 0, 0, 0);
      for (int t = cluster; t < tiles; t += clusters) {
        int m0, n0;
        cluster_tile_origin<C>(t, m_ct, n_ct, m0, n0);
        const int64_t row = min(n0 + dn + r, p.N - 1);
        for (int k = 0; k < k_steps; ++k) {
          if (k % 4 == 0) {
            // This thread's copies of the unit are done; the barrier makes everyone's visible
            // and says every thread has finished decoding from the other slot, which the next
            // unit's copies refill.
            attn::cp_async_wait<0>();
            named_barrier_sync(3, 256);
            slot = islot ^ 1;
            issue();
          }
          const uint32_t vals = raw + slot * C::kSlotBytes + r * C::kPitch;
          const int u = k / 4, c0 = kW == DType::Q8_0 ? 4 * k : 4 * (k / 2);
          const uint8_t* span = p.wm + row * p.mrow + qdec::meta_start<kW>(4 * kStepChunks * u);
          const uint8_t* m = raw_ptr + slot * C::kSlotBytes + 128 * C::kPitch + r * kMV * 16 +
                             (reinterpret_cast<uintptr_t>(span) & 15) +
                             (qdec::meta_start<kW>(c0) - qdec::meta_start<kW>(4 * kStepChunks * u));
          // Vector v of chunk c of the row, from the slot.
          const auto vec_at = [&](int c, int v) {
            const int piece = (qdec::qvec_offset<kW>(c, v) - unit_values(u)) / 16;
            return ld_shared_v4(vals + ((piece ^ (r % 8)) * 16));
          };
          mbar_wait(empty0 + 8 * stage, phase ^ 1);  // free in every block
          const uint32_t sa = base + stage * C::kStageBytes, sb = sa + C::kABytes;
          const uint32_t full = full0 + 8 * stage;
          if (tp == 0) {
            mbar_arrive_expect_tx(full, C::kABytes);
            tma_load_multicast(sa + rank * (C::kBoxA * 128), &maps.x, k * 64, m0 + rank * C::kBoxA,
                               full, C::kMask);
          }
          // 16 weights at pos .. pos + 15 of the step's 64: two 16-byte units of the row.
          const uint32_t dst = sb + r * 128;
          const auto put = [&](int pos, const uint32_t(&o)[8]) {
            const int unit = pos / 8;
            st_shared_v4(dst + ((unit ^ (r % 8)) * 16), o[0], o[1], o[2], o[3]);
            st_shared_v4(dst + (((unit + 1) ^ (r % 8)) * 16), o[4], o[5], o[6], o[7]);
          };
          typename Q::Row bits{};
          if constexpr (kW == DType::Q8_0) {  // chunks 2 part, 2 part + 1 of the four
#pragma unroll
            for (int v = 0; v < 2; ++v) {
              const int i = 2 * part + v;
              uint32_t o[8] = {};
              if (c0 + i < p.chunks) {
                qdec::decode_half<kW>(vec_at(c0 + i, 0), zero, bits,
                                      Q::factor(m, c0, Q::group(i, 0)), i, 0, o);
              }
              put(Q::xoff(i, 0), o);
            }
          } else if constexpr (kW == DType::Q6_K) {  // one nibble half of chunks 2 part, + 1
            const int hi = k % 2;
#pragma unroll
            for (int v = 0; v < 2; ++v) {
              const int i = 2 * part + v;
              uint32_t o[8];
              qdec::decode_half<kW>(vec_at(c0 + i, 0), vec_at(c0 + i, 1), bits,
                                    Q::factor(m, c0, Q::group(i, hi)), i, hi, o);
              put(Q::xoff(i, hi) - 64 * hi, o);
            }
          } else {  // chunk 2k + part, both nibble halves
            const int i = 2 * (k % 2) + part;
            const bool live = c0 + i < p.chunks;
            const uint4 q = vec_at(c0 + i, 0);
            if (live) Q::row_bits(m, bits);
#pragma unroll
            for (int hi = 0; hi < 2; ++hi) {
              uint32_t o[8] = {};
              if (live) {
                qdec::decode_half<kW>(q, zero, bits, Q::factor(m, c0, Q::group(i, hi)), i, hi, o);
              }
              put(Q::xoff(i, hi) - 64 * (k % 2), o);
            }
          }
          fence_proxy_async_shared();  // wgmma reads what these stores wrote
          __syncwarp();                // (which orders the warp's stores before lane 0's arrival)
          if (threadIdx.x % 32 == 0) mbar_arrive(full);
          if (++stage == C::kStages) stage = 0, phase ^= 1;
        }
      }
      attn::cp_async_wait<0>();
    }
  } else {
    // Consumer c owns rows [64 c, 64 c + 64) of each tile.
    const int c = wg - 1, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    const bool leader = threadIdx.x % 128 == 0;  // issues and waits for the output stores
    const uint32_t out = base + C::kOffOut + c * 16384;
    float acc[kBN / 2];
    int stage = 0;
    uint32_t phase = 0;
    auto release = [&](int s) {
      if (lane == 0) {
        mbar_arrive(empty0 + 8 * s);
#pragma unroll
        for (uint32_t r = 1; r < kCs; ++r) {
          mbar_arrive_remote(map_to_rank(empty0 + 8 * s, (rank + r) % kCs));
        }
      }
    };
    for (int t = cluster; t < tiles; t += clusters) {
      int m0, n0;
      cluster_tile_origin<C>(t, m_ct, n_ct, m0, n0);
      m0 += dm;
      n0 += dn;
      int prev = -1;
      for (int k = 0; k < k_steps; ++k) {
        mbar_wait(full0 + 8 * stage, phase);
        const uint32_t sa = base + stage * C::kStageBytes + c * (64 * 128);
        const uint32_t sb = base + stage * C::kStageBytes + C::kABytes;
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          wgmma_ss<bf16, kBN>(acc, wgmma_desc_sw128(sa + kk * 32, 16, 1024),
                              wgmma_desc_sw128(sb + kk * 32, 16, 1024), k > 0 || kk > 0);
        }
        wgmma_commit();
        wgmma_wait<1>();
        if (prev >= 0) release(prev);
        prev = stage;
        if (++stage == C::kStages) stage = 0, phase ^= 1;
      }
      wgmma_wait<0>();
      wgmma_fence_operand(acc);
      if (prev >= 0) release(prev);

      // Epilogue, by 64 x 128 halves: the thread holds rows lane / 4 and lane / 4 + 8 of its
      // warp's 16, two columns of each 8-column group j.
      const int col0 = n0 + 2 * (lane % 4);
      const int64_t row0 = m0 + 64 * c + warp * 16 + lane / 4;
      // stmatrix: lane gives row (lane % 8) + 8 ((lane / 8) % 2) of the warp's 16, column group
      // +(lane / 16) of the pair of groups stored.
      const int srow = warp * 16 + (lane / 8) % 2 * 8 + lane % 8;
      auto emit = [&](const CUtensorMap* map, bool activate) {
#pragma unroll
        for (int h = 0; h < kBN / 128; ++h) {
          if (leader) bulk_wait_read();  // the previous stores have read the buffer
          named_barrier_sync(1 + c, 128);
#pragma unroll
          for (int jj = 0; jj < 16; jj += 2) {
            uint32_t r[4];
#pragma unroll
            for (int q = 0; q < 2; ++q) {
              const int j = 16 * h + jj + q, col = col0 + 8 * j;
              float b0 = 0.0f, b1 = 0.0f;
              if (p.bias != nullptr && col < p.N) {
                const __nv_bfloat162 b = *reinterpret_cast<const __nv_bfloat162*>(p.bias + col);
                b0 = __low2float(b);
                b1 = __high2float(b);
              }
              float v[4] = {acc[4 * j] + b0, acc[4 * j + 1] + b1, acc[4 * j + 2] + b0,
                            acc[4 * j + 3] + b1};
              if (p.accumulate && col < p.N) {  // rows row0 (v[0], v[1]) and row0 + 8
#pragma unroll
                for (int hh = 0; hh < 2; ++hh) {
                  const int64_t row = row0 + 8 * hh;
                  if (row < p.M) {
                    const __nv_bfloat162 o =
                        *reinterpret_cast<const __nv_bfloat162*>(p.y + row * p.ldy + col);
                    v[2 * hh] += __low2float(o);
                    v[2 * hh + 1] += __high2float(o);
                  }
                }
              }
              if (activate) {
#pragma unroll
                for (int e = 0; e < 4; ++e) v[e] = act_fast<kAct>(v[e]);
              }
              r[2 * q] = pack_bf16x2(v[0], v[1]);
              r[2 * q + 1] = pack_bf16x2(v[2], v[3]);
            }
            const int chunk = jj + lane / 16;  // 16-byte column chunk of the half, 0..15
            stsm_x4(out + (chunk / 8) * 8192 + srow * 128 + (((chunk % 8) ^ (srow % 8)) * 16), r);
          }
          fence_proxy_async_shared();  // the copy engine reads what stmatrix wrote
          named_barrier_sync(1 + c, 128);
          if (leader) {
            tma_store(map, out, n0 + 128 * h, m0 + 64 * c);
            tma_store(map, out + 8192, n0 + 128 * h + 64, m0 + 64 * c);
            bulk_commit();
          }
        }
      };
      if (p.z) emit(&maps.z, false);
      emit(&maps.y, kAct != Act::None);
    }
    if (leader) bulk_wait_read();  // the stores have read shared memory before the block ends
  }
  // No block leaves while another may still write its shared memory or barriers.
  __syncwarp();
  cluster_barrier();
#endif
}

// A [rows][cols] bf16 tensor map (rows ld elements apart, cols by default) with boxes of 64
// columns x box_rows rows, 128-byte swizzle.
bool encode_rows(CUtensorMap* map, const void* base, int64_t rows, int64_t cols, int box_rows,
                 int64_t ld = 0) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = attn::tensor_map_encoder();
  if (encode == nullptr) return false;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(ld > 0 ? ld : cols) * 2};
  const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t unit[2] = {1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(base), dims, strides,
                box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <int kBN, int kCs, bool kShareA, Act kAct, DType kW = DType::BF16>
void launch(const GemmMaps& maps, const GemmParams& p, int tiles) {
  using C = GemmCfg<kBN, kCs, kShareA, kW>;
  auto* kernel = gemm_act_kernel<kBN, kCs, kShareA, kAct, kW>;
  // Clusters that fit on the device at once (the grid is persistent: one wave of them).
  static const int resident = [&] {
    LLMK_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes));
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(static_cast<unsigned>(device_info().sm_count / kCs * kCs));
    cfg.blockDim = dim3(C::kThreads);
    cfg.dynamicSmemBytes = C::kSmemBytes;
    int n = 0;
    LLMK_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&n, kernel, &cfg));
    return std::max(n, 1);
  }();
  const int clusters = std::min(tiles, resident);
  kernel<<<kCs * clusters, C::kThreads, C::kSmemBytes, current_stream()>>>(maps, p);
  check_launch("gemm_act");
}

// Encodes the tensor maps and launches; false (nothing launched) if the driver refused them.
template <int kBN, int kCs, bool kShareA>
bool launch_act(const GemmActArgs& a) {
  using C = GemmCfg<kBN, kCs, kShareA>;
  GemmMaps maps;
  if (!encode_rows(&maps.x, a.x, a.M, a.K, C::kBoxA) ||
      !encode_rows(&maps.w, a.w, a.N, a.K, C::kBoxB) || !encode_rows(&maps.y, a.y, a.M, a.N, 64) ||
      (a.z != nullptr && !encode_rows(&maps.z, a.z, a.M, a.N, 64))) {
    return false;
  }
  GemmParams p{};
  p.bias = static_cast<const bf16*>(a.bias);
  p.M = static_cast<int>(a.M);
  p.N = static_cast<int>(a.N);
  p.K = static_cast<int>(a.K);
  p.z = a.z != nullptr;
  const int tiles = static_cast<int>(ceil_div(a.M, C::kClusterBM) * ceil_div(a.N, C::kClusterBN));
  switch (a.act) {
    case Act::SiLU:
      launch<kBN, kCs, kShareA, Act::SiLU>(maps, p, tiles);
      break;
    case Act::GeluTanh:
      launch<kBN, kCs, kShareA, Act::GeluTanh>(maps, p, tiles);
      break;
    case Act::GeluErf:
      launch<kBN, kCs, kShareA, Act::GeluErf>(maps, p, tiles);
      break;
    case Act::None:
      launch<kBN, kCs, kShareA, Act::None>(maps, p, tiles);
      break;
  }
  return true;
}

// qgemm's launch for w of type kW: x's and y's tensor maps (w is read by the producer threads).
template <DType kW>
bool launch_q(const QLinearArgs& a) {
  using C = GemmCfg<128, 2, true, kW>;
  GemmMaps maps;
  if (!encode_rows(&maps.x, a.x, a.M, a.K, C::kBoxA, a.ldx) ||
      !encode_rows(&maps.y, a.out, a.M, a.N, 64, a.ldo)) {
    return false;
  }
  const qlayout::Regions w = qlayout::regions(kW, a.w, a.N, a.K);
  GemmParams p{};
  p.bias = static_cast<const bf16*>(a.bias);
  p.y = static_cast<bf16*>(a.out);
  p.ldy = a.ldo;
  p.qrow = w.qrow;
  p.mrow = w.mrow;
  p.wq = w.q;
  p.wm = w.meta;
  p.chunks = qdec::chunks_per_row(kW, a.K);
  p.M = static_cast<int>(a.M);
  p.N = static_cast<int>(a.N);
  p.K = static_cast<int>(a.K);
  p.accumulate = a.accumulate;
  const int tiles = static_cast<int>(ceil_div(a.M, C::kClusterBM) * ceil_div(a.N, C::kClusterBN));
  launch<128, 2, true, Act::None, kW>(maps, p, tiles);
  return true;
}

}  // namespace

bool qgemm_applies(const QLinearArgs& a) {
  if (!g_enabled.load(std::memory_order_relaxed)) return false;
  if (device_info().compute_capability() != 90) return false;
  bool built = false;
  qdec::for_type(a.wtype, [&]<DType T>() { built = kQgemmType<T>; });
  if (!built) return false;
  const qlayout::Layout l = qlayout::layout(a.wtype);
  constexpr int64_t kMax = int64_t{1} << 30;
  if (l.block_elems <= 0 || a.K <= 0 || a.K % l.block_elems != 0 || a.M <= 0 || a.N <= 0 ||
      a.M > kMax || a.N > kMax || a.K > kMax) {
    return false;
  }
  if (a.out_dtype != DType::BF16 || (a.bias != nullptr && a.bias_dtype != DType::BF16)) {
    return false;
  }
  if (a.K % 8 != 0 || a.ldx % 8 != 0 || a.ldo % 8 != 0 || a.ldx < a.K || a.ldo < a.N) return false;
  for (const void* ptr : {static_cast<const void*>(a.out), a.x, a.w, a.bias}) {
    if (ptr != nullptr && !is_aligned(ptr, 16)) return false;
  }
  return true;
}

bool qgemm(const QLinearArgs& a) {
  if (!qgemm_applies(a)) return false;
  bool launched = false;
  qdec::for_type(a.wtype, [&]<DType T>() {
    if constexpr (kQgemmType<T>) launched = launch_q<T>(a);
  });
  return launched;
}

void set_gemm_act(bool on) { g_enabled.store(on); }

bool gemm_act_preferred(const GemmActArgs& a) {
  // Tanh GELU past 128 rows: cuBLASLt's GELU epilogue ran faster (H100, gemm_act_bench: 1.10
  // against 1.15 times the plain GEMM at 8192 x 14336 x 4096).
  return !(a.act == Act::GeluTanh && a.M > 128);
}

bool gemm_act(const GemmActArgs& a) {
  if (!g_enabled.load(std::memory_order_relaxed)) return false;
  const DeviceInfo& dev = device_info();
  if (dev.compute_capability() != 90) return false;
  constexpr int64_t kMax = int64_t{1} << 30;
  if (a.M <= 0 || a.N <= 0 || a.K <= 0 || a.M > kMax || a.N > kMax || a.K > kMax) return false;
  if (a.N % 8 != 0 || a.K % 8 != 0) return false;
  for (const void* ptr :
       {static_cast<const void*>(a.y), static_cast<const void*>(a.z), a.x, a.w, a.bias}) {
    if (ptr != nullptr && !is_aligned(ptr, 16)) return false;
  }
  if (a.y == nullptr || a.x == nullptr || a.w == nullptr) return false;
  // Up to 128 rows (a decode batch; the product streams w and is bound by memory): narrow
  // tiles, 128 x 128, two blocks side by side along N sharing x's tiles, one tile per SM. More:
  // wide tiles, 128 x 256, two blocks along M sharing w's. (H100, gemm_act_bench: at 128 x
  // 16384 x 4096 the narrow ones ran level with cuBLASLt, the wide 7% slower; at 256 rows the
  // wide ones level, the narrow 9% slower; four-block clusters fit only 30 at once, 120 SMs.)
  if (a.M <= 128) return launch_act<128, 2, true>(a);
  return launch_act<256, 2, false>(a);
}

}  // namespace llmk::cuda
