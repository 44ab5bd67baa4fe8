// Distillation losses from logits (distill.h). A cluster of C blocks (C <= 8, the portable
// cluster size) takes one row, each block a chunk of ceil(V / C) logits of both tensors. Pass 1
// reads the chunk (into shared memory where it fits) and keeps online-softmax statistics of the
// student and teacher at temperature T (and of the student at temperature 1 for the hard label);
// the blocks of the cluster combine theirs through distributed shared memory. Pass 2 forms the
// gradient from the chunk in shared memory (JSD first sums its loss and sum q g there, a second
// cluster exchange). So a row is read from HBM once and its gradient written once.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <type_traits>

#include "core/cuda/check.h"
#include "core/cuda/device.h"
#include "core/cuda/stream.h"
#include "kernels/cuda/attention/tiles.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/distill.h"

namespace llmk::cuda::grad {

namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 256;
constexpr int kMaxCluster = 8;                 // the portable cluster size
constexpr size_t kMaxStageBytes = 100 * 1024;  // shared memory a block may stage its chunk in

struct Args {
  float* loss;
  void* grad;
  const void* student;
  const void* teacher;
  const int64_t* labels;
  const float* grad_scale;
  int64_t rows, V, chunk;  // chunk: logits per block, a multiple of the vector width
  int kind;                // Divergence after effective_divergence (the kernel's kKind)
  float beta, inv_t, temperature, alpha;
  int64_t ignore_index;
  bool stage, hard_separate;  // hard_separate: alpha > 0 and T != 1 (a third softmax)
};

constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

// 2^x, the hardware approximation (relative error about 2^-22; results below 2^-126 are 0).
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Online log-sum-exp in base 2 with a weighted sum carried along: z = sum 2^(x - m),
// w = sum 2^(x - m) y. (The kernel works in log2 units: logits times log2(e) / T.)
struct Acc {
  float m = -INFINITY, z = 0.0f, w = 0.0f;
  // The N values x (weights y) of one vector: one rescale to their common maximum, then N
  // independent exponentials (no chain through m from one element to the next). wy: whether
  // the weighted sum is kept.
  template <int N, bool wy>
  __device__ void add_vec(const float (&x)[N], const float (&y)[N]) {
    float mx = x[0];
#pragma unroll
    for (int k = 1; k < N; ++k) mx = fmaxf(mx, x[k]);
    const float mm = fmaxf(m, mx);
    if (mm == -INFINITY) return;  // all -inf so far
    const float c = ex2(m - mm);  // 0 when m is -inf
    float zs = 0.0f, ws = 0.0f;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const float e = ex2(x[k] - mm);
      zs += e;
      if constexpr (wy) ws += e > 0.0f ? e * y[k] : 0.0f;  // 0 (-inf) adds 0, not NaN
    }
    z = z * c + zs;
    if constexpr (wy) w = w * c + ws;
    m = mm;
  }
  __device__ void merge(const Acc& o) {
    if (o.m == -INFINITY) return;
    if (m == -INFINITY) {
      *this = o;
      return;
    }
    const float mm = fmaxf(m, o.m), c0 = ex2(m - mm), c1 = ex2(o.m - mm);
    z = z * c0 + o.z * c1;
    w = w * c0 + o.w * c1;
    m = mm;
  }
  __device__ float lse2() const { return m + log2f(z); }  // log2 of sum 2^x
};

struct Stats {
  Acc a, b, s1;  // student / T (w: KL's or ReverseKL's term), teacher / T, student at T = 1
};

__device__ Acc shfl_acc(const Acc& v, int lane_mask) {
  Acc o;
  o.m = __shfl_xor_sync(0xffffffffu, v.m, lane_mask);
  o.z = __shfl_xor_sync(0xffffffffu, v.z, lane_mask);
  o.w = __shfl_xor_sync(0xffffffffu, v.w, lane_mask);
  return o;
}

__device__ __forceinline__ void warp_merge(Stats& s) {
  for (int k = 16; k > 0; k >>= 1) {
    s.a.merge(shfl_acc(s.a, k));
    s.b.merge(shfl_acc(s.b, k));
    s.s1.merge(shfl_acc(s.s1, k));
  }
}

// The block's statistics, combined into scratch[0] (every thread may read it after the call):
// each warp's by shuffles, then the warps' by warp 0's.
template <int kWarps>
__device__ void block_stats(Stats& s, Stats* scratch) {
  warp_merge(s);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) scratch[warp] = s;
  __syncthreads();
  if (warp == 0) {
    Stats t;
    if (lane < kWarps) t = scratch[lane];
    warp_merge(t);
    if (lane == 0) scratch[0] = t;
  }
  __syncthreads();
}

// The row's statistics from the C blocks' of the cluster (part: this block's; at_rank maps it
// to another block's): lane r reads block r's, the warp merges them.
template <class AtRank>
__device__ __forceinline__ Stats cluster_stats(AtRank at_rank, const Stats* part, int C) {
  Stats o;
  if (static_cast<int>(threadIdx.x % 32) < C)
    o = *at_rank(part, static_cast<int>(threadIdx.x % 32));
  warp_merge(o);
  return o;
}

// Sum of v over the block into scratch[0] (float2: two sums at once).
template <int kWarps>
__device__ float2 block_sum2(float2 v, float2* scratch) {
  for (int k = 16; k > 0; k >>= 1) {
    v.x += __shfl_xor_sync(0xffffffffu, v.x, k);
    v.y += __shfl_xor_sync(0xffffffffu, v.y, k);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float2 t = scratch[0];
    for (int i = 1; i < kWarps; ++i) {
      t.x += scratch[i].x;
      t.y += scratch[i].y;
    }
    scratch[0] = t;
  }
  __syncthreads();
  return scratch[0];
}

