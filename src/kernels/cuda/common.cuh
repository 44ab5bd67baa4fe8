// Shared device helpers for the CUDA kernels: bf16 conversion, warp/block reductions, sizes.
// Included by .cu files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "core/cuda/check.h"
#include "core/cuda/stream.h"

namespace llmk::cuda {

constexpr int kWarp = 32;

__host__ __device__ constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
// The smallest power of two >= n (n >= 1).
__host__ __device__ constexpr int pow2_ceil(int n) {
  int p = 1;
  while (p < n) p *= 2;
  return p;
}

// Programmatic dependent launch (sm_90+). A kernel launched by launch_dependent() may start while
// the kernel before it in the stream is still running; it must call grid_dependency_wait() before
// it reads anything that kernel writes, or writes anything it reads (at its start, unless it has
// independent work to issue first, such as weights). grid_dependency_wait() returns once the
// previous kernel has finished and its writes are visible. It releases the next kernel's blocks
// (griddepcontrol.launch_dependents) then, or with release_first before it waits, so that the
// next kernel's independent work (a linear's first weight loads) overlaps this one's; the next
// kernel in turn waits for all of this one. Released after the wait, at most two kernels of a
// chain run at a time; released first, a chain of short kernels can have several linears' first
// loads in flight at once (cuda::release_dependents_first says when that is faster). Both are
// no-ops without the launch attribute, and compiled out for older architectures. In a decode
// step of a few small kernels per layer between the linears this keeps HBM busy across kernel
// boundaries.
__device__ __forceinline__ void grid_dependency_wait(bool release_first = false) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (release_first) asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  if (!release_first) asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
// Releases the next kernel's blocks now (they still wait for all of this grid before touching its
// results).
__device__ __forceinline__ void grid_dependents_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
// The wait alone, for a kernel that releases the next one itself, later
// (grid_dependents_launch(); else at its end): the split-KV decode kernel.
__device__ __forceinline__ void grid_dependency_wait_holding() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
bool dependent_launch_supported();  // an sm_90+ device (common.cu)
// kernel<<<grid, block, smem, current_stream()>>>(args...) with programmatic stream
// serialisation where the device has it; kept in graph capture as a programmatic edge.
template <class... KArgs, class... Args>
void launch_dependent(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                      Args&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = current_stream();
  cfg.attrs = attr;
  cfg.numAttrs = dependent_launch_supported() ? 1 : 0;
  LLMK_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}

// 16 bytes (16-byte aligned) read once: not kept in L1 (weights streamed past it).
__device__ __forceinline__ uint4 load_stream(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// Two floats as a bf16 pair (x in the low half), the register layout mma fragments use.
__device__ __forceinline__ uint32_t pack_bf16x2(float x, float y) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(x, y);
  return *reinterpret_cast<const uint32_t*>(&v);
}
// Two floats as an fp16 pair (x in the low half).
__device__ __forceinline__ uint32_t pack_f16x2(float x, float y) {
  const __half2 v = __floats2half2_rn(x, y);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// True when `p` is a multiple of `bytes` (a power of two): the condition for vector accesses.
__host__ __device__ inline bool is_aligned(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// N consecutive bf16 (N = 1, 2, 4 or 8, the address aligned to 2N bytes) <-> N floats, in one
// access of 2N bytes (16 for N = 8).
template <int N>
__device__ __forceinline__ void load_bf16(const __nv_bfloat16* p, float (&f)[N]) {
  static_assert(N == 1 || N == 2 || N == 4 || N == 8, "load_bf16: N must be 1, 2, 4 or 8");
  if constexpr (N == 1) {
    f[0] = __bfloat162float(*p);
  } else {
    using Raw = std::conditional_t<N == 2, uint32_t, std::conditional_t<N == 4, uint2, uint4>>;
    const Raw raw = *reinterpret_cast<const Raw*>(p);
    const auto* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int k = 0; k < N / 2; ++k) {
      const float2 v = __bfloat1622float2(h[k]);
      f[2 * k] = v.x;
      f[2 * k + 1] = v.y;
    }
  }
}
template <int N>
__device__ __forceinline__ void store_bf16(__nv_bfloat16* p, const float (&f)[N]) {
  static_assert(N == 1 || N == 2 || N == 4 || N == 8, "store_bf16: N must be 1, 2, 4 or 8");
  if constexpr (N == 1) {
    *p = __float2bfloat16_rn(f[0]);
  } else {
    using Raw = std::conditional_t<N == 2, uint32_t, std::conditional_t<N == 4, uint2, uint4>>;
    Raw raw;
    auto* h = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
    for (int k = 0; k < N / 2; ++k) h[k] = __floats2bfloat162_rn(f[2 * k], f[2 * k + 1]);
    *reinterpret_cast<Raw*>(p) = raw;
  }
}
// Rounds each value to bf16 and back, as storing and reloading would.
template <int N>
__device__ __forceinline__ void round_to_bf16(float (&f)[N]) {
#pragma unroll
  for (int k = 0; k < N; ++k) f[k] = __bfloat162float(__float2bfloat16_rn(f[k]));
}

// L2 eviction-priority policies (sm_80+) for loads, copies and stores with a cache hint.
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(p));
  return p;
}
__device__ __forceinline__ uint64_t l2_evict_last_policy() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(p));
  return p;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block; every thread gets the result. `scratch` holds blockDim.x / 32 floats.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = (blockDim.x + kWarp - 1) / kWarp;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : 0.0f;
  return warp_sum(v);
}

// Threads for a block that gives each of `work` items one thread: a multiple of the warp size
// in [kWarp, max_threads].
inline int block_threads_for(int64_t work, int max_threads) {
  const int64_t t = ceil_div(work, kWarp) * kWarp;
  return static_cast<int>(t < kWarp ? kWarp : (t > max_threads ? max_threads : t));
}

// gridDim.y and gridDim.z are at most 65535: kernels loop when there are more rows.
constexpr int64_t kMaxGridY = 65535;

}  // namespace llmk::cuda
