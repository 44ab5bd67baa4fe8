// Forward and backward of llmk.ops on the GPU (grad.h). Three families of kernel, each with a
// vector build (16-byte accesses, where pointers and strides allow them) and an
// element-by-element build (any alignment, size and stride):
//
// - Element-wise maps (add, gated_fwd, gated_bwd): four 16-byte vectors of every input in flight
//   per thread, so a map moves its bytes at about the copy rate.
// - Row norms (rms_norm_fwd, rms_norm_bwd): a team of threads per row holds the row in
//   registers, so each row is read once and written once. Blocks stay resident (as many as fit)
//   and walk their rows, loading the next row before reducing the current one (where registers
//   allow), so the sum's barrier does not leave the memory system idle. dw: each block adds
//   dy * xhat over its own rows in registers and writes one fp32 partial row; a second kernel
//   sums the partials in a fixed order. No atomics: the result has the same bits on every run.
//   Other widths and alignments take one block per row, reading the row twice.
// - RoPE by tables: one thread per 16-byte chunk of a head row (with the cos/sin it needs),
//   rows ordered as x lies in memory ([B, S, H, D] or [B, H, S, D]).
#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <type_traits>
#include <utility>

#include "core/cuda/device.h"
#include "kernels/cuda/activation.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/grad.h"
#include "kernels/cuda/vec.cuh"

namespace llmk::cuda::grad {

namespace {

using bf16 = __nv_bfloat16;

// Blocks of `threads` threads of `kernel` that are resident on the whole device at once
// (occupancy times SMs; at least one per SM). Asked once per kernel and block size.
int64_t resident_blocks(const void* kernel, int threads) {
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, int64_t> cache;
  const std::lock_guard<std::mutex> lock(mu);
  const auto it = cache.find({kernel, threads});
  if (it != cache.end()) return it->second;
  int per_sm = 0;
  LLMK_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0));
  const int64_t blocks = int64_t{std::max(1, per_sm)} * device_info().sm_count;
  cache.emplace(std::make_pair(kernel, threads), blocks);
  return blocks;
}

// Throws llmk::Error for a broken precondition (through check.h: fmt's headers do not build
// under nvcc, so core/error.h is out of reach here).
[[noreturn]] void fail(const char* what) {
  throw_cuda_error(cudaErrorInvalidValue, what, __FILE__, __LINE__);
}

// Grid-stride loops cap their grids here (well past what is resident).
constexpr int64_t kMaxLoopBlocks = int64_t{1} << 20;

// ---------------------------------------------------------------------------------------------
// Element-wise maps: out_k[i] = f(in_0[i], ..., in_{kIn-1}[i]) in fp32, each rounded once.

template <class T, int kIn, int kOut>
struct MapArgs {
  T* out[kOut];
  const T* in[kIn];
  int64_t n;
};

constexpr int kMapThreads = 256;
constexpr int kMapUnroll = 4;  // vectors of each input a thread loads before it computes

template <class T, int kIn, int kOut, class F>
__device__ __forceinline__ void map_one(const MapArgs<T, kIn, kOut>& a, const F& f, int64_t i) {
  float x[kIn], y[kOut];
#pragma unroll
  for (int k = 0; k < kIn; ++k) x[k] = to_float(a.in[k][i]);
  f(x, y);
#pragma unroll
  for (int k = 0; k < kOut; ++k) a.out[k][i] = from_float<T>(y[k]);
}

// Every pointer 16-byte aligned: vectors i = base + u * kMapThreads (u < kMapUnroll) per step,
// then the last n % V elements by block 0.
template <class T, int kIn, int kOut, class F>
__global__ void __launch_bounds__(kMapThreads)
    map_vec_kernel(const MapArgs<T, kIn, kOut> a, const F f) {
  grid_dependency_wait();
  constexpr int V = kVecOf<T>;
  const int64_t nvec = a.n / V;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kMapThreads * kMapUnroll;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * kMapThreads * kMapUnroll + threadIdx.x;
       base < nvec; base += step) {
    Chunk<T, V> raw[kMapUnroll][kIn];
#pragma unroll
    for (int u = 0; u < kMapUnroll; ++u) {
      const int64_t i = base + u * kMapThreads;
      if (i < nvec) {
#pragma unroll
        for (int k = 0; k < kIn; ++k) raw[u][k] = load_chunk<T, V>(a.in[k] + i * V);
      }
    }
#pragma unroll
    for (int u = 0; u < kMapUnroll; ++u) {
      const int64_t i = base + u * kMapThreads;
      if (i < nvec) {
        float in[kIn][V], out[kOut][V];
#pragma unroll
        for (int k = 0; k < kIn; ++k) unpack(raw[u][k], in[k]);
#pragma unroll
        for (int e = 0; e < V; ++e) {
          float x[kIn], y[kOut];
#pragma unroll
          for (int k = 0; k < kIn; ++k) x[k] = in[k][e];
          f(x, y);
#pragma unroll
          for (int k = 0; k < kOut; ++k) out[k][e] = y[k];
        }
#pragma unroll
        for (int k = 0; k < kOut; ++k) store_chunk(a.out[k] + i * V, pack<T, V>(out[k]));
      }
    }
  }
  const int64_t tail = nvec * V + threadIdx.x;
  if (blockIdx.x == 0 && tail < a.n) map_one(a, f, tail);
}