// N consecutive elements <-> floats in one access (N * sizeof(T) bytes, aligned to that).
template <class T, int N>
__device__ __forceinline__ void load_n(const T* p, float (&f)[N]) {
  if constexpr (N == 1) {
    f[0] = to_float(*p);
  } else {
    static_assert(N * sizeof(T) == 16, "16-byte vectors");
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const T* h = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int k = 0; k < N; ++k) f[k] = to_float(h[k]);
  }
}
template <class T, int N>
__device__ __forceinline__ void store_n(T* p, const float (&f)[N]) {
  if constexpr (N == 1) {
    *p = from_float<T>(f[0]);
  } else {
    uint4 raw;
    T* h = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int k = 0; k < N; ++k) h[k] = from_float<T>(f[k]);
    *reinterpret_cast<uint4*>(p) = raw;
  }
}
// A row's label and what it makes of the row.
struct RowLabel {
  int64_t label = 0;
  bool ignored = false, bad = false;
};
__device__ __forceinline__ RowLabel row_label(const Args& a, int64_t row) {
  RowLabel r;
  if (a.labels == nullptr) return r;
  r.label = a.labels[row];
  r.ignored = r.label == a.ignore_index;
  r.bad = !r.ignored && (r.label < 0 || r.label >= a.V);
  return r;
}

// The label's logit (block rank 0's thread 0, when the hard term is on; else 0): read before
// any of the row's gradient is written, which may replace the student's logits.
template <class T>
__device__ __forceinline__ float label_logit(const Args& a, const T* S, const RowLabel& rl,
                                             int rank) {
  return rank == 0 && threadIdx.x == 0 && a.alpha != 0.0f && a.labels && !rl.ignored && !rl.bad
             ? to_float(S[rl.label])
             : 0.0f;
}

// Pass 1 on kVec logits of each tensor: the statistics, in log2 units (x = student * log2(e) /
// T, y the same of the teacher, s1 = student * log2(e) for the hard label at temperature 1).
template <int kVec, int kKind, class T>
__device__ __forceinline__ void add_stats(Stats& st, const T* hs, const T* ht, float c2,
                                          bool hard_separate) {
  constexpr bool kKL = kKind == static_cast<int>(Divergence::KL);
  constexpr bool kRKL = kKind == static_cast<int>(Divergence::ReverseKL);
  float s[kVec], x[kVec], y[kVec], xy[kVec], yx[kVec];
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    s[k] = to_float(hs[k]) * kLog2e;
    x[k] = to_float(hs[k]) * c2;
    y[k] = to_float(ht[k]) * c2;
    xy[k] = x[k] - y[k];
    yx[k] = -xy[k];
  }
  st.a.add_vec<kVec, kRKL>(x, xy);
  st.b.add_vec<kVec, kKL>(y, yx);
  if (hard_separate) st.s1.add_vec<kVec, false>(s, s);
}

// What the rest of a row needs of its combined statistics (log2 units, D and qg natural).
struct RowTerms {
  float lse_a, lse_b, lse1, D = 0.0f, qg = 0.0f;
};
template <int kKind>
__device__ __forceinline__ RowTerms row_terms(const Stats& r, const Args& a) {
  RowTerms t;
  t.lse_a = r.a.lse2();
  t.lse_b = r.b.lse2();
  t.lse1 = a.hard_separate ? r.s1.lse2() : t.lse_a * a.temperature;
  if constexpr (kKind == static_cast<int>(Divergence::KL)) {
    t.D = kLn2 * (r.b.w / r.b.z - t.lse_b + t.lse_a);
  }
  if constexpr (kKind == static_cast<int>(Divergence::ReverseKL)) {
    t.D = kLn2 * (r.a.w / r.a.z - t.lse_a + t.lse_b);
  }
  return t;
}

// JSD's sums over one element (log2-domain logits s, t times c2): D's term and sum_i q_i g_i's,
// g_i = (1 - beta)(log q_i - log m_i).
__device__ __forceinline__ void jsd_add(float s, float t, float c2, const RowTerms& r, float beta,
                                        float2& acc) {
  const float lq = s * c2 - r.lse_a, lp = t * c2 - r.lse_b;  // log2 units
  const float q = ex2(lq), p = ex2(lp), m = beta * p + (1.0f - beta) * q;
  // D's terms as beta p (log p - log m) + (1 - beta) q (log q - log m): summed as
  // p log p + q log q - m log m they cancel from about -log V down to D.
  const float lm = log2f(m);
  const float dq = q > 0.0f ? (1.0f - beta) * q * (lq - lm) : 0.0f;
  acc.x += (p > 0.0f ? beta * p * (lp - lm) : 0.0f) + dq;
  acc.y += dq;
}

// One logit's gradient: cs d + ch (softmax - [i == label]), cs and ch the soft and hard terms'
// factors (NaN for a bad label).
struct GradTerms {
  float c2, beta, cs, ch;
  int64_t label;
};
template <int kKind>
__device__ __forceinline__ float grad_at(float s, float t, int64_t i, const RowTerms& r,
                                         const GradTerms& g) {
  const float lq = s * g.c2 - r.lse_a, lp = t * g.c2 - r.lse_b;  // log2 units
  const float q = ex2(lq), p = ex2(lp);
  float d;
  if constexpr (kKind == static_cast<int>(Divergence::KL)) {
    d = q - p;
  } else if constexpr (kKind == static_cast<int>(Divergence::ReverseKL)) {
    d = q > 0.0f ? q * (kLn2 * (lq - lp) - r.D) : 0.0f;
  } else {
    const float m = g.beta * p + (1.0f - g.beta) * q;
    d = q > 0.0f ? q * ((1.0f - g.beta) * kLn2 * (lq - log2f(m)) - r.qg) : 0.0f;
  }
  float v = g.cs * d;
  if (g.ch != 0.0f) v += g.ch * (ex2(s * kLog2e - r.lse1) - (i == g.label ? 1.0f : 0.0f));
  return v;
}

