// Decode attention: T <= 8 queries over a long KV cache. Memory-bound, so each K/V row is read
// once per KV group: one block serves all G = Hq / Hkv query heads of a KV head for one query,
// and the keys that query sees are split over a thread-block cluster of kSplit blocks. Each block
// streams its share of keys through shared memory in double-buffered tiles (cp.async), keeps a
// running max, sum and fp32 accumulator per query head in shared memory, and the cluster then
// combines its partial results through distributed shared memory: no global workspace, no
// second launch.
//
// Grid (kSplit, Hkv, T), cluster (kSplit, 1, 1); kSplit depends only on the SM count, Hkv, T
// and the cache capacity, and each block derives its key range from positions[t] on the device,
// so a captured launch stays valid at every position.
//
// Correct first; scalar fp32 FMAs (no tensor cores), not yet tuned.
#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "core/cuda/check.h"
#include "core/cuda/device.h"
#include "core/cuda/stream.h"
#include "kernels/cuda/attention/attention.h"
#include "kernels/cuda/attention/launch.h"
#include "kernels/cuda/attention/tiles.cuh"

namespace llmk::cuda::attn {

namespace {

namespace cg = cooperative_groups;

template <int kD>
struct DecodeConfig {
  static constexpr int kBlockN = kD <= 128 ? 64 : 32;  // keys per tile (a multiple of 32)
  static constexpr int kThreads = 256;  // 8 warps: one (head, key) pair per thread at G = 4
  static constexpr int kWarps = kThreads / kWarp;
  static constexpr int kPitch = kD + 8;  // smem row pitch (elements): conflict-free 16-byte reads
  // Two stages of K and V tiles, then fp32 state for G query heads.
  static constexpr size_t kTileBytes = static_cast<size_t>(4) * kBlockN * kPitch * sizeof(bf16);
  static size_t smem_bytes(int G) {
    // q [G][kD], acc [G][kD], p [G][kBlockN], m, l, alpha [G]
    return kTileBytes + sizeof(float) * static_cast<size_t>(G) * (2 * kD + kBlockN + 3);
  }
};

template <int kD>
__global__ void __launch_bounds__(DecodeConfig<kD>::kThreads) decode_kernel(const AttentionArgs a) {
  using C = DecodeConfig<kD>;
  constexpr int kBN = C::kBlockN, kP = C::kPitch, kThreads = C::kThreads;
  const int G = a.Hq / a.Hkv;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* sK = reinterpret_cast<bf16*>(smem);                    // [2][kBN][kP]
  bf16* sV = sK + 2 * kBN * kP;                                // [2][kBN][kP]
  float* sQ = reinterpret_cast<float*>(smem + C::kTileBytes);  // [G][kD], scaled
  float* sAcc = sQ + G * kD;                                   // [G][kD]
  float* sP = sAcc + G * kD;                                   // [G][kBN]
  float* sM = sP + G * kBN;                                    // [G] running max (log2)
  float* sL = sM + G;                                          // [G] running sum
  float* sAlpha = sL + G;                                      // [G] this tile's rescale

  cg::cluster_group cluster = cg::this_cluster();
  const int split = static_cast<int>(cluster.block_rank());
  const int n_split = static_cast<int>(cluster.num_blocks());
  const int hk = blockIdx.y, t = blockIdx.z;
  const int h0 = hk * G;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;

  // The keys query t sees: [lo, hi]; this block takes a kBN-aligned share of them.
  const int64_t p = a.positions[t];
  const int64_t lo = a.window > 0 ? (p - a.window + 1 > 0 ? p - a.window + 1 : 0) : 0;
  const int64_t hi = p < a.L - 1 ? p : a.L - 1;
  const int64_t n_keys = hi >= lo ? hi - lo + 1 : 0;
  const int64_t chunk = ceil_div(ceil_div(n_keys, n_split), kBN) * kBN;
  const int64_t my_lo = lo + split * chunk;
  const int64_t my_hi = my_lo + chunk - 1 < hi ? my_lo + chunk - 1 : hi;
  const int n_tiles = my_hi >= my_lo ? static_cast<int>(ceil_div(my_hi - my_lo + 1, kBN)) : 0;

  const bf16* k_head = a.k + hk * a.k_h;
  const bf16* v_head = a.v + hk * a.v_h;
  auto load_tiles = [&](int it) {
    const int64_t n0 = my_lo + static_cast<int64_t>(it) * kBN;
    const int rows = static_cast<int>(my_hi - n0 + 1 < kBN ? my_hi - n0 + 1 : kBN);
    const int buf = it % 2;
    load_tile_async<kBN, kD, kP, kThreads>(sK + buf * kBN * kP, k_head + n0 * a.k_t, a.k_t, rows);
    load_tile_async<kBN, kD, kP, kThreads>(sV + buf * kBN * kP, v_head + n0 * a.v_t, a.v_t, rows);
    cp_async_commit();
  };
  if (n_tiles > 0) load_tiles(0);

  // With a softcap the scale is applied before tanh; without, fold log2(e) into q.
  const float q_scale = a.softcap > 0.0f ? 1.0f : a.scale * kLog2e;
  for (int e = threadIdx.x; e < G * kD; e += kThreads) {
    const int g = e / kD, d = e % kD;
    sQ[e] = __bfloat162float(a.q[t * a.q_t + (h0 + g) * a.q_h + d]) * q_scale;
    sAcc[e] = 0.0f;
  }
  for (int g = threadIdx.x; g < G; g += kThreads) {
    sM[g] = -INFINITY;
    sL[g] = 0.0f;
  }

  for (int it = 0; it < n_tiles; ++it) {
    const int64_t n0 = my_lo + static_cast<int64_t>(it) * kBN;
    const int nv = static_cast<int>(my_hi - n0 + 1 < kBN ? my_hi - n0 + 1 : kBN);
    const bf16* tK = sK + (it % 2) * kBN * kP;
    const bf16* tV = sV + (it % 2) * kBN * kP;
    if (it + 1 < n_tiles) {
      load_tiles(it + 1);  // the other buffer: freed by the barrier that ended iteration it - 1
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // tile it (and q, the state) visible

    // Logits: one (head, key) pair per thread; a warp shares the head and reads 32 key rows.
    for (int idx = threadIdx.x; idx < G * kBN; idx += kThreads) {
      const int g = idx / kBN, j = idx % kBN;
      float x = -INFINITY;
      if (j < nv) {
        const float* q = sQ + g * kD;
        const bf16* k = tK + j * kP;
        float dot = 0.0f;
#pragma unroll
        for (int d = 0; d < kD; d += 8) {
          const uint4 raw = *reinterpret_cast<const uint4*>(k + d);
          const __nv_bfloat162* k2 = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const float2 kf = __bfloat1622float2(k2[i]);
            dot = fmaf(q[d + 2 * i], kf.x, dot);
            dot = fmaf(q[d + 2 * i + 1], kf.y, dot);
          }
        }
        x = a.softcap > 0.0f ? logit_log2(dot, a.scale, a.softcap) : dot;
      }
      sP[idx] = x;
    }
    __syncthreads();

    // Softmax update, one warp per head: p = exp2(x - m_new), l = l alpha + sum p.
    for (int g = warp; g < G; g += C::kWarps) {
      float x[kBN / kWarp];
      float mx = -INFINITY;
#pragma unroll
      for (int i = 0; i < kBN / kWarp; ++i) {
        x[i] = sP[g * kBN + i * kWarp + lane];
        mx = fmaxf(mx, x[i]);
      }
      mx = warp_max(mx);
      const float m_old = sM[g];
      const float m_new = fmaxf(m_old, mx);  // finite: the tile holds at least one key
      float sum = 0.0f;
#pragma unroll
      for (int i = 0; i < kBN / kWarp; ++i) {
        const float pj = exp2f(x[i] - m_new);
        sP[g * kBN + i * kWarp + lane] = pj;
        sum += pj;
      }
      sum = warp_sum(sum);
      __syncwarp();  // every lane has read sM[g] before lane 0 overwrites it
      if (lane == 0) {
        const float alpha = exp2f(m_old - m_new);
        sAlpha[g] = alpha;
        sL[g] = sL[g] * alpha + sum;
        sM[g] = m_new;
      }
    }
    __syncthreads();

    // acc = acc alpha + P V, two adjacent dims per thread.
    for (int e2 = threadIdx.x; e2 < G * kD / 2; e2 += kThreads) {
      const int g = e2 / (kD / 2), d = (e2 % (kD / 2)) * 2;
      const float alpha = sAlpha[g];
      float acc0 = sAcc[g * kD + d] * alpha, acc1 = sAcc[g * kD + d + 1] * alpha;
      const float* pg = sP + g * kBN;
      for (int j = 0; j < nv; ++j) {
        const float2 vf =
            __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(tV + j * kP + d));
        acc0 = fmaf(pg[j], vf.x, acc0);
        acc1 = fmaf(pg[j], vf.y, acc1);
      }
      sAcc[g * kD + d] = acc0;
      sAcc[g * kD + d + 1] = acc1;
    }
    __syncthreads();  // the buffers of tile it may be refilled
  }