template <class T, int kIn, int kOut, class F>
__global__ void __launch_bounds__(kMapThreads)
    map_scalar_kernel(const MapArgs<T, kIn, kOut> a, const F f) {
  grid_dependency_wait();
  const int64_t step = static_cast<int64_t>(gridDim.x) * kMapThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kMapThreads + threadIdx.x; i < a.n;
       i += step) {
    map_one(a, f, i);
  }
}

template <class T, int kIn, int kOut, class F>
void run_map(const char* op, const MapArgs<T, kIn, kOut>& a, F f) {
  if (a.n <= 0) return;
  bool vec = true;
  for (const T* p : a.in) vec = vec && is_aligned(p, 16);
  for (T* p : a.out) vec = vec && is_aligned(p, 16);
  if (vec) {
    const int64_t blocks = ceil_div(a.n / kVecOf<T>, kMapThreads * kMapUnroll);
    launch_dependent(map_vec_kernel<T, kIn, kOut, F>,
                     dim3(static_cast<unsigned>(std::clamp<int64_t>(blocks, 1, kMaxLoopBlocks))),
                     dim3(kMapThreads), 0, a, f);
  } else {
    const int64_t blocks = ceil_div(a.n, kMapThreads);
    launch_dependent(map_scalar_kernel<T, kIn, kOut, F>,
                     dim3(static_cast<unsigned>(std::min(blocks, kMaxLoopBlocks))),
                     dim3(kMapThreads), 0, a, f);
  }
  check_launch(op);
}

struct AddOp {
  __device__ void operator()(const float (&x)[2], float (&y)[1]) const { y[0] = x[0] + x[1]; }
};

template <Act kAct>
struct GatedFwdOp {  // (gate, up) -> out
  __device__ void operator()(const float (&x)[2], float (&y)[1]) const {
    y[0] = gate_value<kAct>(x[0]).f * x[1];
  }
};

template <Act kAct>
struct ActFwdOp {  // z -> act(z)
  __device__ void operator()(const float (&x)[1], float (&y)[1]) const {
    y[0] = gate_value<kAct>(x[0]).f;
  }
};

template <Act kAct>
struct ActBwdOp {  // (dy, z) -> dy act'(z)
  __device__ void operator()(const float (&x)[2], float (&y)[1]) const {
    y[0] = x[0] * gate_value<kAct>(x[1]).df;
  }
};

// out[j] = sum over rows of x[r][j] in fp32, rows in order (deterministic): one thread a column,
// consecutive threads on consecutive columns.
template <class T>
__global__ void col_sum_kernel(T* out, const T* x, int64_t rows, int64_t N) {
  grid_dependency_wait();
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < N;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float acc = 0.0f;
    for (int64_t r = 0; r < rows; ++r) acc += to_float(x[r * N + j]);
    out[j] = from_float<T>(acc);
  }
}

template <Act kAct>
struct GatedBwdOp {  // (dout, gate, up) -> (dgate, dup)
  __device__ void operator()(const float (&x)[3], float (&y)[2]) const {
    const GateValue g = gate_value<kAct>(x[1]);
    y[0] = x[0] * x[2] * g.df;
    y[1] = x[0] * g.f;
  }
};

// f(std::integral_constant<Act, act>{}).
template <class F>
void with_act(Act act, F&& f) {
  switch (act) {
    case Act::SiLU:
      return f(std::integral_constant<Act, Act::SiLU>{});
    case Act::GeluTanh:
      return f(std::integral_constant<Act, Act::GeluTanh>{});
    case Act::GeluErf:
      return f(std::integral_constant<Act, Act::GeluErf>{});
    case Act::None:
      return f(std::integral_constant<Act, Act::None>{});
  }
  fail("cuda::grad: unknown activation");
}

// ---------------------------------------------------------------------------------------------
// Row norms.
//
// The vector kernels split a row of D = nvec * V elements among a team of `team` threads, lane
// l holding vectors l, l + team, ..., l + (kNV - 1) * team in registers. Teams of up to 32
// threads (a power of two) share warps, teams = kRowBlock / team of them per block, and reduce
// by shuffles; wider teams are a whole block and reduce through shared memory. Rows go in
// groups of `teams` (row g * teams + t to team t), block b taking groups b, b + gridDim.x, ...:
// the grid is only as large as what is resident, so blocks start once and walk their rows.

constexpr int kRowBlock = 256;     // block of the small-team and the element-by-element kernels
constexpr int kMaxTeam = 512;      // widest team: rows up to 4 * 512 vectors (16384 bf16)
constexpr int kPartialsPerSm = 4;  // the most dw partial rows per SM (bounds the workspace)

// Launch bounds of the vector norm kernels: teams of up to kRowBlock threads holding one or two
// vectors each, with registers for four or three blocks an SM (what their rows in flight and the
// backward's dw sums need without spilling); teams of up to kMaxTeam holding four.
struct NormBounds {
  int threads, blocks;
};
template <int kNV>
constexpr NormBounds kNormBounds = kNV == 1   ? NormBounds{kRowBlock, 4}
                                   : kNV == 2 ? NormBounds{kRowBlock, 3}
                                              : NormBounds{kMaxTeam, 1};
// Whether a team loads its next row while it reduces the current one: where registers allow
// (measured on an H100: no gain with four vectors a thread, where it costs occupancy).
template <int kNV>
constexpr bool kPrefetch = kNV <= 2;

struct RowPlan {
  int nv = 0;       // vectors per thread: 1, 2 or 4; 0: the element-by-element kernels
  int team = 0;     // threads per row
  int threads = 0;  // per block
};