__device__ __forceinline__ GradTerms grad_terms(const Args& a, const RowLabel& rl, float c2) {
  const float nan = __int_as_float(0x7fc00000);
  const float scale = a.grad_scale ? *a.grad_scale : 1.0f;
  GradTerms g;
  g.c2 = c2;
  g.beta = a.beta;
  g.cs = rl.bad ? nan : (1.0f - a.alpha) * a.temperature * scale;
  g.ch = rl.bad ? nan : a.alpha * scale;
  g.label = rl.label;
  return g;
}

// The row's loss: (1 - alpha) T^2 D + alpha CE; 0 for an ignored row, NaN for a bad label.
__device__ __forceinline__ float row_loss(const Args& a, const RowLabel& rl, const RowTerms& r,
                                          float s_label) {
  if (rl.bad) return __int_as_float(0x7fc00000);
  if (rl.ignored) return 0.0f;
  float l = (1.0f - a.alpha) * a.temperature * a.temperature * r.D;
  if (a.alpha != 0.0f) l += a.alpha * kLn2 * (r.lse1 - s_label * kLog2e);
  return l;
}

template <class T, int kVec, int kKind>
__global__ void __launch_bounds__(kThreads, 3) distill_kernel(const Args a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cg::cluster_group cluster = cg::this_cluster();
  const int C = static_cast<int>(cluster.num_blocks());
  const int rank = static_cast<int>(cluster.block_rank());
  auto cluster_sync = [&] { cluster.sync(); };
  auto cluster_arrive = [] {
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
  };
  auto cluster_wait = [] { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); };
  auto at_rank = [&](auto* p, int r) { return cluster.map_shared_rank(p, r); };
#else  // no clusters before sm_90: one block per row (the host launches no cluster there)
  constexpr int C = 1, rank = 0;
  auto cluster_sync = [] { __syncthreads(); };
  auto cluster_arrive = [] {};
  auto cluster_wait = [] {};
  auto at_rank = [](auto* p, int) { return p; };
#endif
  constexpr int kWarps = kThreads / 32;
  const int64_t row = blockIdx.x / C;
  extern __shared__ uint4 smem_raw[];
  T* sS = reinterpret_cast<T*>(smem_raw);
  T* sT = sS + a.chunk;
  __shared__ Stats scratch[kWarps];
  __shared__ Stats part;    // this block's statistics, read by the cluster
  __shared__ float2 part2;  // this block's JSD sums, read by the cluster
  __shared__ float2 scratch2[kWarps];

  const int64_t V = a.V, lo = rank * a.chunk, hi = min(V, lo + a.chunk);
  const T* S = static_cast<const T*>(a.student) + row * V;
  const T* Tt = static_cast<const T*>(a.teacher) + row * V;
  T* G = a.grad ? static_cast<T*>(a.grad) + row * V : nullptr;
  const RowLabel rl = row_label(a, row);
  const float s_label = label_logit(a, S, rl, rank);
  const float c2 = a.inv_t * kLog2e;

  // Pass 1: statistics (and the chunk into shared memory). Four vectors of each tensor are
  // loaded before any is used, so that each thread has eight loads in flight.
  Stats st;
  if (!rl.ignored) {
    using Raw = std::conditional_t<kVec == 1, T, uint4>;
    auto body = [&](int64_t i, const Raw& rs, const Raw& rt) {
      if (a.stage) {
        *reinterpret_cast<Raw*>(sS + (i - lo)) = rs;
        *reinterpret_cast<Raw*>(sT + (i - lo)) = rt;
      }
      add_stats<kVec, kKind>(st, reinterpret_cast<const T*>(&rs), reinterpret_cast<const T*>(&rt),
                             c2, a.hard_separate);
    };
    constexpr int kUnroll = 4;
    const int64_t step = static_cast<int64_t>(kThreads) * kVec;
    int64_t i = lo + static_cast<int64_t>(threadIdx.x) * kVec;
    for (; i + (kUnroll - 1) * step < hi; i += kUnroll * step) {
      Raw rs[kUnroll], rt[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        rs[u] = *reinterpret_cast<const Raw*>(S + i + u * step);
        rt[u] = *reinterpret_cast<const Raw*>(Tt + i + u * step);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) body(i + u * step, rs[u], rt[u]);
    }
    for (; i < hi; i += step) {
      body(i, *reinterpret_cast<const Raw*>(S + i), *reinterpret_cast<const Raw*>(Tt + i));
    }
  }
  block_stats<kWarps>(st, scratch);
  if (threadIdx.x == 0) part = scratch[0];
  cluster_sync();
  const Stats row_st = cluster_stats(at_rank, &part, C);
  // The other blocks' statistics are read: this block's shared memory may go once every block
  // of the cluster has arrived here too (waited for at the end).
  cluster_arrive();
  RowTerms rt = row_terms<kKind>(row_st, a);

  auto load_at = [&](int64_t i, float(&s)[kVec], float(&t)[kVec]) {
    if (a.stage) {
      load_n<T, kVec>(sS + (i - lo), s);
      load_n<T, kVec>(sT + (i - lo), t);
    } else {
      load_n<T, kVec>(S + i, s);
      load_n<T, kVec>(Tt + i, t);
    }
  };
  if constexpr (kKind == static_cast<int>(Divergence::JSD)) {
    float2 acc = make_float2(0.0f, 0.0f);
    if (!rl.ignored) {
      for (int64_t i = lo + static_cast<int64_t>(threadIdx.x) * kVec; i < hi;
           i += static_cast<int64_t>(kThreads) * kVec) {
        float s[kVec], t[kVec];
        load_at(i, s, t);
#pragma unroll
        for (int k = 0; k < kVec; ++k) jsd_add(s[k], t[k], c2, rt, a.beta, acc);
      }
    }
    const float2 b = block_sum2<kWarps>(acc, scratch2);
    if (threadIdx.x == 0) part2 = b;
    cluster_wait();  // (the arrival after the statistics)
    cluster_sync();  // every block's part2 written
    for (int r = 0; r < C; ++r) {
      const float2 o = *at_rank(&part2, r);
      rt.D += kLn2 * o.x;
      rt.qg += kLn2 * o.y;
    }
    cluster_arrive();  // part2 read; waited for at the end
  }

  if (G) {
    const GradTerms gt = grad_terms(a, rl, c2);
    for (int64_t i = lo + static_cast<int64_t>(threadIdx.x) * kVec; i < hi;
         i += static_cast<int64_t>(kThreads) * kVec) {
      float g[kVec];
      if (rl.ignored) {
#pragma unroll
        for (int k = 0; k < kVec; ++k) g[k] = 0.0f;
      } else {
        float s[kVec], t[kVec];
        load_at(i, s, t);
#pragma unroll
        for (int k = 0; k < kVec; ++k) g[k] = grad_at<kKind>(s[k], t[k], i + k, rt, gt);
      }
      store_n<T, kVec>(G + i, g);
    }
  }
  if (rank == 0 && threadIdx.x == 0) a.loss[row] = row_loss(a, rl, rt, s_label);
  cluster_wait();  // no block leaves while another may still read its shared memory
}

