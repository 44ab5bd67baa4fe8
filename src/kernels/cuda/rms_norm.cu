// RMS norm, alone and fused with the residual add: one block per row.
//
// Rows of T: bf16, fp16 or f32. The vector kernel keeps its row in registers (each thread up to
// kMaxVecs vectors of 8 elements, 16 bytes of 16-bit ones), so the row is read once and written
// once: 2 * D * sizeof(T) bytes per row for rms_norm, 5 * D * sizeof(T) for add_rms_norm (x,
// delta read; x, out written). The scalar kernel takes any width and
// alignment and reads the row twice (the second read mostly hits the cache); it also serves rows
// over 16384 wide.
#include "kernels/cuda/rms_norm.h"
#include "kernels/cuda/vec.cuh"

namespace llmk::cuda {

namespace {

constexpr int kVec = 8;           // elements per vector (16 bytes of bf16 / fp16)
constexpr int kMaxVecs = 4;       // vectors a thread holds, with their weights in f32
constexpr int kMaxThreads = 512;  // rows up to 512 * 4 * 8 = 16384 wide (wider: the scalar kernel)

template <class T>
struct NormRows {
  T* x;  // written only when delta is set (add_rms_norm)
  int64_t x_ld;
  const T* delta;  // null: plain rms_norm
  int64_t delta_ld;
  T* out;
  int64_t out_ld;
  int64_t D;
  const float* w;
  float eps;
  bool add_one;
  // Rows in two levels (rms_norm of a [A, B, D] view, e.g. the heads of q inside the Q|K|V
  // output): row r is (r / inner, r % inner), at offset (r / inner) * *_ld + (r % inner) *
  // *_ld_inner. inner = 1: plain rows *_ld apart.
  int64_t inner = 1;
  int64_t x_ld_inner = 0, out_ld_inner = 0;
  bool release_first = false;  // cuda::release_dependents_first() at launch
};

__device__ __forceinline__ int64_t row_offset(int64_t row, int64_t inner, int64_t ld,
                                              int64_t ld_inner) {
  return inner == 1 ? row * ld : (row / inner) * ld + (row % inner) * ld_inner;
}

template <class T>
__device__ __forceinline__ float weight(const NormRows<T>& a, float w) {
  return a.add_one ? 1.0f + w : w;
}

template <class T, bool kAdd>
__global__ void __launch_bounds__(kMaxThreads) rms_norm_vec_kernel(NormRows<T> a) {
  const int64_t nvec = a.D / kVec;
  // The weights first, before the wait: no kernel writes them, so their loads overlap the
  // previous kernel's tail instead of following the row's sum of squares.
  float w[kMaxVecs][kVec];
#pragma unroll
  for (int k = 0; k < kMaxVecs; ++k) {
    const int64_t j = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
    if (j < nvec) {
      const float4 w0 = reinterpret_cast<const float4*>(a.w + j * kVec)[0];
      const float4 w1 = reinterpret_cast<const float4*>(a.w + j * kVec)[1];
      w[k][0] = w0.x, w[k][1] = w0.y, w[k][2] = w0.z, w[k][3] = w0.w;
      w[k][4] = w1.x, w[k][5] = w1.y, w[k][6] = w1.z, w[k][7] = w1.w;
    }
  }
  grid_dependency_wait(a.release_first);
  __shared__ float scratch[kWarp];
  const int64_t row = blockIdx.x;
  T* x = a.x + row_offset(row, a.inner, a.x_ld, a.x_ld_inner);
  T* out = a.out + row_offset(row, a.inner, a.out_ld, a.out_ld_inner);
  float v[kMaxVecs][kVec];
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < kMaxVecs; ++k) {
    const int64_t j = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
    if (j < nvec) {
      load_vec<T, kVec>(x + j * kVec, v[k]);
      if constexpr (kAdd) {
        float d[kVec];
        load_vec<T, kVec>(a.delta + row * a.delta_ld + j * kVec, d);
#pragma unroll
        for (int e = 0; e < kVec; ++e) v[k][e] += d[e];
        round_to<T>(v[k]);  // the norm reads the sum as stored
        store_vec<T, kVec>(x + j * kVec, v[k]);
      }
#pragma unroll
      for (int e = 0; e < kVec; ++e) ss += v[k][e] * v[k][e];
    }
  }
  ss = block_sum(ss, scratch);
  const float inv = rsqrtf(ss / static_cast<float>(a.D) + a.eps);
#pragma unroll
  for (int k = 0; k < kMaxVecs; ++k) {
    const int64_t j = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
    if (j < nvec) {
      float y[kVec];
#pragma unroll
      for (int e = 0; e < kVec; ++e) y[e] = v[k][e] * inv * weight(a, w[k][e]);
      store_vec<T, kVec>(out + j * kVec, y);
    }
  }
}

// Any width and alignment. Each thread reads back only the elements it wrote itself, so x may
// be updated in place (add) or aliased by out (rms_norm) without further barriers.
template <class T, bool kAdd>
__global__ void rms_norm_scalar_kernel(NormRows<T> a) {
  grid_dependency_wait(a.release_first);
  __shared__ float scratch[kWarp];
  const int64_t row = blockIdx.x;
  T* x = a.x + row_offset(row, a.inner, a.x_ld, a.x_ld_inner);
  T* out = a.out + row_offset(row, a.inner, a.out_ld, a.out_ld_inner);
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < a.D; i += blockDim.x) {
    float v = to_float(x[i]);
    if constexpr (kAdd) {
      const T sum = from_float<T>(v + to_float(a.delta[row * a.delta_ld + i]));
      x[i] = sum;
      v = to_float(sum);
    }
    ss += v * v;
  }
  ss = block_sum(ss, scratch);
  const float inv = rsqrtf(ss / static_cast<float>(a.D) + a.eps);
  for (int64_t i = threadIdx.x; i < a.D; i += blockDim.x) {
    out[i] = from_float<T>(to_float(x[i]) * inv * weight(a, a.w[i]));
  }
}

