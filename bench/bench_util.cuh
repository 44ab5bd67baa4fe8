// What the CUDA micro-benchmarks share: device-side random fill, host-to-device copies,
// CUDA-event timing, the median, and the device-to-device copy rate every bandwidth figure is
// compared with. One .cu per bench binary includes it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <vector>

#include "core/cuda/check.h"
#include "core/cuda/device.h"
#include "core/cuda/stream.h"

namespace llmk::bench {

// The hash every fill uses: 64 pseudo-random bits of (seed, index) (splitmix64's finaliser).
__device__ __forceinline__ uint64_t hash_index(uint64_t seed, int64_t i) {
  uint64_t z = seed + static_cast<uint64_t>(i) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Deterministic pseudo-random bf16: a hash of the index, so filling a GiB costs one kernel and
// no host memory. Uniform in [-scale, scale), or (nonzero) of magnitude in [0.1, 1) * scale with a
// random sign.
__global__ void fill_bf16(__nv_bfloat16* p, int64_t n, uint64_t seed, float scale, bool nonzero) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint64_t z = hash_index(seed, i);
    const float u = static_cast<float>(z >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    if (nonzero) {
      const float mag = (0.1f + 0.9f * u) * scale;
      p[i] = __float2bfloat16_rn((z & 1) ? mag : -mag);
    } else {
      p[i] = __float2bfloat16_rn((2.0f * u - 1.0f) * scale);
    }
  }
}

inline void fill(void* p, int64_t n, uint64_t seed, float scale, bool nonzero = false) {
  fill_bf16<<<1024, 256, 0, cuda::current_stream()>>>(static_cast<__nv_bfloat16*>(p), n, seed,
                                                      scale, nonzero);
  cuda::check_launch("fill_bf16");
}

// n random bytes (the same hash).
__global__ void fill_bytes_kernel(uint8_t* p, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    p[i] = static_cast<uint8_t>(hash_index(seed, i));
  }
}

inline void fill_bytes(void* p, int64_t n, uint64_t seed) {
  fill_bytes_kernel<<<1024, 256, 0, cuda::current_stream()>>>(static_cast<uint8_t*>(p), n, seed);
  cuda::check_launch("fill_bytes");
}

