// Pairwise cosine diversity in O(N d) (diversity.h). A warp takes a row at a time: it reads the
// row once for |x_i| and again (from L1) to add u_i into its own slice of the block's column
// sums in shared memory; the blocks' sums are added in a fixed order, so S (and every result)
// does not depend on scheduling. Row outputs and gradients then take a warp per row again, S in
// shared memory, last row first: the rows the column sums read last may still be in the L2.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "core/cuda/check.h"
#include "core/cuda/device.h"
#include "core/cuda/stream.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/diversity.h"

namespace llmk::cuda::grad {

namespace {

constexpr int kWarps = 8, kThreads = kWarps * 32;
constexpr size_t kMaxSmem = 96 * 1024;  // the warps' column-sum slices of a block

int sum_blocks() { return 4 * device_info().sm_count; }

// Warps per block whose column slices (d floats each) fit kMaxSmem; 0 where not even one does.
int colsum_warps(int64_t d) {
  return static_cast<int>(std::min<int64_t>(kWarps, kMaxSmem / (4 * std::max<int64_t>(d, 1))));
}

struct Work {  // the workspace's parts
  float *partial, *inv, *S, *G;
  unsigned* nonzero;  // the count of nonzero rows (integer atomics: exact in any order)
};
Work carve(void* ws, int64_t N, int64_t d) {
  float* p = static_cast<float*>(ws);
  Work w;
  w.partial = p;
  p += static_cast<int64_t>(sum_blocks()) * d;
  w.inv = p;
  p += N;
  w.S = p;
  p += d;
  w.G = p;
  p += d;
  w.nonzero = reinterpret_cast<unsigned*>(p);
  return w;
}

// Partial column sums of the rows' c_i u_i (c_i = weight[i], or 1), one [d] row per block, and
// (with inv_out) 1 / |x_i| for each row (0 for a zero row); inv_in: norms already known.
template <class T>
__global__ void __launch_bounds__(kThreads)
    colsum_kernel(float* partial, float* inv_out, unsigned* nonzero, const float* inv_in,
                  const float* weight, const T* x, int64_t N, int64_t d) {
  grid_dependency_wait();            // launched dependent on the kernel before it
  unsigned nz = 0;                   // this warp's nonzero rows
  extern __shared__ float slices[];  // [warps][d]
  const int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* mine = slices + static_cast<int64_t>(warp) * d;
  for (int64_t c = lane; c < d; c += 32) mine[c] = 0.0f;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * warps + warp; i < N;
       i += static_cast<int64_t>(gridDim.x) * warps) {
    const T* r = x + i * d;
    float inv;
    if (inv_in) {
      inv = inv_in[i];
    } else {
      float ss = 0.0f;
      for (int64_t c = lane; c < d; c += 32) {
        const float v = to_float(r[c]);
        ss += v * v;
      }
      ss = warp_sum(ss);
      inv = ss > 0.0f ? rsqrtf(ss) : 0.0f;
      if (lane == 0 && inv_out) inv_out[i] = inv;
      nz += inv > 0.0f ? 1u : 0u;
    }
    const float c_i = inv * (weight ? weight[i] : 1.0f);
    if (c_i == 0.0f) continue;
    for (int64_t c = lane; c < d; c += 32) mine[c] += to_float(r[c]) * c_i;
  }
  if (lane == 0 && nonzero && nz) atomicAdd(nonzero, nz);
  __syncthreads();
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    float s = 0.0f;
    for (int w = 0; w < warps; ++w) s += slices[static_cast<int64_t>(w) * d + c];
    partial[static_cast<int64_t>(blockIdx.x) * d + c] = s;
  }
}

