// The fallback attention kernel: any even head dim up to kGenericMaxD, every feature of
// AttentionArgs (bf16/fp16/f32, GQA, positions or varlen batches with bottom-right causal masks,
// batched decode by positions, non-causal, paged KV, sliding window, softcap, LSE), and no
// tensor cores. ops::attention runs it for the
// shapes the prefill and decode kernels are not built for (head dims other than
// 64/80/96/112/128/256: the tiny test models' 16). Correct and simple rather than fast: one block
// of four warps per (query row, head); each warp takes every fourth key, its lanes holding two
// elements of D each per 64, with an online softmax; the warps' partial results merge in shared
// memory.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "core/cuda/check.h"
#include "core/cuda/stream.h"
#include "kernels/cuda/attention/attention.h"
#include "kernels/cuda/vec.cuh"
#include "kernels/kv_quant.h"

namespace llmk::cuda::attn {

namespace {

constexpr int kWarps = 4;
constexpr int kPairs = kGenericMaxD / 64;  // element pairs per lane

// Where query row r sits: its sequence's key count, its position among those keys, and the
// sequence (for the page table; key rows start at k_row0 without one).
struct RowInfo {
  int64_t n_keys, pos, k_row0;
  int seq;
};

__device__ RowInfo row_info(const AttentionArgs& a, int r) {
  RowInfo info{};
  if (a.cu_q == nullptr) {  // one sequence; positions[] place the queries
    info.pos = a.positions[r];
    info.n_keys = a.causal ? info.pos + 1 : a.L;
    return info;
  }
  int lo = 0, hi = a.B - 1;  // the last b with cu_q[b] <= r
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (a.cu_q[mid] <= r)
      lo = mid;
    else
      hi = mid - 1;
  }
  const int b = lo;
  info.seq = b;
  if (a.cu_k == nullptr) {  // batched decode: positions[] per row, keys up to the last query's
    info.pos = a.positions[r];
    info.n_keys = a.positions[a.cu_q[b + 1] - 1] + 1;
    return info;
  }
  const int64_t tq = a.cu_q[b + 1] - a.cu_q[b];
  info.n_keys = a.cu_k[b + 1] - a.cu_k[b];
  info.pos = info.n_keys - tq + (r - a.cu_q[b]);  // bottom-right aligned
  info.k_row0 = a.page_table != nullptr ? 0 : a.cu_k[b];
  return info;
}

__device__ __forceinline__ int64_t key_row(const AttentionArgs& a, const RowInfo& info, int64_t j) {
  if (a.page_table == nullptr) return info.k_row0 + j;
  const int page = a.page_table[static_cast<int64_t>(info.seq) * a.pages_per_seq + j / a.page_size];
  return static_cast<int64_t>(page) * a.page_size + j % a.page_size;
}

// Elements off, off + 1 of a K or V cache: of type T (kFmt 0), or 8-bit codes (1 E4M3, 2 int8).
template <typename T, int kFmt>
__device__ __forceinline__ float2 kv_pair(const void* base, int64_t off) {
  if constexpr (kFmt == 0) {
    return load_pair(static_cast<const T*>(base) + off);
  } else if constexpr (kFmt == 1) {  // the conversion instruction: kvq's values exactly
    const auto pair =
        *reinterpret_cast<const __nv_fp8x2_storage_t*>(static_cast<const uint8_t*>(base) + off);
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3);
    return __half22float2(*reinterpret_cast<const __half2*>(&h));
  } else {
    const uint8_t* b = static_cast<const uint8_t*>(base) + off;
    return float2{kvq::decode<kvq::Format::I8>(b[0]), kvq::decode<kvq::Format::I8>(b[1])};
  }
}