// The fewest vectors per thread that keep a team within kRowBlock threads (up to kMaxTeam with
// four each): short rows get small teams, several per block.
template <class T>
RowPlan row_plan(int64_t D, bool aligned) {
  constexpr int V = kVecOf<T>;
  if (aligned && D % V == 0) {
    const int64_t nvec = D / V;
    for (const int nv : {1, 2, 4}) {
      const int64_t t = ceil_div(nvec, nv);
      if (t <= kRowBlock || (nv == 4 && t <= kMaxTeam)) {
        if (t <= kWarp) return {nv, pow2_ceil(static_cast<int>(t)), kRowBlock};
        const int team = static_cast<int>(ceil_div(t, kWarp) * kWarp);
        return {nv, team, team};
      }
    }
  }
  return {0, 0, kRowBlock};
}

// Sum over a team: teams of up to 32 threads (a power of two, aligned in the warp) by shuffles,
// a wider team (the whole block) through `scratch`. Every thread of the block calls it.
__device__ __forceinline__ float team_sum(float v, int team, float* scratch) {
  if (team <= kWarp) {
    for (int o = team / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
  }
  return block_sum(v, scratch);
}

// A lane's vectors of one row.
template <class T, int kNV>
struct RowVecs {
  Chunk<T, kVecOf<T>> v[kNV];
  __device__ __forceinline__ void load(const T* row, int lane, int team, int nvec) {
#pragma unroll
    for (int k = 0; k < kNV; ++k) {
      const int j = lane + k * team;
      if (j < nvec) v[k] = load_chunk<T, kVecOf<T>>(row + static_cast<int64_t>(j) * kVecOf<T>);
    }
  }
};

template <class T>
struct NormFwdArgs {
  T* y;
  float* rstd;
  const T* x;
  const T* res;  // null: no residual
  T* sum;
  const T* w;
  int64_t rows, D;
  float eps;
  int team;
};

template <class T, int kNV, bool kRes>
__global__ void __launch_bounds__(kNormBounds<kNV>.threads, kNormBounds<kNV>.blocks)
    norm_fwd_vec_kernel(const NormFwdArgs<T> a) {
  grid_dependency_wait();
  constexpr int V = kVecOf<T>;
  __shared__ float scratch[kWarp];
  const int team = a.team, teams = static_cast<int>(blockDim.x) / team;
  const int lane = static_cast<int>(threadIdx.x) % team,
            slot = static_cast<int>(threadIdx.x) / team;
  const int nvec = static_cast<int>(a.D / V);
  const int64_t groups = ceil_div(a.rows, teams);
  RowVecs<T, kNV> x, r, x_next, r_next;  // x and residual of this row and of the next
  const auto fetch = [&](int64_t g, RowVecs<T, kNV>& xv, RowVecs<T, kNV>& rv) {
    const int64_t row = g * teams + slot;
    if (g < groups && row < a.rows) {
      xv.load(a.x + row * a.D, lane, team, nvec);
      if constexpr (kRes) rv.load(a.res + row * a.D, lane, team, nvec);
    }
  };
  int64_t g = blockIdx.x;
  if constexpr (kPrefetch<kNV>) fetch(g, x, r);
  for (; g < groups; g += gridDim.x) {
    const int64_t row = g * teams + slot;
    const bool valid = row < a.rows;
    if constexpr (kPrefetch<kNV>) {
      fetch(g + gridDim.x, x_next, r_next);
    } else {
      fetch(g, x, r);
    }
    float v[kNV][V];
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < kNV; ++k) {
      const int j = lane + k * team;
      if (valid && j < nvec) {
        unpack(x.v[k], v[k]);
        if constexpr (kRes) {
          float d[V];
          unpack(r.v[k], d);
#pragma unroll
          for (int e = 0; e < V; ++e) v[k][e] += d[e];
          x.v[k] = pack<T, V>(v[k]);
          store_chunk(a.sum + row * a.D + static_cast<int64_t>(j) * V, x.v[k]);
          unpack(x.v[k], v[k]);  // the norm reads the sum as stored
        }
#pragma unroll
        for (int e = 0; e < V; ++e) ss += v[k][e] * v[k][e];
      }
    }
    ss = team_sum(ss, team, scratch);
    const float inv = rsqrtf(ss / static_cast<float>(a.D) + a.eps);
    if (valid && lane == 0) a.rstd[row] = inv;
#pragma unroll
    for (int k = 0; k < kNV; ++k) {
      const int j = lane + k * team;
      if (valid && j < nvec) {
        // With four vectors a thread, unpacking the row again rather than holding its floats
        // over the sum leaves registers for twice the blocks (faster on an H100; with one or
        // two, holding them is).
        if constexpr (kNV == 4) unpack(x.v[k], v[k]);
        float w[V], y[V];
        unpack(load_chunk<T, V>(a.w + j * V), w);
#pragma unroll
        for (int e = 0; e < V; ++e) y[e] = v[k][e] * inv * w[e];
        store_chunk(a.y + row * a.D + static_cast<int64_t>(j) * V, pack<T, V>(y));
      }
    }
    if constexpr (kPrefetch<kNV>) {
      x = x_next;
      r = r_next;
    }
  }
}