// out[c] = sum over the P partial rows: a block per 32 columns, warp w summing rows w, w + 32,
// ... (in order), then warp 0 the 32 warps' sums in order: reproducible, and P loads spread over
// 32 warps instead of one thread (d / 32 blocks: few, so each must be wide).
constexpr int kReduceWarps = 32;
__global__ void __launch_bounds__(kReduceWarps * 32)
    reduce_kernel(float* out, const float* partial, int P, int64_t d) {
  grid_dependency_wait();  // launched dependent on the kernel before it
  __shared__ float part[kReduceWarps][32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + lane;
  float t = 0.0f;
  if (c < d) {
#pragma unroll 4
    for (int p = warp; p < P; p += kReduceWarps) t += partial[static_cast<int64_t>(p) * d + c];
  }
  part[warp][lane] = t;
  __syncthreads();
  if (warp == 0 && c < d) {
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kReduceWarps; ++w) sum += part[w][lane];
    out[c] = sum;
  }
}

// out[0] = 1 - (|S|^2 - nonzero rows) / (N (N - 1)), one block.
__global__ void mean_kernel(float* out, const float* S, const unsigned* nonzero, int64_t N,
                            int64_t d) {
  grid_dependency_wait();  // launched dependent on the kernel before it
  __shared__ float scratch[32];
  float ss = 0.0f;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) ss += S[c] * S[c];
  ss = block_sum(ss, scratch);
  if (threadIdx.x == 0) {
    const float nz = static_cast<float>(*nonzero);
    out[0] = 1.0f - (ss - nz) / (static_cast<float>(N) * static_cast<float>(N - 1));
  }
}

// rows: out[i] = 1 - (u_i . S - |u_i|^2) / (N - 1), a warp per row, S in shared memory.
template <class T>
__global__ void __launch_bounds__(kThreads)
    rows_kernel(float* out, const T* x, const float* inv, const float* S, int64_t N, int64_t d) {
  extern __shared__ float sS[];
  grid_dependency_wait();  // launched dependent on the kernel before it
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) sS[c] = S[c];
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * kWarps + warp; t < N;
       t += static_cast<int64_t>(gridDim.x) * kWarps) {
    const int64_t i = N - 1 - t;  // the rows the column sums read last first
    const T* r = x + i * d;
    float dot = 0.0f;
    for (int64_t c = lane; c < d; c += 32) dot += to_float(r[c]) * sS[c];
    dot = warp_sum(dot);
    const float s = inv[i];
    if (lane == 0) {
      out[i] = 1.0f - (dot * s - (s > 0.0f ? 1.0f : 0.0f)) / static_cast<float>(N - 1);
    }
  }
}

// dx_k = (du_k - (du_k . u_k) u_k) / |x_k|, with
//   mean: du_k = -2 g (S - u_k) / (N (N - 1));
//   rows: du_k = -(g_k S + G - 2 g_k u_k) / (N - 1), G = sum_i g_i u_i.
// A warp per row: the row read for du_k . u_k, then again (from L1) for dx_k.
template <class T>
__global__ void __launch_bounds__(kThreads)
    bwd_kernel(T* dx, const float* dout, const T* x, const float* inv, const float* S,
               const float* G, int64_t N, int64_t d, bool rows) {
  extern __shared__ float sh[];  // S, then G (rows)
  float* sS = sh;
  float* sG = sh + d;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    sS[c] = S[c];
    if (rows) sG[c] = G[c];
  }
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float pairs = static_cast<float>(N) * static_cast<float>(N - 1);
  const float others = static_cast<float>(N - 1);
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * kWarps + warp; t < N;
       t += static_cast<int64_t>(gridDim.x) * kWarps) {
    const int64_t k = N - 1 - t;  // the rows the column sums read last first
    const T* r = x + k * d;
    T* o = dx + k * d;
    const float s = inv[k];
    if (s == 0.0f) {
      for (int64_t c = lane; c < d; c += 32) o[c] = from_float<T>(0.0f);
      continue;
    }
    const float g = rows ? dout[k] : dout[0];
    auto du = [&](int64_t c, float u) {
      return rows ? -(g * sS[c] + sG[c] - 2.0f * g * u) / others : -2.0f * g * (sS[c] - u) / pairs;
    };
    float proj = 0.0f;
    for (int64_t c = lane; c < d; c += 32) {
      const float u = to_float(r[c]) * s;
      proj += du(c, u) * u;
    }
    proj = warp_sum(proj);
    for (int64_t c = lane; c < d; c += 32) {
      const float u = to_float(r[c]) * s;
      o[c] = from_float<T>((du(c, u) - proj * u) * s);
    }
  }
}