// ---- KL and reverse KL with each row in registers ----
//
// For 16-bit logits and rows of at most kRegMaxCluster x kRegThreads x kRegLogits logits: a
// cluster of C blocks holds a row in registers, kRegLogits of each tensor a thread, and walks rows
// (a persistent grid: as many clusters as fit at once). Each logit takes two exponentials, 2^(x -
// M) of the student and of the teacher against their warp's maximum M, kept in registers: the
// gradient is then those times one factor a warp (2^(M - lse)), with no third or fourth exponential
// and no pass over shared memory. A row's statistics: a __syncthreads, one warp a block sends the
// block's to every block of the cluster (st.async onto an mbarrier) and combines theirs, a
// __syncthreads hands the row's log-sum-exps to the other warps. Rows come two ahead (cp.async into
// three stages of shared memory), so their loads overlap the exchanges and the gradients' stores.

// Threads a block, logits of each tensor a thread (in registers), blocks a cluster at most: rows
// of up to 262,144 logits.
constexpr int kRegThreads = 1024, kRegLogits = 16, kRegMaxCluster = 16;

// A warp's, a block's or a row's statistics (log2 units): maxima and sums of 2^(x - m) of the
// student (a) and the teacher (b), and the divergence's weighted sum w (under b's maximum for KL,
// a's for reverse KL).
struct RegPart {
  float ma, za, mb, zb, w;
};

__device__ __forceinline__ float finite_or_zero(float m) { return m == -INFINITY ? 0.0f : m; }

// The lanes' parts merged (every lane gets the result): the common maxima first, then each
// lane's sums rescaled to them once (two exponentials a lane, not two a step).
template <bool kWOnB>
__device__ __forceinline__ RegPart merge_lanes(const RegPart& p) {
  RegPart o;
  o.ma = warp_max(p.ma);
  o.mb = warp_max(p.mb);
  const float ca = p.za > 0.0f ? ex2(p.ma - finite_or_zero(o.ma)) : 0.0f;
  const float cb = p.zb > 0.0f ? ex2(p.mb - finite_or_zero(o.mb)) : 0.0f;
  o.za = warp_sum(p.za * ca);
  o.zb = warp_sum(p.zb * cb);
  o.w = warp_sum(p.w != 0.0f ? p.w * (kWOnB ? cb : ca) : 0.0f);
  return o;
}

// Two 16-bit logits of a 32-bit word as floats (bf16: by shifts and masks), and back (one
// rounding conversion for the pair).
__device__ __forceinline__ float2 unpack2(uint32_t w, __nv_bfloat16*) {
  return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}
__device__ __forceinline__ float2 unpack2(uint32_t w, __half*) {
  __half2 h;
  memcpy(&h, &w, 4);
  return __half22float2(h);
}
__device__ __forceinline__ uint32_t pack2(float lo, float hi, __nv_bfloat16*) {
  return pack_bf16x2(lo, hi);
}
__device__ __forceinline__ uint32_t pack2(float lo, float hi, __half*) {
  return pack_f16x2(lo, hi);
}

// Copies this thread's vectors of a row of both tensors into its slots of stage (cp.async, not
// committed; the same thread reads them back after waiting for the group).
// (Slots past the chunk are not copied: they keep the -inf the kernel put there.)
template <class T>
__device__ __forceinline__ void stage_reg_row(const Args& a, int64_t row, int lo, int hi,
                                              uint4 (*stage)[kRegThreads]) {
  constexpr int kV = kRegLogits / 8;
  const T* S = static_cast<const T*>(a.student) + row * a.V;
  const T* Tt = static_cast<const T*>(a.teacher) + row * a.V;
#pragma unroll
  for (int v = 0; v < kV; ++v) {
    const int i = lo + (static_cast<int>(threadIdx.x) + v * kRegThreads) * 8;
    if (i < hi) {
      attn::cp_async_16_at(smem_addr(&stage[v][threadIdx.x]), S + i, true);
      attn::cp_async_16_at(smem_addr(&stage[kV + v][threadIdx.x]), Tt + i, true);
    }
  }
}