// Any D and alignment: one row per block at a time, read twice (the second read mostly from
// cache). Each thread reads back only what it wrote, so sum may alias x and y may alias x.
template <class T, bool kRes>
__global__ void __launch_bounds__(kRowBlock) norm_fwd_scalar_kernel(const NormFwdArgs<T> a) {
  grid_dependency_wait();
  __shared__ float scratch[kWarp];
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const int64_t base = row * a.D;
    float ss = 0.0f;
    for (int64_t j = threadIdx.x; j < a.D; j += blockDim.x) {
      float v = to_float(a.x[base + j]);
      if constexpr (kRes) {
        const T s = from_float<T>(v + to_float(a.res[base + j]));
        a.sum[base + j] = s;
        v = to_float(s);
      }
      ss += v * v;
    }
    ss = block_sum(ss, scratch);
    const float inv = rsqrtf(ss / static_cast<float>(a.D) + a.eps);
    if (threadIdx.x == 0) a.rstd[row] = inv;
    const T* src = kRes ? a.sum : a.x;
    for (int64_t j = threadIdx.x; j < a.D; j += blockDim.x) {
      a.y[base + j] = from_float<T>(to_float(src[base + j]) * inv * to_float(a.w[j]));
    }
  }
}

template <class T>
struct NormBwdArgs {
  T* dx;
  float* partial;  // [gridDim.x, D] fp32: dw's partial sums (kDw)
  const T* dy;
  const T* x;
  const T* w;
  const float* rstd;
  const T* dres;  // null, or a gradient added to dx (may alias dx exactly)
  int64_t rows, D;
  int team;
};

// dx = rstd * dy * w - rstd^2 * mean(dy * w * x * rstd) * x (+ dres), from registers; dw's
// partial sums dy * x * rstd accumulate per lane over the block's rows.
template <class T, int kNV, bool kDw>
__global__ void __launch_bounds__(kNormBounds<kNV>.threads, kNormBounds<kNV>.blocks)
    norm_bwd_vec_kernel(const NormBwdArgs<T> a) {
  grid_dependency_wait();
  constexpr int V = kVecOf<T>;
  __shared__ float scratch[kWarp];
  const int team = a.team, teams = static_cast<int>(blockDim.x) / team;
  const int lane = static_cast<int>(threadIdx.x) % team,
            slot = static_cast<int>(threadIdx.x) / team;
  const int nvec = static_cast<int>(a.D / V);
  const int64_t groups = ceil_div(a.rows, teams);
  RowVecs<T, kNV> dy, x, dy_next, x_next;
  float inv = 0.0f, inv_next = 0.0f;
  const auto fetch = [&](int64_t g, RowVecs<T, kNV>& dyv, RowVecs<T, kNV>& xv, float& invv) {
    const int64_t row = g * teams + slot;
    if (g < groups && row < a.rows) {
      dyv.load(a.dy + row * a.D, lane, team, nvec);
      xv.load(a.x + row * a.D, lane, team, nvec);
      invv = a.rstd[row];
    }
  };
  float acc[kNV][V];  // dw's partial sums (kDw)
#pragma unroll
  for (int k = 0; k < kNV; ++k) {
#pragma unroll
    for (int e = 0; e < V; ++e) acc[k][e] = 0.0f;
  }
  int64_t g = blockIdx.x;
  if constexpr (kPrefetch<kNV>) fetch(g, dy, x, inv);
  for (; g < groups; g += gridDim.x) {
    const int64_t row = g * teams + slot;
    const bool valid = row < a.rows;
    if constexpr (kPrefetch<kNV>) {
      fetch(g + gridDim.x, dy_next, x_next, inv_next);
    } else {
      fetch(g, dy, x, inv);
    }
    float dot = 0.0f;  // sum of dy * w * x
#pragma unroll
    for (int k = 0; k < kNV; ++k) {
      const int j = lane + k * team;
      if (valid && j < nvec) {
        float d[V], xv[V], w[V];
        unpack(dy.v[k], d);
        unpack(x.v[k], xv);
        unpack(load_chunk<T, V>(a.w + j * V), w);
#pragma unroll
        for (int e = 0; e < V; ++e) {
          dot += d[e] * w[e] * xv[e];
          if constexpr (kDw) acc[k][e] += d[e] * (xv[e] * inv);
        }
      }
    }
    RowVecs<T, kNV> dres;
    if (a.dres != nullptr && valid) dres.load(a.dres + row * a.D, lane, team, nvec);
    dot = team_sum(dot, team, scratch);
    // dx = inv * dy * w - c * x with c = inv^2 * mean(g * xhat) = inv^3 * dot / D.
    const float c = inv * inv * (dot * inv / static_cast<float>(a.D));
#pragma unroll
    for (int k = 0; k < kNV; ++k) {
      const int j = lane + k * team;
      if (valid && j < nvec) {
        float d[V], xv[V], w[V], out[V];
        unpack(dy.v[k], d);
        unpack(x.v[k], xv);
        unpack(load_chunk<T, V>(a.w + j * V), w);
#pragma unroll
        for (int e = 0; e < V; ++e) out[e] = inv * (d[e] * w[e]) - c * xv[e];
        if (a.dres != nullptr) {
          float r[V];
          unpack(dres.v[k], r);
#pragma unroll
          for (int e = 0; e < V; ++e) out[e] += r[e];
        }
        store_chunk(a.dx + row * a.D + static_cast<int64_t>(j) * V, pack<T, V>(out));
      }
    }
    if constexpr (kPrefetch<kNV>) {
      dy = dy_next;
      x = x_next;
      inv = inv_next;
    }
  }
  if constexpr (kDw) {
    float* part = a.partial + static_cast<int64_t>(blockIdx.x) * a.D;
    if (teams == 1) {
#pragma unroll
      for (int k = 0; k < kNV; ++k) {
        const int j = lane + k * team;
        if (j < nvec) {
#pragma unroll
          for (int q = 0; q < V / 4; ++q) {
            reinterpret_cast<float4*>(part + static_cast<int64_t>(j) * V)[q] =
                make_float4(acc[k][4 * q], acc[k][4 * q + 1], acc[k][4 * q + 2], acc[k][4 * q + 3]);
          }
        }
      }
    } else if constexpr (kNV == 1) {  // (teams of up to 32 threads hold one vector each)
      // The block's teams add up their sums in team order through shared memory:
      // teams * D <= (kRowBlock / team) * (team * V) floats.
      __shared__ float team_sums[kRowBlock * V];
      const int D = nvec * V;
      if (lane < nvec) {
#pragma unroll
        for (int e = 0; e < V; ++e) team_sums[slot * D + lane * V + e] = acc[0][e];
      }
      __syncthreads();
      for (int col = threadIdx.x; col < D; col += blockDim.x) {
        float s = 0.0f;
        for (int t = 0; t < teams; ++t) s += team_sums[t * D + col];
        part[col] = s;
      }
    }
  }
}