// ---- The fast path: rows of 32 x kPer 16-byte vectors (d = 32 kPer E, E = 16 / sizeof(T)),
// each lane holding kPer vectors of a row in registers (all loaded before any is used) and its
// columns' share of S (and G) in registers: a row is read from memory once per kernel.

template <class T>
constexpr int kElems = 16 / static_cast<int>(sizeof(T));  // per 16-byte vector

template <class T, int kPer>
struct Row {
  uint4 v[kPer];
  __device__ void load(const T* r, int lane) {
#pragma unroll
    for (int j = 0; j < kPer; ++j) v[j] = reinterpret_cast<const uint4*>(r)[j * 32 + lane];
  }
  // The same with an L2 eviction policy (l2_evict_first_policy and the like).
  __device__ void load(const T* r, int lane, uint64_t policy) {
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      asm volatile("ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;\n"
                   : "=r"(v[j].x), "=r"(v[j].y), "=r"(v[j].z), "=r"(v[j].w)
                   : "l"(reinterpret_cast<const uint4*>(r) + j * 32 + lane), "l"(policy));
    }
  }
  __device__ float at(int j, int e) const { return to_float(reinterpret_cast<const T*>(&v[j])[e]); }
  __device__ float sum_squares() const {
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < kPer; ++j)
#pragma unroll
      for (int e = 0; e < kElems<T>; ++e) ss += at(j, e) * at(j, e);
    return ss;
  }
};
// The column of a lane's element (j, e).
template <class T>
__device__ __forceinline__ int64_t col(int j, int lane, int e) {
  return static_cast<int64_t>(j * 32 + lane) * kElems<T> + e;
}

// Blocks per SM of colsum_fast_kernel: as many as hold a lane's sums (kPer x E floats) and its
// row without spilling (at 4 blocks, 64 registers a thread, bf16 rows of 1024 spilled 56 bytes
// and the kernel ran at half the DRAM rate of rows_fast_kernel on the same rows); the grid is
// one wave of them.
template <class T, int kPer>
constexpr int kColsumFastBlocks = kPer* kElems<T> <= 16   ? 4
                                  : kPer* kElems<T> <= 32 ? 3
                                                          : 1;

template <class T, int kPer>
__global__ void __launch_bounds__(kThreads, kColsumFastBlocks<T, kPer>)
    colsum_fast_kernel(float* partial, float* inv_out, unsigned* nonzero, const float* inv_in,
                       const float* weight, const T* x, int64_t N, int64_t keep_from) {
  grid_dependency_wait();  // launched dependent on the kernel before it
  unsigned nz = 0;         // this warp's nonzero rows
  constexpr int E = kElems<T>;
  constexpr int64_t d = 32 * kPer * E;
  __shared__ float slice[d];  // the block's sums, the warps adding theirs in turn
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // Rows from keep_from on stay in the L2 for the row pass, which reads them first; the others
  // go first.
  const uint64_t keep = l2_evict_last_policy(), pass = l2_evict_first_policy();
  float acc[kPer][E] = {};
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kWarps + warp; i < N;
       i += static_cast<int64_t>(gridDim.x) * kWarps) {
    Row<T, kPer> row;
    row.load(x + i * d, lane, i >= keep_from ? keep : pass);
    float inv;
    if (inv_in) {
      inv = inv_in[i];
    } else {
      const float ss = warp_sum(row.sum_squares());
      inv = ss > 0.0f ? rsqrtf(ss) : 0.0f;
      if (lane == 0 && inv_out) inv_out[i] = inv;
      nz += inv > 0.0f ? 1u : 0u;
    }
    const float c_i = inv * (weight ? weight[i] : 1.0f);
#pragma unroll
    for (int j = 0; j < kPer; ++j)
#pragma unroll
      for (int e = 0; e < E; ++e) acc[j][e] += row.at(j, e) * c_i;
  }
  if (lane == 0 && nonzero && nz) atomicAdd(nonzero, nz);
  // The warps add theirs in a fixed order (warp 0 first), so the sums are reproducible.
  for (int w = 0; w < kWarps; ++w) {
    if (warp == w) {
#pragma unroll
      for (int j = 0; j < kPer; ++j)
#pragma unroll
        for (int e = 0; e < E; ++e) {
          float& t = slice[col<T>(j, lane, e)];
          t = (w == 0 ? 0.0f : t) + acc[j][e];
        }
    }
    __syncthreads();
  }
  for (int64_t c = threadIdx.x; c < d; c += kThreads) {
    partial[static_cast<int64_t>(blockIdx.x) * d + c] = slice[c];
  }
}