template <class T, int kKind>
__global__ void __launch_bounds__(kRegThreads, 1) distill_reg_kernel(const Args a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int kThreads = kRegThreads, kEPT = kRegLogits;
  static_assert(sizeof(T) == 2 && kEPT % 8 == 0, "16-bit logits, 16-byte vectors");
  constexpr int kV = kEPT / 8, kWarps = kThreads / 32;
  constexpr bool kKL = kKind == static_cast<int>(Divergence::KL);
  cg::cluster_group cluster = cg::this_cluster();
  const int C = static_cast<int>(cluster.num_blocks());
  const int rank = static_cast<int>(cluster.block_rank());
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int clusters = static_cast<int>(gridDim.x) / C, first = static_cast<int>(blockIdx.x) / C;
  const int64_t V = a.V;
  const int lo = rank * static_cast<int>(a.chunk), hi = static_cast<int>(min(V, lo + a.chunk));
  const float c2 = a.inv_t * kLog2e;
  __shared__ RegPart warps[kWarps];
  // The blocks' parts of a row, by row parity: block r's in recv[p][r], written by block r with
  // st.async, which completes its bytes on done[p] (no cluster-wide barrier a row, whose release
  // would wait for this block's outstanding gradient stores and loads).
  __shared__ float4 recv[2][kRegMaxCluster][2];
  __shared__ uint64_t done[2];
  __shared__ float4 terms;  // the row's lse_a, lse_b and D, from warp 0
  // Three stages of a row's vectors, kV of each tensor (dynamic shared memory).
  extern __shared__ uint4 stage_raw[];
  auto stage = [&](int n) {
    return reinterpret_cast<uint4(*)[kThreads]>(stage_raw + (n % 3) * 2 * kV * kThreads);
  };
  const auto done_at = [&](int p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(&done[p]));
  };
  auto vec_at = [&](int v) { return lo + (static_cast<int>(threadIdx.x) + v * kThreads) * 8; };
  // Slots past the chunk hold -inf logits for good (the copies never write them): no test of
  // each logit for being in the row.
  {
    uint4 ninf;
    T* h = reinterpret_cast<T*>(&ninf);
#pragma unroll
    for (int k = 0; k < 8; ++k) h[k] = from_float<T>(-INFINITY);
    for (int n = 0; n < 3; ++n) {
#pragma unroll
      for (int v = 0; v < kV; ++v) {
        if (vec_at(v) >= hi) stage(n)[v][threadIdx.x] = stage(n)[kV + v][threadIdx.x] = ninf;
      }
    }
  }
  if (threadIdx.x == 0) {
    for (int p = 0; p < 2; ++p) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(done_at(p)) : "memory");
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  cluster.sync();  // every block's barriers initialised before any part is sent

  // Rows first, first + clusters, ...: row n of this cluster in stage n % 3, fetched while rows
  // n - 2 and n - 1 are worked on.
  auto row_of = [&](int n) { return first + static_cast<int64_t>(n) * clusters; };
  auto fetch = [&](int n) {
    const int64_t row = row_of(n);
    if (row < a.rows && !row_label(a, row).ignored) stage_reg_row<T>(a, row, lo, hi, stage(n));
    attn::cp_async_commit();
  };
  fetch(0);
  fetch(1);
  for (int n = 0; row_of(n) < a.rows; ++n) {
    const int64_t row = row_of(n);
    const int p = n & 1;
    const RowLabel rl = row_label(a, row);
    const int label = rl.ignored || rl.bad ? -1 : static_cast<int>(rl.label);
    fetch(n + 2);
    // Row n's stage (n + 1's and n + 2's fly). Not attn::cp_async_wait: each thread reads its own
    // slots next with no barrier between, so the wait must also order those reads (memory).
    asm volatile("cp.async.wait_group 2;" ::: "memory");

    // Against the warp's maxima M (log2 units): ea = 2^(x - M) of the student, eb the teacher's.
    float ea[kEPT], eb[kEPT], dst[kKL ? 1 : kEPT];
    float s_label = 0.0f;  // the label's logit, in the thread that holds it
    bool has_label = false;
    RegPart wp{-INFINITY, 0.0f, -INFINITY, 0.0f, 0.0f};
    if (!rl.ignored) {
      float mx = -INFINITY, my = -INFINITY;
#pragma unroll
      for (int v = 0; v < kV; ++v) {
        const uint4 rs = stage(n)[v][threadIdx.x], rt = stage(n)[kV + v][threadIdx.x];
        const uint32_t ws[4] = {rs.x, rs.y, rs.z, rs.w}, wt[4] = {rt.x, rt.y, rt.z, rt.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {  // the logits, until the exponentials replace them
          const float2 fs = unpack2(ws[k], static_cast<T*>(nullptr));
          const float2 ft = unpack2(wt[k], static_cast<T*>(nullptr));
          ea[v * 8 + 2 * k] = fs.x;
          ea[v * 8 + 2 * k + 1] = fs.y;
          eb[v * 8 + 2 * k] = ft.x;
          eb[v * 8 + 2 * k + 1] = ft.y;
          mx = fmaxf(mx, fmaxf(fs.x, fs.y));
          my = fmaxf(my, fmaxf(ft.x, ft.y));
        }
        const int i0 = vec_at(v);
        if (i0 < hi && static_cast<unsigned>(label - i0) < 8u) {
#pragma unroll
          for (int k = 0; k < 8; ++k) {
            if (label == i0 + k) s_label = ea[v * 8 + k];  // no dynamic index into registers
          }
          has_label = true;
        }
      }
      wp.ma = warp_max(mx) * c2;  // c2 > 0
      wp.mb = warp_max(my) * c2;
      const float ma = finite_or_zero(wp.ma), mb = finite_or_zero(wp.mb);
      float za = 0.0f, zb = 0.0f, w = 0.0f;
#pragma unroll
      for (int k = 0; k < kEPT; ++k) {
        const float s = ea[k], t = eb[k];
        ea[k] = ex2(fmaf(s, c2, -ma));
        eb[k] = ex2(fmaf(t, c2, -mb));
        za += ea[k];
        zb += eb[k];
        // A difference of -inf (or NaN: both -inf) comes with a weight of 0: clamped to a
        // finite value, it adds 0, not NaN.
        if constexpr (kKL) {
          w = fmaf(eb[k], fmaxf(t - s, -1e30f), w);
        } else {
          dst[k] = fmaxf(s - t, -1e30f);
          w = fmaf(ea[k], dst[k], w);
        }
      }
      wp.za = warp_sum(za);
      wp.zb = warp_sum(zb);
      wp.w = warp_sum(w) * c2;
    }

    if (lane == 0) warps[warp] = wp;
    __syncthreads();
    if (warp == 0) {
      // The block's part to every block of the cluster (block `lane` gets it in recv[p][rank]),
      // then the row's from the C parts.
      RegPart q{-INFINITY, 0.0f, -INFINITY, 0.0f, 0.0f};
      if (lane < kWarps) q = warps[lane];
      q = merge_lanes<kKL>(q);
      if (lane < C) {
        uint32_t dst_at, bar;
        asm("mapa.shared::cluster.u32 %0, %1, %2;"
            : "=r"(dst_at)
            : "r"(static_cast<uint32_t>(__cvta_generic_to_shared(&recv[p][rank][0]))), "r"(lane));
        asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(bar) : "r"(done_at(p)), "r"(lane));
        asm volatile(
            "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%2, %3, %4, %5}, "
            "[%1];\n"
            "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%6], {%7, %8, %8, %8}, "
            "[%1];" ::"r"(dst_at),
            "r"(bar), "f"(q.ma), "f"(q.za), "f"(q.mb), "f"(q.zb), "r"(dst_at + 16), "f"(q.w),
            "f"(0.0f)
            : "memory");
      }
      if (lane == 0) {  // this row's parts: C x 32 bytes
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(done_at(p)),
                     "r"(C * 32)
                     : "memory");
      }
      asm volatile(
          "{\n"
          ".reg .pred P;\n"
          "WAIT:\n"
          "mbarrier.try_wait.parity.shared::cta.b64 P, [%0], %1;\n"
          "@!P bra WAIT;\n"
          "}" ::"r"(done_at(p)),
          "r"((n >> 1) & 1)
          : "memory");
      RegPart r{-INFINITY, 0.0f, -INFINITY, 0.0f, 0.0f};
      if (lane < C) {
        const float4 u = recv[p][lane][0], u2 = recv[p][lane][1];
        r = RegPart{u.x, u.y, u.z, u.w, u2.x};
      }
      r = merge_lanes<kKL>(r);
      if (lane == 0) {
        const float lse_a = finite_or_zero(r.ma) + log2f(r.za);
        const float lse_b = finite_or_zero(r.mb) + log2f(r.zb);
        terms = make_float4(
            lse_a, lse_b,
            kKL ? kLn2 * (r.w / r.zb - lse_b + lse_a) : kLn2 * (r.w / r.za - lse_a + lse_b), 0.0f);
      }
    }
    __syncthreads();  // terms written (the other warps sleep here, not spinning on the barrier)
    RowTerms rt_;
    {
      const float4 t = terms;
      rt_.lse_a = t.x;
      rt_.lse_b = t.y;
      rt_.lse1 = t.x * a.temperature;  // T = 1 whenever the hard term is on here
      rt_.D = t.z;
    }

    if (a.grad) {
      T* G = static_cast<T*>(a.grad) + row * V;
      const GradTerms gt = grad_terms(a, rl, c2);
      // The student's softmax is q = ea 2^(M - lse_a) = ea qa, the teacher's p = eb pb (0 where
      // the warp's maximum is -inf: no 0 * inf). KL: g = cs (q - p) + ch (q - [label]) =
      // ea (cs + ch) qa - eb cs pb - ch [label]; reverse KL: g = q (cs u + ch) - ch [label] with
      // u = ln2 (log2 q - log2 p) - D = (s - t) / T + ln2 (lse_b - lse_a) - D.
      const float qa = wp.ma == -INFINITY ? 0.0f : ex2(wp.ma - rt_.lse_a);
      const float pb = wp.mb == -INFINITY ? 0.0f : ex2(wp.mb - rt_.lse_b);
      const float fa = (gt.cs + gt.ch) * qa, fb = gt.cs * pb;
      const float uk = kLn2 * c2, u0 = kLn2 * (rt_.lse_b - rt_.lse_a) - rt_.D;
#pragma unroll
      for (int v = 0; v < kV; ++v) {
        const int i = vec_at(v);
        if (i >= hi) continue;
        if (rl.ignored) {
          __stcs(reinterpret_cast<uint4*>(G + i), make_uint4(0, 0, 0, 0));
          continue;
        }
        float g[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          if constexpr (kKL) {
            g[k] = fmaf(ea[v * 8 + k], fa, -eb[v * 8 + k] * fb);
          } else {
            const float q = ea[v * 8 + k] * qa;
            g[k] = q > 0.0f ? q * fmaf(fmaf(dst[v * 8 + k], uk, u0), gt.cs, gt.ch) : 0.0f;
          }
        }
        if (static_cast<unsigned>(label - i) < 8u) {  // the hard label's -ch
#pragma unroll
          for (int k = 0; k < 8; ++k) {
            if (label == i + k) g[k] -= gt.ch;
          }
        }
        uint4 raw;
        raw.x = pack2(g[0], g[1], static_cast<T*>(nullptr));
        raw.y = pack2(g[2], g[3], static_cast<T*>(nullptr));
        raw.z = pack2(g[4], g[5], static_cast<T*>(nullptr));
        raw.w = pack2(g[6], g[7], static_cast<T*>(nullptr));
        __stcs(reinterpret_cast<uint4*>(G + i), raw);
      }
    }
    // The loss: the thread holding the label's logit when the hard term needs it, else block
    // rank 0's thread 0 (a bad label's NaN included).
    const bool needs_label = a.alpha != 0.0f && a.labels && !rl.ignored && !rl.bad;
    if (needs_label ? has_label : rank == 0 && threadIdx.x == 0) {
      a.loss[row] = row_loss(a, rl, rt_, s_label);
    }
  }
  asm volatile("cp.async.wait_group 0;" ::: "memory");
  cluster.sync();  // no block leaves while a part may still be on its way to it