// A device copy of h (cudaMalloc'd; the caller frees it).
template <class T>
T* device_copy(const std::vector<T>& h) {
  T* p = nullptr;
  LLMK_CUDA_CHECK(cudaMalloc(&p, h.size() * sizeof(T)));
  LLMK_CUDA_CHECK(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}

inline float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

class Events {
 public:
  Events() {
    LLMK_CUDA_CHECK(cudaEventCreate(&a_));
    LLMK_CUDA_CHECK(cudaEventCreate(&b_));
  }
  ~Events() {
    cudaEventDestroy(a_);
    cudaEventDestroy(b_);
  }
  Events(const Events&) = delete;
  Events& operator=(const Events&) = delete;
  // Milliseconds taken by fn's work on the current stream.
  template <class Fn>
  float time(Fn&& fn) {
    const cudaStream_t s = cuda::current_stream();
    LLMK_CUDA_CHECK(cudaEventRecord(a_, s));
    fn();
    LLMK_CUDA_CHECK(cudaEventRecord(b_, s));
    LLMK_CUDA_CHECK(cudaEventSynchronize(b_));
    float ms = 0;
    LLMK_CUDA_CHECK(cudaEventElapsedTime(&ms, a_, b_));
    return ms;
  }

 private:
  cudaEvent_t a_ = nullptr, b_ = nullptr;
};

// `count` bf16 tensors of `per_set` random elements each (fill's), in one allocation; at(i)
// rotates over them, so that timed calls do not find their inputs in the L2.
class Pool {
 public:
  Pool(int64_t per_set, int count, uint64_t seed, float scale, bool nonzero = false)
      : per_set_(per_set), count_(count) {
    const int64_t n = per_set * count;
    LLMK_CUDA_CHECK(cudaMalloc(&p_, static_cast<size_t>(n) * 2));
    fill(p_, n, seed, scale, nonzero);
  }
  ~Pool() { cudaFree(p_); }
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;
  __nv_bfloat16* at(int i) const { return p_ + static_cast<int64_t>(i % count_) * per_set_; }

 private:
  __nv_bfloat16* p_ = nullptr;
  int64_t per_set_;
  int count_;
};

// Median microseconds per call of call(i), i rotating over `sets`: each sample times a batch of
// max(sets, 20) calls after one warm-up pass.
template <class Call>
double time_us(Events& ev, int samples, int sets, Call&& call) {
  const int batch = std::max(sets, 20);
  for (int i = 0; i < sets; ++i) call(i);
  std::vector<float> ms;
  for (int s = 0; s < samples; ++s) {
    ms.push_back(ev.time([&] {
      for (int i = 0; i < batch; ++i) call(i);
    }));
  }
  return median(ms) * 1e3 / batch;
}

// Median milliseconds of `samples` replays of a CUDA graph that captured `work()` once (after
// one uncaptured warm-up call and one warm-up replay, which uploads the graph).
template <class Work>
float graph_ms(Events& ev, int samples, Work&& work) {
  const cudaStream_t s = cuda::current_stream();
  work();  // warm-up: plans, workspaces, module loads
  LLMK_CUDA_CHECK(cudaStreamSynchronize(s));
  cudaGraph_t graph = nullptr;
  LLMK_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  work();
  LLMK_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  cudaGraphExec_t exec = nullptr;
  LLMK_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  LLMK_CUDA_CHECK(cudaGraphLaunch(exec, s));
  std::vector<float> ms;
  for (int i = 0; i < samples; ++i) {
    ms.push_back(ev.time([&] { LLMK_CUDA_CHECK(cudaGraphLaunch(exec, s)); }));
  }
  LLMK_CUDA_CHECK(cudaGraphExecDestroy(exec));
  LLMK_CUDA_CHECK(cudaGraphDestroy(graph));
  return median(ms);
}

// Device-to-device copy rate of 1 GiB (bytes read + written per second), median of `samples`
// after two warm-ups: the ceiling bandwidth-bound kernels are measured against.
inline double copy_rate_gbs(Events& ev, int samples) {
  const size_t bytes = size_t{1} << 30;
  void *src = nullptr, *dst = nullptr;
  LLMK_CUDA_CHECK(cudaMalloc(&src, bytes));
  LLMK_CUDA_CHECK(cudaMalloc(&dst, bytes));
  LLMK_CUDA_CHECK(cudaMemsetAsync(src, 1, bytes, cuda::current_stream()));
  std::vector<float> ms;
  for (int i = 0; i < samples + 2; ++i) {
    const float t = ev.time([&] {
      LLMK_CUDA_CHECK(
          cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cuda::current_stream()));
    });
    if (i >= 2) ms.push_back(t);
  }
  LLMK_CUDA_CHECK(cudaFree(src));
  LLMK_CUDA_CHECK(cudaFree(dst));
  return 2.0 * static_cast<double>(bytes) / (median(ms) * 1e-3) / 1e9;
}

// The copy rate (copy_rate_gbs), after printing the device's line with it: name, multiprocessors,
// L2 and the rate, the ceiling the tables' shares are of.
inline double print_device(Events& ev, int samples) {
  const cuda::DeviceInfo& dev = cuda::device_info();
  const double copy_gbs = copy_rate_gbs(ev, samples);
  std::printf("device: %s, %d SMs, L2 %.1f MB; D2D copy %.0f GB/s (read + write)\n",
              dev.name.c_str(), dev.sm_count, static_cast<double>(dev.l2_bytes) / 1e6, copy_gbs);
  return copy_gbs;
}

// A bench's main(): runs impl and turns an exception into one line on stderr and exit code 1.
inline int guarded_main(const char* name, int (*impl)(int, char**), int argc, char** argv) {
  try {
    return impl(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    return 1;
  }
}

}  // namespace llmk::bench
