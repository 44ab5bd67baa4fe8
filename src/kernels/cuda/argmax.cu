// Argmax over rows, one block per row: each thread keeps the best (value, index) of its
// elements, then the block merges them; the lower index wins among equal values, so the result
// is the first maximum whatever the order threads saw them in. Gumbel-max sampling is the same
// pass twice: the row's maximum (for min-p's floor), then the argmax of x / T + noise.
#include <climits>

#include "kernels/cuda/argmax.h"
#include "kernels/cuda/common.cuh"
#include "kernels/gumbel.h"
#include "kernels/penalty.h"

namespace llmk::cuda {

namespace {

struct Best {
  float v;
  int32_t i;
};

// NaN counts as -inf (as in cpu::argmax).
__device__ __forceinline__ float key(float x) { return isnan(x) ? -INFINITY : x; }

__device__ __forceinline__ Best better(Best a, Best b) {
  return (b.v > a.v || (b.v == a.v && b.i < a.i)) ? b : a;
}

__device__ __forceinline__ void load(const float* p, float (&f)[4]) {
  const float4 v = *reinterpret_cast<const float4*>(p);
  f[0] = v.x;
  f[1] = v.y;
  f[2] = v.z;
  f[3] = v.w;
}
__device__ __forceinline__ void load(const __nv_bfloat16* p, float (&f)[8]) { load_bf16<8>(p, f); }

// The best (key(x_i, i), i) of a row of N elements, for every thread of the block; key maps a
// value (NaN already -inf) and its column to what is compared. kVec elements per 16-byte access
// when the row start is aligned (1: element by element).
template <class T, int kVec, class Key>
__device__ Best row_best(const T* xr, int64_t N, Best* scratch, Key k) {
  Best best{-INFINITY, INT_MAX};
  const int64_t nvec = kVec > 1 ? N / kVec : 0;  // whole vectors; the rest element by element
  if constexpr (kVec > 1) {
    for (int64_t c = threadIdx.x; c < nvec; c += blockDim.x) {
      float f[kVec];
      load(xr + c * kVec, f);
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        const auto i = static_cast<int32_t>(c * kVec + e);
        best = better(best, Best{k(key(f[e]), i), i});
      }
    }
  }
  for (int64_t i = nvec * kVec + threadIdx.x; i < N; i += blockDim.x) {
    best = better(best,
                  Best{k(key(to_float(xr[i])), static_cast<int32_t>(i)), static_cast<int32_t>(i)});
  }
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) {
    const Best other{__shfl_xor_sync(0xffffffffu, best.v, o),
                     __shfl_xor_sync(0xffffffffu, best.i, o)};
    best = better(best, other);
  }
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  if (lane == 0) scratch[warp] = best;
  __syncthreads();
  best = scratch[0];
  for (int w = 1; w < static_cast<int>(blockDim.x) / kWarp; ++w) best = better(best, scratch[w]);
  __syncthreads();  // scratch may be reused
  return best;
}

template <class T, int kVec>
__global__ void argmax_kernel(int32_t* out, int64_t out_stride, const T* x, int64_t x_ld,
                              int64_t N) {
  grid_dependency_wait();  // launch_dependent: the logits come from the kernel before
  __shared__ Best scratch[kWarp];
  const T* xr = x + static_cast<int64_t>(blockIdx.x) * x_ld;
  const Best best = row_best<T, kVec>(xr, N, scratch, [](float v, int32_t) { return v; });
  if (threadIdx.x == 0) out[static_cast<int64_t>(blockIdx.x) * out_stride] = best.i;
}