// Any D and alignment: one row per block at a time, read twice. dw's partial row of the block
// lives in the workspace, each column updated by the one thread that owns it.
template <class T, bool kDw>
__global__ void __launch_bounds__(kRowBlock) norm_bwd_scalar_kernel(const NormBwdArgs<T> a) {
  grid_dependency_wait();
  __shared__ float scratch[kWarp];
  float* part = kDw ? a.partial + static_cast<int64_t>(blockIdx.x) * a.D : nullptr;
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const int64_t base = row * a.D;
    const float inv = a.rstd[row];
    float dot = 0.0f;
    for (int64_t j = threadIdx.x; j < a.D; j += blockDim.x) {
      dot += to_float(a.dy[base + j]) * to_float(a.w[j]) * to_float(a.x[base + j]);
    }
    dot = block_sum(dot, scratch);
    const float c = inv * inv * (dot * inv / static_cast<float>(a.D));
    const bool first = row == blockIdx.x;
    for (int64_t j = threadIdx.x; j < a.D; j += blockDim.x) {
      const float d = to_float(a.dy[base + j]), xv = to_float(a.x[base + j]);
      const float r = a.dres != nullptr ? to_float(a.dres[base + j]) : 0.0f;
      a.dx[base + j] = from_float<T>(inv * (d * to_float(a.w[j])) - c * xv + r);
      if constexpr (kDw) part[j] = (first ? 0.0f : part[j]) + d * (xv * inv);
    }
  }
}

// dw[j] = sum of partial[p][j] over p < parts: a block per 32 columns, its 32 rows of threads
// each summing every 32nd partial in order (kDwBatch loads in flight at a time), then those 32
// sums added in order. The order is fixed, so the bits are too.
constexpr int kDwCols = 32, kDwLanes = 32, kDwBatch = 8;
template <class T>
__global__ void __launch_bounds__(kDwCols* kDwLanes)
    dw_sum_kernel(T* dw, const float* partial, int64_t parts, int64_t D) {
  grid_dependency_wait();
  __shared__ float sums[kDwLanes][kDwCols + 1];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kDwCols + threadIdx.x;
  float s = 0.0f;
  if (col < D) {
    for (int64_t p0 = threadIdx.y; p0 < parts; p0 += kDwLanes * kDwBatch) {
      float v[kDwBatch];
#pragma unroll
      for (int u = 0; u < kDwBatch; ++u) {
        const int64_t p = p0 + u * kDwLanes;
        v[u] = p < parts ? partial[p * D + col] : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < kDwBatch; ++u) s += v[u];
    }
  }
  sums[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && col < D) {
    float t = 0.0f;
    for (int k = 0; k < kDwLanes; ++k) t += sums[k][threadIdx.x];
    dw[col] = from_float<T>(t);
  }
}

int64_t max_partials(int64_t rows) {
  return std::min(rows, int64_t{kPartialsPerSm} * device_info().sm_count);
}

// Launches kernel over `groups` row groups with as many blocks as are resident (at most
// max_blocks), then as few as take the same number of groups each at most (fewer dw partials
// for the same time); returns the block count.
template <class Args>
int64_t launch_rows(void (*kernel)(Args), const Args& a, int threads, int64_t groups,
                    int64_t max_blocks) {
  const int64_t most = std::min(
      {groups, resident_blocks(reinterpret_cast<const void*>(kernel), threads), max_blocks});
  const int64_t blocks = ceil_div(groups, ceil_div(groups, most));
  launch_dependent(kernel, dim3(static_cast<unsigned>(blocks)), dim3(threads), 0, a);
  return blocks;
}

template <class T, bool kRes>
void (*norm_fwd_kernel(int nv))(NormFwdArgs<T>) {
  switch (nv) {
    case 1:
      return norm_fwd_vec_kernel<T, 1, kRes>;
    case 2:
      return norm_fwd_vec_kernel<T, 2, kRes>;
    case 4:
      return norm_fwd_vec_kernel<T, 4, kRes>;
    default:
      return norm_fwd_scalar_kernel<T, kRes>;
  }
}

template <class T, bool kDw>
void (*norm_bwd_kernel(int nv))(NormBwdArgs<T>) {
  switch (nv) {
    case 1:
      return norm_bwd_vec_kernel<T, 1, kDw>;
    case 2:
      return norm_bwd_vec_kernel<T, 2, kDw>;
    case 4:
      return norm_bwd_vec_kernel<T, 4, kDw>;
    default:
      return norm_bwd_scalar_kernel<T, kDw>;
  }
}