template <class T, bool kAdd>
void launch(NormRows<T> a, int64_t rows, const char* op) {
  if (rows == 0) return;
  a.release_first = release_dependents_first();
  const int64_t nvec = a.D / kVec;
  const bool vec = a.D % kVec == 0 && nvec <= int64_t{kMaxThreads} * kMaxVecs &&
                   is_aligned(a.x, 16) && is_aligned(a.out, 16) && is_aligned(a.w, 16) &&
                   a.x_ld % kVec == 0 && a.out_ld % kVec == 0 && a.x_ld_inner % kVec == 0 &&
                   a.out_ld_inner % kVec == 0 &&
                   (!kAdd || (is_aligned(a.delta, 16) && a.delta_ld % kVec == 0));
  // One block per row, up to 2^31 - 1 rows.
  if (vec) {
    // Two vectors a thread while the row allows it (more loads in flight per row), up to 4.
    const int threads = block_threads_for(ceil_div(nvec, 2), kMaxThreads);
    launch_dependent(rms_norm_vec_kernel<T, kAdd>, dim3(static_cast<unsigned>(rows)), dim3(threads),
                     0, a);
  } else {
    const int threads = block_threads_for(a.D, 256);
    launch_dependent(rms_norm_scalar_kernel<T, kAdd>, dim3(static_cast<unsigned>(rows)),
                     dim3(threads), 0, a);
  }
  check_launch(op);
}

}  // namespace

void rms_norm(DType dt, void* out, int64_t out_ld, const void* x, int64_t x_ld, int64_t rows,
              int64_t D, const float* w, float eps, bool add_one) {
  rms_norm_2d(dt, out, out_ld, 0, x, x_ld, 0, rows, 1, D, w, eps, add_one);
}

void rms_norm_2d(DType dt, void* out, int64_t out_ld, int64_t out_ld_inner, const void* x,
                 int64_t x_ld, int64_t x_ld_inner, int64_t outer, int64_t inner, int64_t D,
                 const float* w, float eps, bool add_one) {
  with_float_type(dt, [&](auto t) {
    using T = decltype(t);
    // x is only read: the kernel writes x only when delta is set.
    NormRows<T> a{static_cast<T*>(const_cast<void*>(x)),
                  x_ld,
                  nullptr,
                  0,
                  static_cast<T*>(out),
                  out_ld,
                  D,
                  w,
                  eps,
                  add_one};
    a.inner = inner;
    a.x_ld_inner = x_ld_inner;
    a.out_ld_inner = out_ld_inner;
    launch<T, false>(a, outer * inner, "rms_norm");
  });
}

void add_rms_norm(DType dt, void* x, int64_t x_ld, const void* delta, int64_t delta_ld, void* out,
                  int64_t out_ld, int64_t rows, int64_t D, const float* w, float eps,
                  bool add_one) {
  with_float_type(dt, [&](auto t) {
    using T = decltype(t);
    const NormRows<T> a{static_cast<T*>(x),
                        x_ld,
                        static_cast<const T*>(delta),
                        delta_ld,
                        static_cast<T*>(out),
                        out_ld,
                        D,
                        w,
                        eps,
                        add_one};
    if (delta) {
      launch<T, true>(a, rows, "add_rms_norm");
    } else {
      launch<T, false>(a, rows, "add_rms_norm");
    }
  });
}

}  // namespace llmk::cuda