template <typename T, int kFmt>
__global__ void __launch_bounds__(kWarps* kWarp) generic_kernel(const AttentionArgs a) {
  const int r = blockIdx.x, h = blockIdx.y;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int hk = h / (a.Hq / a.Hkv);
  const RowInfo info = row_info(a, r);
  // Keys this row sees: (pos - window, pos] (causal) or all of its sequence's.
  int64_t hi = a.causal && info.pos < info.n_keys - 1 ? info.pos : info.n_keys - 1;
  int64_t lo = a.causal && a.window > 0 ? info.pos - a.window + 1 : 0;
  if (lo < 0) lo = 0;

  const T* q = reinterpret_cast<const T*>(a.q) + r * a.q_t + h * a.q_h;
  float qv[kPairs][2];
#pragma unroll
  for (int p = 0; p < kPairs; ++p) {
    const int e = 2 * lane + 64 * p;
    const float2 f = e < a.D ? load_pair(q + e) : float2{0.0f, 0.0f};
    qv[p][0] = f.x * a.scale;
    qv[p][1] = f.y * a.scale;
  }
  float m = -INFINITY, l = 0.0f;
  float acc[kPairs][2] = {};
  for (int64_t j = lo + warp; j <= hi; j += kWarps) {
    const int64_t row = key_row(a, info, j);
    const int64_t k_off = hk * a.k_h + row * a.k_t, v_off = hk * a.v_h + row * a.v_t;
    float s = 0.0f;
#pragma unroll
    for (int p = 0; p < kPairs; ++p) {
      const int e = 2 * lane + 64 * p;
      if (e < a.D) {
        const float2 f = kv_pair<T, kFmt>(a.k, k_off + e);
        s += qv[p][0] * f.x + qv[p][1] * f.y;
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
    float v_scale = 1.0f;
    if constexpr (kFmt != 0) {
      s *= a.k_scale[row * a.Hkv + hk];
      v_scale = a.v_scale[row * a.Hkv + hk];
    }
    if (a.softcap > 0.0f) s = a.softcap * tanhf(s / a.softcap);
    const float m_new = fmaxf(m, s);
    const float c = __expf(m - m_new), w = __expf(s - m_new);
    l = l * c + w;
    m = m_new;
    const float wv = w * v_scale;
#pragma unroll
    for (int p = 0; p < kPairs; ++p) {
      const int e = 2 * lane + 64 * p;
      const float2 f = e < a.D ? kv_pair<T, kFmt>(a.v, v_off + e) : float2{0.0f, 0.0f};
      acc[p][0] = acc[p][0] * c + wv * f.x;
      acc[p][1] = acc[p][1] * c + wv * f.y;
    }
  }
  // Merge the warps: each publishes (m, l) and its accumulators.
  __shared__ float sm[kWarps], sl[kWarps];
  __shared__ float sacc[kWarps][kGenericMaxD];
  if (lane == 0) {
    sm[warp] = m;
    sl[warp] = l;
  }
#pragma unroll
  for (int p = 0; p < kPairs; ++p) {
    sacc[warp][2 * lane + 64 * p] = acc[p][0];
    sacc[warp][2 * lane + 64 * p + 1] = acc[p][1];
  }
  __syncthreads();
  float m_all = -INFINITY;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) m_all = fmaxf(m_all, sm[w]);
  float scale[kWarps], l_all = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    scale[w] = sm[w] == -INFINITY ? 0.0f : __expf(sm[w] - m_all);
    l_all += sl[w] * scale[w];
  }
  // A row with no keys (only possible for malformed varlen input) writes zeros.
  const float inv = l_all > 0.0f ? 1.0f / l_all : 0.0f;
  T* out = reinterpret_cast<T*>(a.out) + r * a.out_t + h * a.out_h;
  for (int e = 2 * threadIdx.x; e < a.D; e += 2 * kWarps * kWarp) {
    float x = 0.0f, y = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      x += sacc[w][e] * scale[w];
      y += sacc[w][e + 1] * scale[w];
    }
    store_pair(out + e, x * inv, y * inv);
  }
  if (a.lse != nullptr && threadIdx.x == 0) {
    a.lse[static_cast<int64_t>(h) * a.T + r] = l_all > 0.0f ? m_all + logf(l_all) : -INFINITY;
  }
}

template <typename T>
void launch_typed(const AttentionArgs& a) {
  const dim3 grid(static_cast<unsigned>(a.T), static_cast<unsigned>(a.Hq));
  if (a.kv_format == 1) {
    generic_kernel<T, 1><<<grid, kWarps * kWarp, 0, current_stream()>>>(a);
  } else if (a.kv_format == 2) {
    generic_kernel<T, 2><<<grid, kWarps * kWarp, 0, current_stream()>>>(a);
  } else {
    generic_kernel<T, 0><<<grid, kWarps * kWarp, 0, current_stream()>>>(a);
  }
}

}  // namespace

void launch_generic(const AttentionArgs& a) {
  if (a.fp32) {
    launch_typed<float>(a);
  } else if (a.fp16) {
    launch_typed<__half>(a);
  } else {
    launch_typed<__nv_bfloat16>(a);
  }
  LLMK_CUDA_CHECK(cudaGetLastError());
}

}  // namespace llmk::cuda::attn