#endif
}

// A launch configuration of `blocks` blocks in clusters of C (the attribute is in the struct,
// which is neither copied nor moved: cfg points at it).
struct ClusterLaunch {
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1] = {};
  ClusterLaunch(int64_t blocks, int threads, size_t smem, int C) {
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim = {static_cast<unsigned>(C), 1, 1};
    cfg.gridDim = dim3(static_cast<unsigned>(blocks));
    cfg.blockDim = dim3(static_cast<unsigned>(threads));
    cfg.dynamicSmemBytes = smem;
    cfg.stream = current_stream();
    cfg.attrs = attr;
    cfg.numAttrs = 1;
  }
  ClusterLaunch(const ClusterLaunch&) = delete;
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;
};

constexpr size_t kRegSmem = size_t{3} * 2 * (kRegLogits / 8) * kRegThreads * sizeof(uint4);

// Clusters of C blocks of the register kernel that fit this GPU at once (0: none).
template <class T, int kKind>
int reg_clusters(int C) {
  auto* kernel = distill_reg_kernel<T, kKind>;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(kRegSmem)) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  if (C > 8 && cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) !=
                   cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  const ClusterLaunch l(C, kRegThreads, kRegSmem, C);
  int n = 0;
  if (cudaOccupancyMaxActiveClusters(&n, kernel, &l.cfg) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

template <class T, int kKind>
void launch_reg(const Args& a, int C, int clusters) {
  const ClusterLaunch l(static_cast<int64_t>(clusters) * C, kRegThreads, kRegSmem, C);
  LLMK_CUDA_CHECK(cudaLaunchKernelEx(&l.cfg, distill_reg_kernel<T, kKind>, a));
}

template <class T, int kVec, int kKind>
void launch(const Args& a, int C, size_t smem) {
  auto* kernel = distill_kernel<T, kVec, kKind>;
  if (smem > 48 * 1024) {
    LLMK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem)));
  }
  if (C > 8) {
    LLMK_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  }
  ClusterLaunch l(a.rows * C, kThreads, smem, C);
  l.cfg.numAttrs = C > 1 ? 1 : 0;  // no clusters before sm_90 (C is 1 there)
  LLMK_CUDA_CHECK(cudaLaunchKernelEx(&l.cfg, kernel, a));
}

