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
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm/gemm_act.h"
#include "kernels/cuda/hopper.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace llmk::cuda {

namespace {

using bf16 = __nv_bfloat16;
using cpu::grad::Act;

std::atomic<bool> g_enabled{true};

// A block's tile is 128 x kBN; a cluster's kCs blocks share x's tile (kShareA: tiles side by
// side along N) or w's (along M).
template <int kBN, int kCs, bool kShareA>
struct GemmCfg {
  static constexpr int kBM = 128, kBK = 64, kBand = 8;
  static constexpr int kThreads = 384;
  static constexpr int kABytes = kBM * kBK * 2;
  static constexpr int kBBytes = kBN * kBK * 2;
  static constexpr int kStageBytes = kABytes + kBBytes;
  static constexpr int kStages = (192 * 1024) / kStageBytes;  // 4 at kBN 256, 6 at 128
  static constexpr int kOffOut = kStages * kStageBytes;       // 16 KiB per consumer
  static constexpr int kOffBar = kOffOut + 2 * 16384;         // full[s], then empty[s]
  static constexpr int kSmemBytes = 1024 + kOffBar + 2 * kStages * 8;
  // The cluster's tile, in block tiles along M and N, and in elements.
  static constexpr int kCm = kShareA ? 1 : kCs, kCn = kShareA ? kCs : 1;
  static constexpr int kClusterBM = kBM * kCm, kClusterBN = kBN * kCn;
  // Rows of the tensor-map boxes: the shared operand is loaded in kCs slices.
  static constexpr int kBoxA = kShareA ? kBM / kCs : kBM, kBoxB = kShareA ? kBN : kBN / kCs;
  static constexpr uint16_t kMask = (1u << kCs) - 1;
};

struct GemmParams {
  const bf16* bias;
  int M, N, K;
  bool z;  // the pre-activation is wanted (maps.z is set)
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

template <int kBN, int kCs, bool kShareA, Act kAct>
__global__ void __cluster_dims__(kCs, 1, 1) __launch_bounds__(384, 1)
    gemm_act_kernel(const __grid_constant__ GemmMaps maps, const GemmParams p) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();  // wgmma exists on sm_90a only; the host launches this kernel on sm_90 devices only
#else
  using C = GemmCfg<kBN, kCs, kShareA>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
  const uint32_t full0 = base + C::kOffBar, empty0 = full0 + C::kStages * 8;
  const int wg = threadIdx.x / 128;
  const uint32_t rank = cluster_rank();
  if (threadIdx.x == 0) {
    for (int s = 0; s < C::kStages; ++s) {
      mbar_init(full0 + 8 * s, 1);
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

  if (wg == 0) {
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
            tma_load_multicast(sa + rank * (C::kBoxA * 128), &maps.x, k * 64, m0 + rank * C::kBoxA,
                               full, C::kMask);
            tma_load(sb, &maps.w, k * 64, n0 + dn, full);
          } else {
            tma_load(sa, &maps.x, k * 64, m0 + dm, full);
            tma_load_multicast(sb + rank * (C::kBoxB * 128), &maps.w, k * 64, n0 + rank * C::kBoxB,
                               full, C::kMask);
          }
          if (++stage == C::kStages) stage = 0, phase ^= 1;
        }
      }
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

// A [rows][cols] bf16 tensor map with boxes of 64 columns x box_rows rows, 128-byte swizzle.
bool encode_rows(CUtensorMap* map, const void* base, int64_t rows, int64_t cols, int box_rows) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = attn::tensor_map_encoder();
  if (encode == nullptr) return false;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(cols) * 2};
  const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t unit[2] = {1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(base), dims, strides,
                box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <int kBN, int kCs, bool kShareA, Act kAct>
void launch(const GemmMaps& maps, const GemmParams& p, int tiles) {
  using C = GemmCfg<kBN, kCs, kShareA>;
  auto* kernel = gemm_act_kernel<kBN, kCs, kShareA, kAct>;
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
  const GemmParams p{static_cast<const bf16*>(a.bias), static_cast<int>(a.M), static_cast<int>(a.N),
                     static_cast<int>(a.K), a.z != nullptr};
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

}  // namespace

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
