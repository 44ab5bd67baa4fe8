// An element-wise map over rows of T (bf16, fp16 or f32), shared by the activation and
// element-wise kernels: out[r, i] = f(in_0[r, i], ..., in_{N-1}[r, i]) in fp32, rounded to T once.
// Rows may be strided; out may alias an input exactly (each element is read before it is written,
// by the same thread). Included by .cu files only.
#pragma once

#include <algorithm>

#include "kernels/cuda/vec.cuh"

namespace llmk::cuda {

template <class T, int N>
struct MapRows {
  T* out;
  int64_t out_ld;
  const T* in[N];
  int64_t in_ld[N];
  int64_t rows, D;
};

// kVec elements per thread step: 8 (16-byte accesses, two for f32) where every row start is
// 16-byte aligned and D is a multiple of 8, else 1.
template <class T, int N, int kVec, class F>
__global__ void map_rows_kernel(const MapRows<T, N> a, F f) {
  grid_dependency_wait();
  const int64_t chunks = a.D / kVec;
  for (int64_t r = blockIdx.y; r < a.rows; r += gridDim.y) {
    for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < chunks;
         c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      float v[N][kVec];
#pragma unroll
      for (int k = 0; k < N; ++k) load_vec<T, kVec>(a.in[k] + r * a.in_ld[k] + c * kVec, v[k]);
      float y[kVec];
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        if constexpr (N == 1) {
          y[e] = f(v[0][e]);
        } else {
          y[e] = f(v[0][e], v[1][e]);
        }
      }
      store_vec<T, kVec>(a.out + r * a.out_ld + c * kVec, y);
    }
  }
}

// Launches map_rows_kernel on current_stream() and checks the launch as `op`.
template <class T, int N, class F>
void map_rows(const char* op, const MapRows<T, N>& a, F f) {
  if (a.rows == 0 || a.D == 0) return;
  bool vec = a.D % 8 == 0 && is_aligned(a.out, 16) && a.out_ld % 8 == 0;
  for (int k = 0; k < N; ++k) vec = vec && is_aligned(a.in[k], 16) && a.in_ld[k] % 8 == 0;
  const int kVecWidth = vec ? 8 : 1;
  const int64_t chunks = a.D / kVecWidth;
  constexpr int kThreads = 256;
  // Enough blocks along a row to cover it (up to 1024; they loop beyond), one row per grid row.
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(ceil_div(chunks, kThreads), 1024)),
                  static_cast<unsigned>(std::min(a.rows, kMaxGridY)));
  if (vec) {
    launch_dependent(map_rows_kernel<T, N, 8, F>, grid, dim3(kThreads), 0, a, f);
  } else {
    launch_dependent(map_rows_kernel<T, N, 1, F>, grid, dim3(kThreads), 0, a, f);
  }
  check_launch(op);
}

}  // namespace llmk::cuda
