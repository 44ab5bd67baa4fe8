// Decode attention: up to 8 query tokens per sequence over a long KV cache, contiguous or paged.
// Memory-bound: every K/V row must be read once per KV head, so one block serves `rows` query
// rows (query token x query head of one KV group) and all of them share each loaded tile.
//
// Grid (split, Hkv * groups, B); 128 threads (4 warps). Block (s, hk * groups + grp, b) takes
// the s-th of `split` equal, tile-aligned shares of the keys sequence b's queries see (their
// count is read on the device, so the grid depends only on host-known values and a captured
// launch replays at every position). The share streams through shared memory in kStages-deep
// cp.async tiles (16-byte copies; pool rows looked up in the page table per key). In a tile
// warp w takes kKeysPerWarp keys: kParts lanes per key compute the dot products for every row
// (K read from shared memory once per row group), then the warp keeps its own online softmax
// (max, sum, fp32 accumulator with kD / 32 dims per lane) in registers. At the end the 4 warps
// merge through shared memory. With split > 1 each block writes an unnormalised partial and
// its (max, sum) to a workspace; the last block of a (sequence, KV head, row group) to arrive
// (an atomic counter) combines them and resets the counter: one launch, no host sync.
//
// Scalar fp32 FMAs: with one query token (rows = G) the arithmetic is well under the memory
// time; at 8 tokens x 4 heads it is not (tensor cores would be the next step).
#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "core/cuda/check.h"
#include "core/cuda/device.h"
#include "core/cuda/stream.h"
#include "kernels/cuda/attention/attention.h"
#include "kernels/cuda/attention/launch.h"
#include "kernels/cuda/attention/tiles.cuh"