// The largest power of two, up to kMaxCluster, that a cluster of kThreads-thread blocks may
// span on this GPU (8 where the query fails: the portable size).
int max_cluster_blocks() {
  static const int n = [] {
    auto* kernel = distill_kernel<float, 1, 0>;
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) !=
        cudaSuccess) {
      (void)cudaGetLastError();
      return 8;
    }
    const ClusterLaunch l(kMaxCluster, kThreads, 0, kMaxCluster);
    int size = 0;
    if (cudaOccupancyMaxPotentialClusterSize(&size, kernel, &l.cfg) != cudaSuccess) {
      (void)cudaGetLastError();
      return 8;
    }
    int c = 1;
    while (c * 2 <= std::min(size, kMaxCluster)) c *= 2;
    return std::max(c, 1);
  }();
  return n;
}

template <class T>
__global__ void scale_rows_kernel(T* x, const float* s, int64_t s_stride, int64_t rows,
                                  int64_t cols) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float f = s[r * s_stride];
    if (f == 1.0f) continue;
    T* xr = x + r * cols;
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
      xr[i] = from_float<T>(to_float(xr[i]) * f);
    }
  }
}

// The register kernel for KL and reverse KL of 16-bit logits on sm_90 (clusters), without a
// separate hard-label softmax (alpha 0 or T 1): false where it does not apply or no cluster of
// the blocks it needs fits this GPU (the caller then launches distill_kernel). Blocks of 1,024
// threads, 16 logits a thread, one block an SM: on an H100 faster than blocks of 512 two an SM
// (whose 14 clusters of 16 left some SMs one block, others two) or of 512 with 32 logits each.
template <class T>
bool try_reg_kernel(Args& a) {
  const auto kind = static_cast<Divergence>(a.kind);
  if (device_info().cc_major < 9 || a.hard_separate ||
      (kind != Divergence::KL && kind != Divergence::ReverseKL)) {
    return false;
  }
  int C = 1, lc = 0;
  while (int64_t{C} * kRegThreads * kRegLogits < a.V && C < kRegMaxCluster) {
    C *= 2;
    ++lc;
  }
  if (int64_t{C} * kRegThreads * kRegLogits < a.V) return false;
  // Clusters that fit at once, per (kind, log2 C); -1: not asked yet.
  static std::atomic<int> fits[2][5] = {{-1, -1, -1, -1, -1}, {-1, -1, -1, -1, -1}};
  constexpr int kKL = static_cast<int>(Divergence::KL),
                kRKL = static_cast<int>(Divergence::ReverseKL);
  const bool kl = kind == Divergence::KL;
  int n = fits[kl ? 0 : 1][lc].load();
  if (n < 0) {
    n = kl ? reg_clusters<T, kKL>(C) : reg_clusters<T, kRKL>(C);
    fits[kl ? 0 : 1][lc].store(n);
  }
  if (n <= 0) return false;
  a.chunk = (a.V + 8 * C - 1) / (8 * C) * 8;
  const int clusters = static_cast<int>(std::min<int64_t>(n, a.rows));
  if (kl) {
    launch_reg<T, kKL>(a, C, clusters);
  } else {
    launch_reg<T, kRKL>(a, C, clusters);
  }
  return true;
}

}  // namespace