template <class T, int kPer>
__global__ void __launch_bounds__(kThreads)
    rows_fast_kernel(float* out, const T* x, const float* inv, const float* S, int64_t N) {
  grid_dependency_wait();  // launched dependent on the kernel before it
  constexpr int E = kElems<T>;
  constexpr int64_t d = 32 * kPer * E;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const uint64_t last_use = l2_evict_first_policy();
  float s_reg[kPer][E];
#pragma unroll
  for (int j = 0; j < kPer; ++j)
#pragma unroll
    for (int e = 0; e < E; ++e) s_reg[j][e] = S[col<T>(j, lane, e)];
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * kWarps + warp; t < N;
       t += static_cast<int64_t>(gridDim.x) * kWarps) {
    const int64_t i = N - 1 - t;  // the rows the column sums read last (and kept) first
    Row<T, kPer> row;
    row.load(x + i * d, lane, last_use);
    float dot = 0.0f;
#pragma unroll
    for (int j = 0; j < kPer; ++j)
#pragma unroll
      for (int e = 0; e < E; ++e) dot += row.at(j, e) * s_reg[j][e];
    dot = warp_sum(dot);
    const float s = inv[i];
    if (lane == 0) {
      out[i] = 1.0f - (dot * s - (s > 0.0f ? 1.0f : 0.0f)) / static_cast<float>(N - 1);
    }
  }
}

template <class T, int kPer>
__global__ void __launch_bounds__(kThreads)
    bwd_fast_kernel(T* dx, const float* dout, const T* x, const float* inv, const float* S,
                    const float* G, int64_t N, bool rows) {
  constexpr int E = kElems<T>;
  constexpr int64_t d = 32 * kPer * E;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float s_reg[kPer][E], g_reg[kPer][E];
#pragma unroll
  for (int j = 0; j < kPer; ++j)
#pragma unroll
    for (int e = 0; e < E; ++e) {
      s_reg[j][e] = S[col<T>(j, lane, e)];
      g_reg[j][e] = rows ? G[col<T>(j, lane, e)] : 0.0f;
    }
  const float pairs = static_cast<float>(N) * static_cast<float>(N - 1);
  const float others = static_cast<float>(N - 1);
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * kWarps + warp; t < N;
       t += static_cast<int64_t>(gridDim.x) * kWarps) {
    const int64_t k = N - 1 - t;  // the rows the column sums read last first
    Row<T, kPer> row;
    row.load(x + k * d, lane);
    const float s = inv[k], g = rows ? dout[k] : dout[0];
    float du[kPer][E], proj = 0.0f;
#pragma unroll
    for (int j = 0; j < kPer; ++j)
#pragma unroll
      for (int e = 0; e < E; ++e) {
        const float u = row.at(j, e) * s;
        du[j][e] = rows ? -(g * s_reg[j][e] + g_reg[j][e] - 2.0f * g * u) / others
                        : -2.0f * g * (s_reg[j][e] - u) / pairs;
        proj += du[j][e] * u;
      }
    proj = warp_sum(proj);
    uint4* o = reinterpret_cast<uint4*>(dx + k * d);
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      uint4 raw;
      T* h = reinterpret_cast<T*>(&raw);
#pragma unroll
      for (int e = 0; e < E; ++e) {
        h[e] = from_float<T>(s == 0.0f ? 0.0f : (du[j][e] - proj * row.at(j, e) * s) * s);
      }
      o[j * 32 + lane] = raw;
    }
  }
}