namespace llmk::cuda::attn {

namespace {

template <int kD>
struct DecodeConfig {
  static constexpr int kBlockN = kD <= 128 ? 64 : 32;  // keys per tile
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * kWarp;
  static constexpr int kKeysPerWarp = kBlockN / kWarps;   // 16 or 8
  static constexpr int kParts = kWarp / kKeysPerWarp;     // lanes per key in q.k: 2 or 4
  static constexpr int kPartDims = kD / kParts;           // dims of one lane's part of q.k
  static constexpr int kLaneDims = kD / kWarp;            // dims of the accumulator per lane
  static constexpr int kPitch = kD + 8;  // smem row pitch (elements): conflict-free 16-byte reads
  static constexpr int kStages = 3;
  static constexpr int kMaxRows = kD <= 128 ? 16 : 8;
  static constexpr size_t kStageBytes = static_cast<size_t>(2) * kBlockN * kPitch * sizeof(bf16);
  static constexpr size_t kTileBytes = kStages * kStageBytes;
  // Tiles, then q (fp32, scaled) for the block's rows. The warps' final states reuse the tiles.
  static size_t smem_bytes(int rows) {
    return kTileBytes + sizeof(float) * static_cast<size_t>(rows) * kD;
  }
  static constexpr size_t merge_bytes(int rows) {
    return sizeof(float) * static_cast<size_t>(kWarps) * rows * (kD + 2);
  }
  static_assert(kKeysPerWarp >= 8, "quarter-warps of q.k must share their q part (broadcast)");
  static_assert(kPartDims % 8 == 0 && kLaneDims >= 2, "head dim");
  static_assert(merge_bytes(kMaxRows) <= kTileBytes, "merge area must fit in the tiles");
};

// Where sequence b's queries and keys are, read from the device.
struct SeqView {
  int q0 = 0;         // first query row (of T)
  int tq = 0;         // query rows
  int64_t pos0 = 0;   // position of the first query; query i sits at pos0 + i
  int64_t key0 = 0;   // contiguous cache: row of key 0
  int64_t n_keys = 0; // keys 0 .. n_keys - 1 exist (capped by the capacity)
};

__device__ __forceinline__ SeqView seq_view(const AttentionArgs& a, int b, int64_t capacity) {
  SeqView s;
  if (a.cu_q != nullptr) {
    s.q0 = a.cu_q[b];
    s.tq = a.cu_q[b + 1] - s.q0;
    if (a.cu_k != nullptr) {
      const int64_t tk = a.cu_k[b + 1] - a.cu_k[b];
      s.key0 = a.page_table != nullptr ? 0 : a.cu_k[b];
      s.pos0 = tk - s.tq;
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

template <int kD, int kR>
__global__ void __launch_bounds__(DecodeConfig<kD>::kThreads)
    decode_kernel(const AttentionArgs a, const DecodePlan plan) {
  using C = DecodeConfig<kD>;
  constexpr int kBN = C::kBlockN, kP = C::kPitch, kThreads = C::kThreads, kS = C::kStages;
  constexpr int kKPW = C::kKeysPerWarp, kLD = C::kLaneDims;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* tiles = reinterpret_cast<bf16*>(smem);                 // [kS][K|V][kBN][kP]
  float* sQ = reinterpret_cast<float*>(smem + C::kTileBytes);  // [kR][kD]

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

  // Keys any of the block's queries sees: [lo, hi]; this block takes a tile-aligned share.
  const int64_t first_pos = sv.pos0 + row0 / G;
  const int64_t lo = a.window > 0 && first_pos - a.window + 1 > 0 ? first_pos - a.window + 1 : 0;
  const int64_t hi = sv.n_keys - 1;
  const int64_t n_keys = hi >= lo ? hi - lo + 1 : 0;
  const int64_t chunk = ceil_div(ceil_div(n_keys, n_split), kBN) * kBN;
  const int64_t my_lo = lo + split * chunk;
  const int64_t my_hi = my_lo + chunk - 1 < hi ? my_lo + chunk - 1 : hi;
  const int n_tiles = my_hi >= my_lo ? static_cast<int>(ceil_div(my_hi - my_lo + 1, kBN)) : 0;

  const bf16* k_head = a.k + hk * a.k_h;
  const bf16* v_head = a.v + hk * a.v_h;
  const int32_t* pages = paged ? a.page_table + static_cast<int64_t>(b) * a.pages_per_seq : nullptr;
  // Copies keys [n0, n0 + kBN) of K and V into stage `buf`; keys past my_hi are zero-filled.
  auto load_tile = [&](int it) {
    const int64_t n0 = my_lo + static_cast<int64_t>(it) * kBN;
    bf16* sK = tiles + (it % kS) * 2 * kBN * kP;
    bf16* sV = sK + kBN * kP;
    constexpr int kChunks = kD / 8;  // 16-byte chunks per row
    static_assert(kBN * kChunks % kThreads == 0, "tile copy: whole rounds of the block");
#pragma unroll
    for (int i = 0; i < kBN * kChunks / kThreads; ++i) {
      const int c = threadIdx.x + i * kThreads;
      const int r = c / kChunks, col = (c % kChunks) * 8;
      const int64_t j = n0 + r;
      const bool valid = j <= my_hi;
      int64_t row = 0;
      if (valid) {
        const int j32 = static_cast<int>(j);  // < capacity <= INT32_MAX
        row = paged ? static_cast<int64_t>(pages[j32 / a.page_size]) * a.page_size +
                          j32 % a.page_size
                    : sv.key0 + j;
      }
      cp_async_16(sK + r * kP + col, k_head + row * a.k_t + col, valid);
      cp_async_16(sV + r * kP + col, v_head + row * a.v_t + col, valid);
    }
  };
#pragma unroll
  for (int st = 0; st < kS - 1; ++st) {
    if (st < n_tiles) load_tile(st);
    cp_async_commit();
  }

  // q rows, scaled (with a softcap the scale goes inside tanh; otherwise log2(e) is folded in).
  const float q_scale = a.softcap > 0.0f ? 1.0f : a.scale * kLog2e;
  for (int e = threadIdx.x; e < kR * kD; e += kThreads) {
    const int r = e / kD, d = e % kD;
    float x = 0.0f;
    if (r < n_rows) {
      const int t = (row0 + r) / G, g = (row0 + r) % G;
      x = __bfloat162float(a.q[(sv.q0 + t) * a.q_t + (hk * G + g) * a.q_h + d]) * q_scale;
    }
    sQ[e] = x;
  }
  // This warp's running state (identical in every lane): max (log2 domain), sum, accumulator.
  float m[kR], l[kR], acc[kR][kLD];
  int pos[kR];  // each row's query position (< capacity <= INT32_MAX)
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
    pos[r] = r < n_rows ? static_cast<int>(sv.pos0 + (row0 + r) / G) : -1;
#pragma unroll
    for (int i = 0; i < kLD; ++i) acc[r][i] = 0.0f;
  }

  const int key_in_warp = lane % kKPW, part = lane / kKPW;
  for (int it = 0; it < n_tiles; ++it) {
    cp_async_wait<kS - 2>();  // this thread's copies of tile it have landed
    __syncthreads();          // everyone's have; everyone is done with tile it - 1 (and q is set)
    if (it + kS - 1 < n_tiles) load_tile(it + kS - 1);  // into the stage tile it - 1 used
    cp_async_commit();

    const bf16* sK = tiles + (it % kS) * 2 * kBN * kP;
    const bf16* sV = sK + kBN * kP;
    const int64_t n0 = my_lo + static_cast<int64_t>(it) * kBN;
    const int jw = warp * kKPW;  // the warp's first key in the tile

    // Logits of key jw + key_in_warp for every row: this lane's part of the dims, then the parts
    // summed across lanes.
    float s[kR];
#pragma unroll
    for (int r = 0; r < kR; ++r) s[r] = 0.0f;
    const bf16* krow = sK + (jw + key_in_warp) * kP + part * C::kPartDims;
    const float* qpart = sQ + part * C::kPartDims;
#pragma unroll 4
    for (int d = 0; d < C::kPartDims; d += 8) {
      float kf[8];
      load_bf16<8>(krow + d, kf);
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        const float4 q0 = *reinterpret_cast<const float4*>(qpart + r * kD + d);
        const float4 q1 = *reinterpret_cast<const float4*>(qpart + r * kD + d + 4);
        s[r] = fmaf(q0.x, kf[0], s[r]);
        s[r] = fmaf(q0.y, kf[1], s[r]);
        s[r] = fmaf(q0.z, kf[2], s[r]);
        s[r] = fmaf(q0.w, kf[3], s[r]);
        s[r] = fmaf(q1.x, kf[4], s[r]);
        s[r] = fmaf(q1.y, kf[5], s[r]);
        s[r] = fmaf(q1.z, kf[6], s[r]);
        s[r] = fmaf(q1.w, kf[7], s[r]);
      }
    }
    const int64_t j = n0 + jw + key_in_warp;  // this lane's key
    float p[kR];
#pragma unroll
    for (int r = 0; r < kR; ++r) {
#pragma unroll
      for (int o = kKPW; o < kWarp; o <<= 1) s[r] += __shfl_xor_sync(0xffffffffu, s[r], o);
      const bool visible =
          j <= my_hi && j <= pos[r] && (a.window <= 0 || j > pos[r] - a.window);
      const float x = !visible ? -INFINITY
                               : (a.softcap > 0.0f ? logit_log2(s[r], a.scale, a.softcap) : s[r]);
      // Online softmax over the warp's keys (lanes of other parts hold the same values).
      float mx = x;
#pragma unroll
      for (int o = 1; o < kKPW; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      const float m_new = fmaxf(m[r], mx);
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // no key yet: keep everything 0
      p[r] = exp2f(x - m_use);
      float sum = p[r];
#pragma unroll
      for (int o = 1; o < kKPW; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      const float alpha = exp2f(m[r] - m_use);
      l[r] = l[r] * alpha + sum;
      m[r] = m_new;
#pragma unroll
      for (int i = 0; i < kLD; ++i) acc[r][i] *= alpha;
    }
    // acc += P V over the warp's keys: lane owns dims lane * kLD ..; p of key jj from lane jj.
#pragma unroll
    for (int jj = 0; jj < kKPW; ++jj) {
      float vf[kLD];
      load_bf16<kLD>(sV + (jw + jj) * kP + lane * kLD, vf);
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        const float pj = __shfl_sync(0xffffffffu, p[r], jj);
#pragma unroll
        for (int i = 0; i < kLD; ++i) acc[r][i] = fmaf(pj, vf[i], acc[r][i]);
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // tiles free: the warps' states go there

  // Merge the 4 warps: [kWarps][kR][kD + 2] = accumulator, then (max, sum).
  float* merge = reinterpret_cast<float*>(smem);
  constexpr int kMS = kD + 2;
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    float* dst = merge + (warp * kR + r) * kMS;
#pragma unroll
    for (int i = 0; i < kLD; ++i) dst[lane * kLD + i] = acc[r][i];
    if (lane == 0) {
      dst[kD] = m[r];
      dst[kD + 1] = l[r];
    }
  }
  __syncthreads();

  const int rows_total = a.T * a.Hq;  // workspace rows: (query row, head)
  auto out_row = [&](int r) {         // (query row, head) index of block row r
    const int t = (row0 + r) / G, g = (row0 + r) % G;
    return (sv.q0 + t) * a.Hq + hk * G + g;
  };
  auto store_out = [&](int r, int d, const float (&o)[4], float m_all, float den) {
    const int t = (row0 + r) / G, g = (row0 + r) % G;
    const float inv = den > 0.0f ? 1.0f / den : 0.0f;
    const float v[4] = {o[0] * inv, o[1] * inv, o[2] * inv, o[3] * inv};
    store_bf16<4>(a.out + (sv.q0 + t) * a.out_t + (hk * G + g) * a.out_h + d, v);
    if (a.lse != nullptr && d == 0) {
      a.lse[static_cast<int64_t>(hk * G + g) * a.T + sv.q0 + t] =
          den > 0.0f ? (m_all + log2f(den)) * 0.6931471805599453f : -INFINITY;
    }
  };
  // Each thread: 4 consecutive dims of one row.
  for (int e = threadIdx.x * 4; e < n_rows * kD; e += kThreads * 4) {
    const int r = e / kD, d = e % kD;
    float m_all = -INFINITY;
#pragma unroll
    for (int w = 0; w < C::kWarps; ++w) m_all = fmaxf(m_all, merge[(w * kR + r) * kMS + kD]);
    const float m_use = m_all == -INFINITY ? 0.0f : m_all;
    float o[4] = {0.0f, 0.0f, 0.0f, 0.0f}, den = 0.0f;
#pragma unroll
    for (int w = 0; w < C::kWarps; ++w) {
      const float* src = merge + (w * kR + r) * kMS;
      const float wt = exp2f(src[kD] - m_use);
      den += src[kD + 1] * wt;
#pragma unroll
      for (int i = 0; i < 4; ++i) o[i] += src[d + i] * wt;
    }
    if (n_split == 1) {
      store_out(r, d, o, m_all, den);
    } else {
      const int64_t wr = static_cast<int64_t>(split) * rows_total + out_row(r);
      *reinterpret_cast<float4*>(plan.part_o + wr * kD + d) = make_float4(o[0], o[1], o[2], o[3]);
      if (d == 0) *reinterpret_cast<float2*>(plan.part_ml + wr * 2) = make_float2(m_all, den);
    }
  }
  if (n_split == 1) return;

  // The last block of this (sequence, KV head, row group) to arrive combines the partials.
  __shared__ int is_last;
  __threadfence();  // this block's partials are visible device-wide before it is counted
  __syncthreads();
  int* counter = plan.counters + (static_cast<int64_t>(b) * a.Hkv + hk) * plan.groups + grp;
  if (threadIdx.x == 0) is_last = atomicAdd(counter, 1) == n_split - 1;
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  for (int e = threadIdx.x * 4; e < n_rows * kD; e += kThreads * 4) {
    const int r = e / kD, d = e % kD;
    const int64_t row = out_row(r);
    float m_all = -INFINITY;
    for (int sp = 0; sp < n_split; ++sp) {
      m_all = fmaxf(m_all, __ldcg(plan.part_ml + (sp * static_cast<int64_t>(rows_total) + row) * 2));
    }
    const float m_use = m_all == -INFINITY ? 0.0f : m_all;
    float o[4] = {0.0f, 0.0f, 0.0f, 0.0f}, den = 0.0f;
    for (int sp = 0; sp < n_split; ++sp) {
      const int64_t wr = sp * static_cast<int64_t>(rows_total) + row;
      const float2 ml = __ldcg(reinterpret_cast<const float2*>(plan.part_ml + wr * 2));
      if (ml.x == -INFINITY) continue;  // a split with no visible key
      const float wt = exp2f(ml.x - m_use);
      const float4 po = __ldcg(reinterpret_cast<const float4*>(plan.part_o + wr * kD + d));
      den += ml.y * wt;
      o[0] += po.x * wt;
      o[1] += po.y * wt;
      o[2] += po.z * wt;
      o[3] += po.w * wt;
    }
    store_out(r, d, o, m_all, den);
  }
  if (threadIdx.x == 0) *counter = 0;  // ready for the next launch (stream order)
}

template <int kD, int kR>
void set_smem_limit_once() {
  static const bool done = [] {  // once per instantiation, so capture sees no attribute calls
    // Exactly what the launch uses: the kernel's static shared memory counts against the
    // opt-in limit too, so asking for the whole limit would be refused.
    LLMK_CUDA_CHECK(cudaFuncSetAttribute(decode_kernel<kD, kR>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(DecodeConfig<kD>::smem_bytes(kR))));
    return true;
  }();
  (void)done;
}

// Calls fn(std::integral_constant<int, R>{}) for the rows instantiation.
template <int kD, class Fn>
void dispatch_rows(int rows, Fn&& fn) {
  switch (rows) {
    case 1:
      return fn(std::integral_constant<int, 1>{});
    case 2:
      return fn(std::integral_constant<int, 2>{});
    case 4:
      return fn(std::integral_constant<int, 4>{});
    case 8:
      return fn(std::integral_constant<int, 8>{});
    default:
      if constexpr (DecodeConfig<kD>::kMaxRows >= 16) return fn(std::integral_constant<int, 16>{});
  }
}

}  // namespace

template <int kD>
int decode_max_rows() {
  return DecodeConfig<kD>::kMaxRows;
}

template <int kD>
size_t decode_smem_bytes(int rows) {
  return DecodeConfig<kD>::smem_bytes(rows);
}

template <int kD>
int decode_blocks_per_sm(int rows) {
  int blocks = 1;
  dispatch_rows<kD>(rows, [&](auto r) {
    constexpr int kR = decltype(r)::value;
    static const int cached = [] {  // once per instantiation: no API call per launch
      set_smem_limit_once<kD, kR>();
      int b = 0;
      LLMK_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
          &b, decode_kernel<kD, kR>, DecodeConfig<kD>::kThreads, DecodeConfig<kD>::smem_bytes(kR)));
      return b > 0 ? b : 1;
    }();
    blocks = cached;
  });
  return blocks;
}

template <int kD>
void launch_decode(const AttentionArgs& a, const DecodePlan& plan) {
  using C = DecodeConfig<kD>;
  dispatch_rows<kD>(plan.rows, [&](auto r) {
    constexpr int kR = decltype(r)::value;
    set_smem_limit_once<kD, kR>();
    const dim3 grid(static_cast<unsigned>(plan.split),
                    static_cast<unsigned>(a.Hkv * plan.groups), static_cast<unsigned>(a.B));
    decode_kernel<kD, kR><<<grid, C::kThreads, C::smem_bytes(kR), current_stream()>>>(a, plan);
  });
  check_launch("attention decode");
}

#define LLMK_INSTANTIATE_DECODE(D)              \
  template int decode_max_rows<D>();            \
  template size_t decode_smem_bytes<D>(int);    \
  template int decode_blocks_per_sm<D>(int);    \
  template void launch_decode<D>(const AttentionArgs&, const DecodePlan&);
LLMK_INSTANTIATE_DECODE(64)
LLMK_INSTANTIATE_DECODE(128)
LLMK_INSTANTIATE_DECODE(256)
#undef LLMK_INSTANTIATE_DECODE

}  // namespace llmk::cuda::attn
