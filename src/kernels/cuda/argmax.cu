// Argmax over rows, one block per row: each thread keeps the best (value, index) of its
// elements, then the block merges them; the lower index wins among equal values, so the result
// is the first maximum whatever the order threads saw them in.
#include <climits>

#include "kernels/cuda/argmax.h"
#include "kernels/cuda/common.cuh"

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

// kVec elements per 16-byte access when the row start is aligned (1: element by element).
template <class T, int kVec>
__global__ void argmax_kernel(int32_t* out, int64_t out_stride, const T* x, int64_t x_ld,
                              int64_t N) {
  grid_dependency_wait();  // launch_dependent: the logits come from the kernel before
  __shared__ Best scratch[kWarp];
  const T* xr = x + static_cast<int64_t>(blockIdx.x) * x_ld;
  Best best{-INFINITY, INT_MAX};
  const int64_t nvec = kVec > 1 ? N / kVec : 0;  // whole vectors; the rest element by element
  if constexpr (kVec > 1) {
    for (int64_t c = threadIdx.x; c < nvec; c += blockDim.x) {
      float f[kVec];
      load(xr + c * kVec, f);
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        best = better(best, Best{key(f[e]), static_cast<int32_t>(c * kVec + e)});
      }
    }
  }
  for (int64_t i = nvec * kVec + threadIdx.x; i < N; i += blockDim.x) {
    best = better(best, Best{key(to_float(xr[i])), static_cast<int32_t>(i)});
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
  if (threadIdx.x == 0) {
    for (int k = 1; k < static_cast<int>(blockDim.x) / kWarp; ++k) best = better(best, scratch[k]);
    out[static_cast<int64_t>(blockIdx.x) * out_stride] = best.i;
  }
}

template <class T, int kVec>
void launch(int32_t* out, int64_t out_stride, const void* x, int64_t x_ld, int64_t rows,
            int64_t N) {
  const int threads = block_threads_for(ceil_div(N, 4 * kVec), 1024);
  launch_dependent(argmax_kernel<T, kVec>, dim3(static_cast<unsigned>(rows)), dim3(threads), 0, out,
                   out_stride, static_cast<const T*>(x), x_ld, N);
}

}  // namespace

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