// Row groups of a plan: rows / teams per block (one row each for the scalar kernels).
int64_t row_groups(const RowPlan& p, int64_t rows) {
  return p.nv == 0 ? rows : ceil_div(rows, p.threads / p.team);
}

// ---------------------------------------------------------------------------------------------
// RoPE by tables. Work items are (row, chunk) for the B * S * H head rows: rows are numbered
// in x's memory order, (b, s, h) with h innermost, or (b, h, s) with s innermost when x's heads
// are further apart than its positions (a [B, H, S, D] tensor), so that a block's threads read
// neighbouring rows.

template <class T, class TC>
struct RopeArgs {
  T* y;
  const T* x;
  const TC* cos;
  const TC* sin;
  int64_t x_st[4], y_st[4];  // b, s, h, d
  int64_t cs_b, cs_s;
  int64_t S, H;
  bool h_inner;
  int64_t rows;  // B * S * H
  int half, rot_dim;
  int chunks;      // items per row
  int rot_chunks;  // of which rotate pairs (the rest copy dims past rot_dim)
  bool half_split, inverse;
};

// q = a / b, r = a % b for a, b >= 0, in 32 bits where both fit.
__device__ __forceinline__ void divmod(int64_t a, int64_t b, int64_t& q, int64_t& r) {
  if (((a | b) >> 31) == 0) {
    const uint32_t qa = static_cast<uint32_t>(a) / static_cast<uint32_t>(b);
    q = qa;
    r = static_cast<uint32_t>(a) - qa * static_cast<uint32_t>(b);
  } else {
    q = a / b;
    r = a - q * b;
  }
}

struct RopeRow {
  int64_t b, s, h;
};

template <class T, class TC>
__device__ __forceinline__ RopeRow rope_row(const RopeArgs<T, TC>& a, int64_t row) {
  RopeRow r;
  int64_t rest, inner, outer;
  if (a.h_inner) {
    divmod(row, a.H, rest, inner);
    divmod(rest, a.S, outer, r.s);
    r.h = inner;
  } else {
    divmod(row, a.S, rest, inner);
    divmod(rest, a.H, outer, r.h);
    r.s = inner;
  }
  r.b = outer;
  return r;
}

__device__ __forceinline__ void rotate(float& a, float& b, float c, float s) {
  const float x0 = a, x1 = b;
  a = x0 * c - x1 * s;
  b = x0 * s + x1 * c;
}

// D's stride 1, rows 16-byte aligned: a rotating chunk is kP pairs, V elements from each half
// (half-split) or V adjacent elements (V / 2 pairs); a copying chunk V elements past rot_dim.
template <class T, class TC, bool kHalfSplit>
__global__ void __launch_bounds__(kRowBlock) rope_vec_kernel(const RopeArgs<T, TC> a) {
  grid_dependency_wait();
  constexpr int V = kVecOf<T>;
  constexpr int kP = kHalfSplit ? V : V / 2;
  const int64_t items = a.rows * a.chunks;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t it = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; it < items;
       it += step) {
    int64_t row, c;
    divmod(it, a.chunks, row, c);
    const RopeRow r = rope_row(a, row);
    const T* x = a.x + r.b * a.x_st[0] + r.s * a.x_st[1] + r.h * a.x_st[2];
    T* y = a.y + r.b * a.y_st[0] + r.s * a.y_st[1] + r.h * a.y_st[2];
    if (c < a.rot_chunks) {
      const int64_t i0 = c * kP;  // first pair
      const int64_t t = r.b * a.cs_b + r.s * a.cs_s + i0;
      float cs[kP], sn[kP];
      unpack(load_chunk<TC, kP>(a.cos + t), cs);
      unpack(load_chunk<TC, kP>(a.sin + t), sn);
      if (a.inverse) {
#pragma unroll
        for (int k = 0; k < kP; ++k) sn[k] = -sn[k];
      }
      if constexpr (kHalfSplit) {
        float lo[V], hi[V];
        unpack(load_chunk<T, V>(x + i0), lo);
        unpack(load_chunk<T, V>(x + a.half + i0), hi);
#pragma unroll
        for (int k = 0; k < V; ++k) rotate(lo[k], hi[k], cs[k], sn[k]);
        store_chunk(y + i0, pack<T, V>(lo));
        store_chunk(y + a.half + i0, pack<T, V>(hi));
      } else {
        float p[V];
        unpack(load_chunk<T, V>(x + 2 * i0), p);
#pragma unroll
        for (int k = 0; k < kP; ++k) rotate(p[2 * k], p[2 * k + 1], cs[k], sn[k]);
        store_chunk(y + 2 * i0, pack<T, V>(p));
      }
    } else {
      const int64_t d = a.rot_dim + (c - a.rot_chunks) * V;
      store_chunk(y + d, load_chunk<T, V>(x + d));
    }
  }
}