// cpu::sample_gumbel's draw, the same bits: the row's argmax, then the argmax of the keys of the
// columns at or above min-p's floor (none finite: the argmax stands).
template <class T, int kVec>
__global__ void gumbel_kernel(int32_t* out, const T* x, int64_t x_ld, int64_t N,
                              const float* temperature, const float* min_p, const uint64_t* seed) {
  grid_dependency_wait();
  __shared__ Best scratch[kWarp];
  const int64_t r = blockIdx.x;
  const T* xr = x + r * x_ld;
  const Best top = row_best<T, kVec>(xr, N, scratch, [](float v, int32_t) { return v; });
  int32_t pick = top.i;
  if (top.v > -INFINITY) {
    const float t = temperature[r], inv_t = 1.0f / t;
    const float floor = gumbel::floor_of(top.v, t, min_p[r]);
    const uint64_t s = seed[r];
    const Best b = row_best<T, kVec>(xr, N, scratch, [=](float v, int32_t i) {
      return v >= floor && v > -INFINITY ? gumbel::key(v, inv_t, gumbel::noise(s, i)) : -INFINITY;
    });
    if (b.v > -INFINITY) pick = b.i;
  }
  if (threadIdx.x == 0) out[r] = pick;
}

template <class T, int kVec>
void launch(int32_t* out, int64_t out_stride, const void* x, int64_t x_ld, int64_t rows,
            int64_t N) {
  const int threads = block_threads_for(ceil_div(N, 4 * kVec), 1024);
  launch_dependent(argmax_kernel<T, kVec>, dim3(static_cast<unsigned>(rows)), dim3(threads), 0, out,
                   out_stride, static_cast<const T*>(x), x_ld, N);
}

template <class T, int kVec>
void launch_gumbel(int32_t* out, const void* x, int64_t x_ld, int64_t rows, int64_t N,
                   const float* temperature, const float* min_p, const uint64_t* seed) {
  const int threads = block_threads_for(ceil_div(N, 4 * kVec), 1024);
  launch_dependent(gumbel_kernel<T, kVec>, dim3(static_cast<unsigned>(rows)), dim3(threads), 0, out,
                   static_cast<const T*>(x), x_ld, N, temperature, min_p, seed);
}

// One thread per entry: its row's logit at its column, penalised in place (entries distinct).
__global__ void penalty_kernel(float* x, int64_t x_ld, const int32_t* at, const float* by,
                               int64_t n) {
  grid_dependency_wait();
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= n) return;
  float* l = x + at[2 * e] * x_ld + at[2 * e + 1];
  *l = penalty::apply(*l, by[2 * e], by[2 * e + 1]);
}

}  // namespace

void apply_penalties(float* x, int64_t x_ld, const int32_t* at, const float* by, int64_t n) {
  if (n == 0) return;
  constexpr int kThreads = 256;
  launch_dependent(penalty_kernel, dim3(static_cast<unsigned>(ceil_div(n, kThreads))),
                   dim3(kThreads), 0, x, x_ld, at, by, n);
  check_launch("apply_penalties");
}

void sample_gumbel(int32_t* out, const float* x, int64_t x_ld, int64_t rows, int64_t N,
                   const float* temperature, const float* min_p, const uint64_t* seed) {
  if (rows == 0) return;
  const bool vec = is_aligned(x, 16) && x_ld % 4 == 0;
  vec ? launch_gumbel<float, 4>(out, x, x_ld, rows, N, temperature, min_p, seed)
      : launch_gumbel<float, 1>(out, x, x_ld, rows, N, temperature, min_p, seed);
  check_launch("sample_gumbel");
}

void argmax(int32_t* out, int64_t out_stride, const void* x, DType x_type, int64_t x_ld,
            int64_t rows, int64_t N) {
  if (rows == 0) return;
  if (x_type == DType::F32) {
    const bool vec = is_aligned(x, 16) && x_ld % 4 == 0;
    vec ? launch<float, 4>(out, out_stride, x, x_ld, rows, N)
        : launch<float, 1>(out, out_stride, x, x_ld, rows, N);
  } else {
    const bool vec = is_aligned(x, 16) && x_ld % 8 == 0;
    vec ? launch<__nv_bfloat16, 8>(out, out_stride, x, x_ld, rows, N)
        : launch<__nv_bfloat16, 1>(out, out_stride, x, x_ld, rows, N);
  }
  check_launch("argmax");
}

}  // namespace llmk::cuda
