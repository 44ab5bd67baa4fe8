// Softmax over rows, one block per row: one pass for the running (max, sum of exp) of each
// thread (online softmax), a block-wide merge, and one pass that writes exp(x - max) / sum.
// x is read twice and out written once.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/softmax.h"

namespace llmk::cuda {

namespace {

// A running softmax denominator: sum of exp(x - max) over the elements seen.
struct MaxSum {
  float max, sum;
};

__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.max, b.max);
  if (m == -INFINITY) return {m, 0.0f};  // neither has seen a finite element
  return {m, a.sum * expf(a.max - m) + b.sum * expf(b.max - m)};
}

template <class TOut, class TIn>
__global__ void softmax_kernel(TOut* out, int64_t out_ld, const TIn* x, int64_t x_ld, int64_t N) {
  __shared__ MaxSum scratch[kWarp];
  const TIn* xr = x + static_cast<int64_t>(blockIdx.x) * x_ld;
  TOut* yr = out + static_cast<int64_t>(blockIdx.x) * out_ld;
  MaxSum acc{-INFINITY, 0.0f};
  for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
    acc = merge(acc, MaxSum{to_float(xr[i]), 1.0f});
  }
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) {
    const MaxSum other{__shfl_xor_sync(0xffffffffu, acc.max, o),
                       __shfl_xor_sync(0xffffffffu, acc.sum, o)};
    acc = merge(acc, other);
  }
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  if (lane == 0) scratch[warp] = acc;
  __syncthreads();
  acc = MaxSum{-INFINITY, 0.0f};
  for (int k = 0; k < static_cast<int>(blockDim.x) / kWarp; ++k) acc = merge(acc, scratch[k]);
  const float max = acc.max, inv = 1.0f / acc.sum;
  // Reads precede writes element by element in each thread, so out may alias x.
  for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
    yr[i] = from_float<TOut>(expf(to_float(xr[i]) - max) * inv);
  }
}

template <class TOut, class TIn>
void launch(void* out, int64_t out_ld, const void* x, int64_t x_ld, int64_t rows, int64_t N) {
  // A thread per two elements, up to 1024: short rows do not idle a big block.
  const int threads = block_threads_for(ceil_div(N, 2), 1024);
  softmax_kernel<TOut, TIn><<<static_cast<unsigned>(rows), threads, 0, current_stream()>>>(
      static_cast<TOut*>(out), out_ld, static_cast<const TIn*>(x), x_ld, N);
}

}  // namespace

void softmax(void* out, DType out_type, int64_t out_ld, const void* x, DType x_type, int64_t x_ld,
             int64_t rows, int64_t N) {
  if (rows == 0 || N == 0) return;
  using bf16 = __nv_bfloat16;
  const bool out_f32 = out_type == DType::F32, x_f32 = x_type == DType::F32;
  if (out_f32 && x_f32) {
    launch<float, float>(out, out_ld, x, x_ld, rows, N);
  } else if (out_f32) {
    launch<float, bf16>(out, out_ld, x, x_ld, rows, N);
  } else if (x_f32) {
    launch<bf16, float>(out, out_ld, x, x_ld, rows, N);
  } else {
    launch<bf16, bf16>(out, out_ld, x, x_ld, rows, N);
  }
  check_launch("softmax");
}

}  // namespace llmk::cuda