  // Combine the cluster's partial results; block `split` writes every n_split-th slice.
  cluster.sync();
  for (int e = split * kThreads + threadIdx.x; e < G * kD; e += n_split * kThreads) {
    const int g = e / kD, d = e % kD;
    float m_all = -INFINITY;
    for (int r = 0; r < n_split; ++r) m_all = fmaxf(m_all, *cluster.map_shared_rank(sM + g, r));
    float num = 0.0f, den = 0.0f;
    for (int r = 0; r < n_split; ++r) {
      const float mr = *cluster.map_shared_rank(sM + g, r);
      if (mr == -INFINITY) continue;  // a block whose share of the keys was empty
      const float w = exp2f(mr - m_all);
      num += *cluster.map_shared_rank(sAcc + e, r) * w;
      den += *cluster.map_shared_rank(sL + g, r) * w;
    }
    a.out[t * a.out_t + (h0 + g) * a.out_h + d] =
        __float2bfloat16_rn(den > 0.0f ? num / den : 0.0f);
  }
  cluster.sync();  // keep this block's shared memory alive until the others have read it
}

}  // namespace

template <int kD>
size_t decode_smem_bytes(int group) {
  return DecodeConfig<kD>::smem_bytes(group);
}

template <int kD>
void launch_decode(const AttentionArgs& a, int split) {
  using C = DecodeConfig<kD>;
  static const bool smem_raised = [] {  // once per head dim, so capture sees no attribute calls
    LLMK_CUDA_CHECK(cudaFuncSetAttribute(decode_kernel<kD>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(device_info().max_smem_per_block_optin)));
    return true;
  }();
  (void)smem_raised;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim =
      dim3(static_cast<unsigned>(split), static_cast<unsigned>(a.Hkv), static_cast<unsigned>(a.T));
  cfg.blockDim = dim3(C::kThreads);
  cfg.dynamicSmemBytes = C::smem_bytes(a.Hq / a.Hkv);
  cfg.stream = current_stream();
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(split);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  LLMK_CUDA_CHECK(cudaLaunchKernelEx(&cfg, decode_kernel<kD>, a));
  check_launch("attention decode");
}

#define LLMK_INSTANTIATE_DECODE(D)           \
  template size_t decode_smem_bytes<D>(int); \
  template void launch_decode<D>(const AttentionArgs&, int);
LLMK_INSTANTIATE_DECODE(64)
LLMK_INSTANTIATE_DECODE(128)
LLMK_INSTANTIATE_DECODE(256)
#undef LLMK_INSTANTIATE_DECODE

}  // namespace llmk::cuda::attn