// Calls f.template operator()<kPer>() where d = 32 kPer E for kPer in {1, 2, 4, 8} and x is
// 16-byte aligned; false (nothing called) for any other d: the general kernels then run.
template <class T, class F>
bool with_fast(int64_t d, const void* x, F&& f) {
  constexpr int64_t w = 32 * kElems<T>;
  if (d % w != 0 || !is_aligned(x, 16)) return false;
  switch (d / w) {
    case 1:
      f.template operator()<1>();
      return true;
    case 2:
      f.template operator()<2>();
      return true;
    case 4:
      f.template operator()<4>();
      return true;
    case 8:
      f.template operator()<8>();
      return true;
    default:
      return false;
  }
}

template <class K>
void set_smem(K* kernel, size_t smem) {
  if (smem > 48 * 1024) {
    LLMK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem)));
  }
}

int row_blocks(int64_t N) {
  return static_cast<int>(std::max<int64_t>(
      1, std::min<int64_t>((N + kWarps - 1) / kWarps, 8 * device_info().sm_count)));
}

// S (and, with weight, the weighted sum into `into`) from the rows; inv written when compute_inv,
// and the count of nonzero rows into w.nonzero when count_nonzero (the mean needs it). keep_from:
// the first row that the fast kernel asks the L2 to keep (N: none). The kernels go with
// programmatic dependent launch (each waits for the one before it first): their launches overlap
// the kernel before.
template <class T>
void column_sums(float* into, const Work& w, const float* weight, const T* x, int64_t N, int64_t d,
                 bool compute_inv, bool count_nonzero, int64_t keep_from) {
  int P = sum_blocks();  // partial rows: at most this many
  if (count_nonzero) {
    LLMK_CUDA_CHECK(cudaMemsetAsync(w.nonzero, 0, sizeof(unsigned), current_stream()));
  }
  unsigned* nonzero = count_nonzero ? w.nonzero : nullptr;
  const bool fast = with_fast<T>(d, x, [&]<int kPer>() {
    P = kColsumFastBlocks<T, kPer> * device_info().sm_count;
    launch_dependent(colsum_fast_kernel<T, kPer>, P, kThreads, 0, w.partial,
                     compute_inv ? w.inv : nullptr, nonzero, compute_inv ? nullptr : w.inv, weight,
                     x, N, keep_from);
  });
  if (!fast) {
    const int warps = colsum_warps(d);  // >= 1: cosine_diversity_max_dim() was checked
    const size_t smem = static_cast<size_t>(warps) * static_cast<size_t>(d) * 4;
    set_smem(colsum_kernel<T>, smem);
    launch_dependent(colsum_kernel<T>, P, warps * 32, smem, w.partial,
                     compute_inv ? w.inv : nullptr, nonzero, compute_inv ? nullptr : w.inv, weight,
                     x, N, d);
  }
  launch_dependent(reduce_kernel, static_cast<unsigned>((d + 31) / 32), kReduceWarps * 32, 0, into,
                   w.partial, P, d);
}

}  // namespace

int64_t cosine_diversity_max_dim() { return static_cast<int64_t>(kMaxSmem / 4); }