template <class T>
const char* distill_rows(float* loss, T* grad, const T* student, const T* teacher,
                         const int64_t* labels, int64_t rows, int64_t V, const DistillParams& p,
                         const float* grad_scale) {
  if (rows == 0) return "cuda";
  Args a{};
  a.loss = loss;
  a.grad = grad;
  a.student = student;
  a.teacher = teacher;
  a.labels = labels;
  a.grad_scale = grad_scale;
  a.rows = rows;
  a.V = V;
  a.kind = static_cast<int>(cpu::grad::effective_divergence(p));
  a.beta = static_cast<float>(p.beta);
  a.inv_t = static_cast<float>(1.0 / p.temperature);
  a.temperature = static_cast<float>(p.temperature);
  a.alpha = static_cast<float>(p.alpha);
  a.ignore_index = p.ignore_index;
  a.hard_separate = p.alpha != 0.0 && p.temperature != 1.0;
  constexpr int kVecN = static_cast<int>(16 / sizeof(T));
  const bool vec = V % kVecN == 0 && is_aligned(student, 16) && is_aligned(teacher, 16) &&
                   (!grad || is_aligned(grad, 16));
  if constexpr (sizeof(T) == 2) {
    if (vec && try_reg_kernel<T>(a)) return "cuda-registers";
  }
  const int w = vec ? kVecN : 1;
  // The fewest blocks per row (a power of two up to 8) whose chunk of both tensors fits the
  // staging budget; a row too long for 8 stages is read from global memory again instead.
  // (Clusters exist from sm_90 on; each thread reads back in pass 2 only what it staged.)
  const int max_cluster = device_info().cc_major >= 9 ? max_cluster_blocks() : 1;
  int C = 1;
  auto chunk_of = [&](int c) { return (V + c * w - 1) / (c * w) * w; };
  while (C<max_cluster&& static_cast<size_t>(chunk_of(C)) * 2 * sizeof(T)> kMaxStageBytes) {
    C *= 2;
  }
  a.chunk = chunk_of(C);
  const size_t stage_bytes = static_cast<size_t>(a.chunk) * 2 * sizeof(T);
  a.stage = stage_bytes <= kMaxStageBytes && (grad || a.kind == static_cast<int>(Divergence::JSD));
  const size_t smem = a.stage ? stage_bytes : 0;
  auto with_kind = [&]<int kVec>() {
    switch (static_cast<Divergence>(a.kind)) {
      case Divergence::KL:
        return launch<T, kVec, static_cast<int>(Divergence::KL)>(a, C, smem);
      case Divergence::ReverseKL:
        return launch<T, kVec, static_cast<int>(Divergence::ReverseKL)>(a, C, smem);
      case Divergence::JSD:
        return launch<T, kVec, static_cast<int>(Divergence::JSD)>(a, C, smem);
    }
  };
  if (vec) {
    with_kind.template operator()<kVecN>();
  } else {
    with_kind.template operator()<1>();
  }
  return "cuda";
}

template <class T>
void scale_rows(T* x, const float* s, int64_t s_stride, int64_t rows, int64_t cols) {
  if (rows == 0 || cols == 0) return;
  const int blocks = static_cast<int>(std::min<int64_t>(rows, 4 * device_info().sm_count));
  scale_rows_kernel<T><<<blocks, 256, 0, current_stream()>>>(x, s, s_stride, rows, cols);
  LLMK_CUDA_CHECK(cudaGetLastError());
}

#define LLMK_DISTILL_INSTANTIATE(T)                                                             \
  template const char* distill_rows<T>(float*, T*, const T*, const T*, const int64_t*, int64_t, \
                                       int64_t, const DistillParams&, const float*);            \
  template void scale_rows<T>(T*, const float*, int64_t, int64_t, int64_t);
LLMK_DISTILL_INSTANTIATE(float)
LLMK_DISTILL_INSTANTIATE(__nv_bfloat16)
LLMK_DISTILL_INSTANTIATE(__half)
#undef LLMK_DISTILL_INSTANTIATE

}  // namespace llmk::cuda::grad