// Any strides: an item is a pair (chunk < half) or one dim past rot_dim.
template <class T, class TC>
__global__ void __launch_bounds__(kRowBlock) rope_scalar_kernel(const RopeArgs<T, TC> a) {
  grid_dependency_wait();
  const int64_t items = a.rows * a.chunks;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t xd = a.x_st[3], yd = a.y_st[3];
  for (int64_t it = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; it < items;
       it += step) {
    int64_t row, c;
    divmod(it, a.chunks, row, c);
    const RopeRow r = rope_row(a, row);
    const T* x = a.x + r.b * a.x_st[0] + r.s * a.x_st[1] + r.h * a.x_st[2];
    T* y = a.y + r.b * a.y_st[0] + r.s * a.y_st[1] + r.h * a.y_st[2];
    if (c < a.half) {
      const int64_t d0 = a.half_split ? c : 2 * c, d1 = a.half_split ? c + a.half : 2 * c + 1;
      const int64_t t = r.b * a.cs_b + r.s * a.cs_s + c;
      const float cs = to_float(a.cos[t]), sv = to_float(a.sin[t]);
      float p0 = to_float(x[d0 * xd]), p1 = to_float(x[d1 * xd]);
      rotate(p0, p1, cs, a.inverse ? -sv : sv);
      y[d0 * yd] = from_float<T>(p0);
      y[d1 * yd] = from_float<T>(p1);
    } else {
      const int64_t d = a.rot_dim + (c - a.half);
      y[d * yd] = x[d * xd];
    }
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------

template <class T>
void add(T* out, const T* a, const T* b, int64_t n) {
  run_map("grad::add", MapArgs<T, 2, 1>{{out}, {a, b}, n}, AddOp{});
}

template <class T>
void gated_fwd(T* out, const T* gate, const T* up, int64_t n, Act act) {
  with_act(act, [&](auto kAct) {
    run_map("grad::gated_fwd", MapArgs<T, 2, 1>{{out}, {gate, up}, n},
            GatedFwdOp<decltype(kAct)::value>{});
  });
}

template <class T>
void gated_bwd(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int64_t n, Act act) {
  with_act(act, [&](auto kAct) {
    run_map("grad::gated_bwd", MapArgs<T, 3, 2>{{dgate, dup}, {dout, gate, up}, n},
            GatedBwdOp<decltype(kAct)::value>{});
  });
}

template <class T>
void act_fwd(T* y, const T* z, int64_t n, Act act) {
  with_act(act, [&](auto kAct) {
    run_map("grad::act_fwd", MapArgs<T, 1, 1>{{y}, {z}, n}, ActFwdOp<decltype(kAct)::value>{});
  });
}

template <class T>
void act_bwd(T* dz, const T* dy, const T* z, int64_t n, Act act) {
  with_act(act, [&](auto kAct) {
    run_map("grad::act_bwd", MapArgs<T, 2, 1>{{dz}, {dy, z}, n}, ActBwdOp<decltype(kAct)::value>{});
  });
}

template <class T>
void col_sum(T* out, const T* x, int64_t rows, int64_t N) {
  if (N <= 0) return;
  constexpr int kThreads = 256;
  launch_dependent(col_sum_kernel<T>,
                   dim3(static_cast<unsigned>(std::min(ceil_div(N, kThreads), kMaxLoopBlocks))),
                   dim3(kThreads), 0, out, x, rows, N);
  check_launch("grad::col_sum");
}

template <class T>
void rms_norm_fwd(T* y, float* rstd, const T* x, const T* residual, T* sum, const T* w,
                  int64_t rows, int64_t D, float eps) {
  if (rows <= 0 || D <= 0) return;
  const bool res = residual != nullptr;
  if (res && sum == nullptr) fail("grad::rms_norm_fwd: a residual needs `sum`");
  const bool aligned = is_aligned(y, 16) && is_aligned(x, 16) && is_aligned(w, 16) &&
                       (!res || (is_aligned(residual, 16) && is_aligned(sum, 16)));
  const RowPlan p = row_plan<T>(D, aligned);
  const NormFwdArgs<T> a{y, rstd, x, residual, sum, w, rows, D, eps, p.team};
  const auto kernel = res ? norm_fwd_kernel<T, true>(p.nv) : norm_fwd_kernel<T, false>(p.nv);
  launch_rows(kernel, a, p.threads, row_groups(p, rows), kMaxLoopBlocks);
  check_launch("grad::rms_norm_fwd");
}

size_t rms_norm_bwd_workspace(int64_t rows, int64_t D) {
  if (rows <= 0 || D <= 0) return 0;
  return static_cast<size_t>(max_partials(rows) * D) * sizeof(float);
}

template <class T>
void rms_norm_bwd(T* dx, T* dw, void* workspace, const T* dy, const T* x, const T* w,
                  const float* rstd, int64_t rows, int64_t D, const T* dres) {
  if (D <= 0) return;
  if (rows <= 0) {  // dw sums no rows
    if (dw != nullptr) {
      LLMK_CUDA_CHECK(cudaMemsetAsync(dw, 0, static_cast<size_t>(D) * sizeof(T), current_stream()));
    }
    return;
  }
  const bool want_dw = dw != nullptr;
  if (want_dw && (workspace == nullptr || !is_aligned(workspace, 16))) {
    fail("grad::rms_norm_bwd: dw needs a 16-byte aligned workspace (rms_norm_bwd_workspace)");
  }
  const bool aligned = is_aligned(dx, 16) && is_aligned(dy, 16) && is_aligned(x, 16) &&
                       is_aligned(w, 16) && is_aligned(dres, 16);
  const RowPlan p = row_plan<T>(D, aligned);
  const NormBwdArgs<T> a{dx, static_cast<float*>(workspace), dy, x, w, rstd, dres, rows, D, p.team};
  const int64_t groups = row_groups(p, rows);
  if (!want_dw) {
    launch_rows(norm_bwd_kernel<T, false>(p.nv), a, p.threads, groups, kMaxLoopBlocks);
    check_launch("grad::rms_norm_bwd");
    return;
  }
  const int64_t parts =
      launch_rows(norm_bwd_kernel<T, true>(p.nv), a, p.threads, groups, max_partials(rows));
  check_launch("grad::rms_norm_bwd");
  launch_dependent(dw_sum_kernel<T>, dim3(static_cast<unsigned>(ceil_div(D, kDwCols))),
                   dim3(kDwCols, kDwLanes), 0, dw, static_cast<const float*>(workspace), parts, D);
  check_launch("grad::rms_norm_bwd (dw)");
}

template <class T, class TC>
void rope_rotate(T* y, const T* x, const TC* cos, const TC* sin, const RopeShape& s, bool inverse) {
  if (s.B <= 0 || s.S <= 0 || s.H <= 0 || s.D <= 0) return;
  if (s.rot_dim <= 0 || s.rot_dim % 2 != 0 || s.rot_dim > s.D) {
    fail("grad::rope_rotate: rot_dim must be even and in (0, D]");
  }
  constexpr int V = kVecOf<T>;
  RopeArgs<T, TC> a{};
  a.y = y;
  a.x = x;
  a.cos = cos;
  a.sin = sin;
  // Strides of dims of size 1 never reach an address: zero them so they do not spoil alignment.
  const int64_t sizes[4] = {s.B, s.S, s.H, s.D};
  for (int k = 0; k < 4; ++k) {
    a.x_st[k] = sizes[k] == 1 ? 0 : s.x_st[k];
    a.y_st[k] = sizes[k] == 1 ? 0 : s.y_st[k];
  }
  a.cs_b = s.B == 1 ? 0 : s.cs_b;
  a.cs_s = s.S == 1 ? 0 : s.cs_s;
  a.S = s.S;
  a.H = s.H;
  a.h_inner = std::abs(a.x_st[2]) <= std::abs(a.x_st[1]);
  a.rows = s.B * s.S * s.H;
  a.half = s.rot_dim / 2;
  a.rot_dim = s.rot_dim;
  a.half_split = s.half_split;
  a.inverse = inverse;
  const bool in_place = static_cast<const void*>(y) == static_cast<const void*>(x);
  const int64_t tail = in_place ? 0 : s.D - s.rot_dim;

  // The vector kernel: unit D stride, 16-byte aligned rows, whole vectors in each half (or in
  // rot_dim) and past it, and the tables' chunk of kP pairs aligned to its size (up to 16).
  const int kP = s.half_split ? V : V / 2;
  const size_t cs_align = std::min<size_t>(static_cast<size_t>(kP) * sizeof(TC), 16);
  bool vec = s.x_st[3] == 1 && s.y_st[3] == 1 && is_aligned(x, 16) && is_aligned(y, 16) &&
             s.D % V == 0 && a.half % kP == 0 && is_aligned(cos, cs_align) &&
             is_aligned(sin, cs_align) &&
             (a.cs_b * static_cast<int64_t>(sizeof(TC))) % static_cast<int64_t>(cs_align) == 0 &&
             (a.cs_s * static_cast<int64_t>(sizeof(TC))) % static_cast<int64_t>(cs_align) == 0;
  for (int k = 0; k < 3; ++k) vec = vec && a.x_st[k] % V == 0 && a.y_st[k] % V == 0;
  if (vec) {
    a.rot_chunks = a.half / kP;
    a.chunks = static_cast<int>(a.rot_chunks + tail / V);
  } else {
    a.rot_chunks = a.half;
    a.chunks = static_cast<int>(a.half + tail);
  }
  const int64_t blocks = std::min(ceil_div(a.rows * a.chunks, kRowBlock), kMaxLoopBlocks);
  const dim3 grid(static_cast<unsigned>(blocks)), block(kRowBlock);
  if (!vec) {
    launch_dependent(rope_scalar_kernel<T, TC>, grid, block, 0, a);
  } else if (s.half_split) {
    launch_dependent(rope_vec_kernel<T, TC, true>, grid, block, 0, a);
  } else {
    launch_dependent(rope_vec_kernel<T, TC, false>, grid, block, 0, a);
  }
  check_launch("grad::rope_rotate");
}

#define LLMK_GRAD_INSTANTIATE(T)                                                                  \
  template void add<T>(T*, const T*, const T*, int64_t);                                          \
  template void rms_norm_fwd<T>(T*, float*, const T*, const T*, T*, const T*, int64_t, int64_t,   \
                                float);                                                           \
  template void rms_norm_bwd<T>(T*, T*, void*, const T*, const T*, const T*, const float*,        \
                                int64_t, int64_t, const T*);                                      \
  template void gated_fwd<T>(T*, const T*, const T*, int64_t, Act);                               \
  template void gated_bwd<T>(T*, T*, const T*, const T*, const T*, int64_t, Act);                 \
  template void act_fwd<T>(T*, const T*, int64_t, Act);                                           \
  template void act_bwd<T>(T*, const T*, const T*, int64_t, Act);                                 \
  template void col_sum<T>(T*, const T*, int64_t, int64_t);                                       \
  template void rope_rotate<T, float>(T*, const T*, const float*, const float*, const RopeShape&, \
                                      bool);
LLMK_GRAD_INSTANTIATE(float)
LLMK_GRAD_INSTANTIATE(__nv_bfloat16)
LLMK_GRAD_INSTANTIATE(__half)
#undef LLMK_GRAD_INSTANTIATE
template void rope_rotate<__nv_bfloat16, __nv_bfloat16>(__nv_bfloat16*, const __nv_bfloat16*,
                                                        const __nv_bfloat16*, const __nv_bfloat16*,
                                                        const RopeShape&, bool);
template void rope_rotate<__half, __half>(__half*, const __half*, const __half*, const __half*,
                                          const RopeShape&, bool);

}  // namespace llmk::cuda::grad