size_t cosine_diversity_workspace(int64_t N, int64_t d) {
  return 4 * static_cast<size_t>(static_cast<int64_t>(sum_blocks()) * d + N + 2 * d + 1);
}

template <class T>
void cosine_diversity_fwd(float* out, const T* x, int64_t N, int64_t d, bool rows,
                          void* workspace) {
  const cudaStream_t st = current_stream();
  if (N < 2) {
    LLMK_CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(float) * (rows ? N : 1), st));
    return;
  }
  const Work w = carve(workspace, N, d);
  // The row means read the rows again, the last ones first: as many as half the L2 holds are
  // asked to stay there.
  const int64_t kept =
      rows ? static_cast<int64_t>(device_info().l2_bytes / 2 / (static_cast<size_t>(d) * sizeof(T)))
           : 0;
  const int64_t keep_from = std::max<int64_t>(0, N - kept);
  column_sums<T>(w.S, w, nullptr, x, N, d, true, !rows, keep_from);
  if (!rows) {
    launch_dependent(mean_kernel, 1, 1024, 0, out, w.S, w.nonzero, N, d);
    return;
  }
  if (!with_fast<T>(d, x, [&]<int kPer>() {
        // One wave: as many blocks as fit at once (two waves of 8 an SM left a tail).
        static const int per_sm = [] {
          int n = 0;
          LLMK_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
              &n, rows_fast_kernel<T, kPer>, kThreads, 0));
          return std::max(n, 1);
        }();
        const int blocks = static_cast<int>(std::min<int64_t>(
            row_blocks(N), static_cast<int64_t>(per_sm) * device_info().sm_count));
        launch_dependent(rows_fast_kernel<T, kPer>, blocks, kThreads, 0, out, x, w.inv, w.S, N);
      })) {
    const size_t smem = 4 * static_cast<size_t>(d);
    set_smem(rows_kernel<T>, smem);
    launch_dependent(rows_kernel<T>, row_blocks(N), kThreads, smem, out, x, w.inv, w.S, N, d);
  }
}

template <class T>
void cosine_diversity_bwd(T* dx, const float* dout, const T* x, int64_t N, int64_t d, bool rows,
                          void* workspace) {
  const cudaStream_t st = current_stream();
  if (N < 2) {
    LLMK_CUDA_CHECK(cudaMemsetAsync(dx, 0, sizeof(T) * static_cast<size_t>(N * d), st));
    return;
  }
  const Work w = carve(workspace, N, d);
  column_sums<T>(w.S, w, nullptr, x, N, d, true, false, N);
  if (rows) column_sums<T>(w.G, w, dout, x, N, d, false, false, N);  // G = sum_i g_i u_i
  const bool fast = is_aligned(dx, 16) && with_fast<T>(d, x, [&]<int kPer>() {
                      bwd_fast_kernel<T, kPer><<<row_blocks(N), kThreads, 0, st>>>(
                          dx, dout, x, w.inv, w.S, w.G, N, rows);
                    });
  if (!fast) {
    const size_t smem = 4 * static_cast<size_t>(d) * (rows ? 2 : 1);
    set_smem(bwd_kernel<T>, smem);
    bwd_kernel<T><<<row_blocks(N), kThreads, smem, st>>>(dx, dout, x, w.inv, w.S, w.G, N, d, rows);
  }
  LLMK_CUDA_CHECK(cudaGetLastError());
}

#define LLMK_DIVERSITY_INSTANTIATE(T)                                                     \
  template void cosine_diversity_fwd<T>(float*, const T*, int64_t, int64_t, bool, void*); \
  template void cosine_diversity_bwd<T>(T*, const float*, const T*, int64_t, int64_t, bool, void*);
LLMK_DIVERSITY_INSTANTIATE(float)
LLMK_DIVERSITY_INSTANTIATE(__nv_bfloat16)
LLMK_DIVERSITY_INSTANTIATE(__half)
#undef LLMK_DIVERSITY_INSTANTIATE

}  // namespace llmk::cuda::grad
