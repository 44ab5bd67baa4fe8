// Benchmark of the prefill attention kernel (cuda::attention_prefill, varlen form: B equal
// sequences through cu_q / cu_k) at twelve shapes (head dims 64 to 256; 512 to 16k tokens
// per sequence; causal and not; one GQA shape). One JSON line per shape:
//   {"kind":"prefill","B":..,"Hq":..,"Hkv":..,"S":..,"D":..,"causal":..,"dtype":"bf16",
//    "ms":..,"tflops":..}
// TFLOP/s counts 4 * B * Hq * S^2 * D (QK^T and PV), halved when causal (FA2's convention).
// Timing: random inputs; 3 warm-up launches; then `samples` timings of one launch between CUDA
// events, each after a 256 MiB write that flushes the L2 (outside the events); the median.
// bench/attention.py runs this beside torch SDPA.
//
//   attention_prefill_bench [--samples N] [--only B,Hq,S,D,causal] [--kernel auto|mma-sync]
// --kernel mma-sync times the portable mma.sync kernel where the wgmma one would run (the JSON
// lines then carry "kernel":"mma-sync").
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <vector>

#include "bench_util.cuh"
#include "core/cuda/check.h"
#include "core/cuda/device.h"
#include "core/cuda/stream.h"
#include "kernels/cuda/attention/attention.h"

namespace llmk::bench {
namespace {

struct Shape {
  int B, Hq, Hkv, S, D;
  bool causal;
};

template <class T>
T* device_alloc(size_t n) {
  void* p = nullptr;
  LLMK_CUDA_CHECK(cudaMalloc(&p, n * sizeof(T)));
  return static_cast<T*>(p);
}

void run(const Shape& s, int samples, void* flush, size_t flush_bytes, const char* kernel) {
  const cudaStream_t stream = cuda::current_stream();
  const int64_t T = static_cast<int64_t>(s.B) * s.S;
  const int64_t nq = T * s.Hq * s.D, nkv = T * s.Hkv * s.D;
  auto* q = device_alloc<__nv_bfloat16>(static_cast<size_t>(nq));
  auto* k = device_alloc<__nv_bfloat16>(static_cast<size_t>(nkv));
  auto* v = device_alloc<__nv_bfloat16>(static_cast<size_t>(nkv));
  auto* out = device_alloc<__nv_bfloat16>(static_cast<size_t>(nq));
  auto* cu = device_alloc<int32_t>(static_cast<size_t>(s.B) + 1);
  fill_bf16<<<1024, 256, 0, stream>>>(q, nq, 1, 2.0f, false);
  fill_bf16<<<1024, 256, 0, stream>>>(k, nkv, 2, 2.0f, false);
  fill_bf16<<<1024, 256, 0, stream>>>(v, nkv, 3, 1.0f, false);
  LLMK_CUDA_CHECK(cudaGetLastError());
  std::vector<int32_t> cu_h(static_cast<size_t>(s.B) + 1);
  for (int b = 0; b <= s.B; ++b) cu_h[static_cast<size_t>(b)] = b * s.S;
  LLMK_CUDA_CHECK(
      cudaMemcpy(cu, cu_h.data(), cu_h.size() * sizeof(int32_t), cudaMemcpyHostToDevice));

  cuda::AttentionArgs a;
  a.out = out;
  a.out_t = static_cast<int64_t>(s.Hq) * s.D;
  a.out_h = s.D;
  a.q = q;
  a.q_t = static_cast<int64_t>(s.Hq) * s.D;
  a.q_h = s.D;
  a.k = k;
  a.k_t = static_cast<int64_t>(s.Hkv) * s.D;
  a.k_h = s.D;
  a.v = v;
  a.v_t = a.k_t;
  a.v_h = s.D;
  a.T = static_cast<int>(T);
  a.Hq = s.Hq;
  a.Hkv = s.Hkv;
  a.D = s.D;
  a.L = T;
  a.scale = 1.0f / std::sqrt(static_cast<float>(s.D));
  a.B = s.B;
  a.cu_q = cu;
  a.cu_k = cu;
  a.causal = s.causal;

  cudaEvent_t e0, e1;
  LLMK_CUDA_CHECK(cudaEventCreate(&e0));
  LLMK_CUDA_CHECK(cudaEventCreate(&e1));
  for (int i = 0; i < 3; ++i) cuda::attention_prefill(a);
  std::vector<float> ms;
  for (int i = 0; i < samples; ++i) {
    LLMK_CUDA_CHECK(cudaMemsetAsync(flush, i & 0xff, flush_bytes, stream));
    LLMK_CUDA_CHECK(cudaEventRecord(e0, stream));
    cuda::attention_prefill(a);
    LLMK_CUDA_CHECK(cudaEventRecord(e1, stream));
    LLMK_CUDA_CHECK(cudaEventSynchronize(e1));
    float t = 0;
    LLMK_CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
    ms.push_back(t);
  }
  const float med = median(ms);
  const double flops =
      4.0 * s.B * s.Hq * static_cast<double>(s.S) * s.S * s.D * (s.causal ? 0.5 : 1.0);
  std::printf(
      "{\"kind\":\"prefill\",\"B\":%d,\"Hq\":%d,\"Hkv\":%d,\"S\":%d,\"D\":%d,\"causal\":%s,"
      "\"dtype\":\"bf16\",\"kernel\":\"%s\",\"ms\":%.4f,\"tflops\":%.1f}\n",
      s.B, s.Hq, s.Hkv, s.S, s.D, s.causal ? "true" : "false", kernel, med,
      flops / (med * 1e-3) / 1e12);
  std::fflush(stdout);
  LLMK_CUDA_CHECK(cudaEventDestroy(e0));
  LLMK_CUDA_CHECK(cudaEventDestroy(e1));
  for (void* p : {static_cast<void*>(q), static_cast<void*>(k), static_cast<void*>(v),
                  static_cast<void*>(out), static_cast<void*>(cu)}) {
    LLMK_CUDA_CHECK(cudaFree(p));
  }
}

int main_impl(int argc, char** argv) {
  int samples = 30;
  const char* only = nullptr;
  const char* kernel = "auto";
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--samples") && i + 1 < argc) {
      samples = std::max(3, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--only") && i + 1 < argc) {
      only = argv[++i];
    } else if (!std::strcmp(argv[i], "--kernel") && i + 1 < argc &&
               (!std::strcmp(argv[i + 1], "auto") || !std::strcmp(argv[i + 1], "wgmma") ||
                !std::strcmp(argv[i + 1], "mma-sync"))) {
      kernel = argv[++i];
    } else {
      std::fprintf(stderr,
                   "usage: attention_prefill_bench [--samples N] [--only B,Hq,S,D,causal] "
                   "[--kernel auto|wgmma|mma-sync]\n");
      return 2;
    }
  }
  cuda::init();
  if (!std::strcmp(kernel, "mma-sync")) cuda::set_prefill_kernel(cuda::PrefillKernel::kMmaSync);
  if (!std::strcmp(kernel, "wgmma")) cuda::set_prefill_kernel(cuda::PrefillKernel::kWgmma);
  std::vector<Shape> shapes = {
      {16, 32, 32, 512, 64, false},
      {16, 32, 32, 512, 64, true},
      {4, 32, 32, 2048, 128, false},
      {4, 32, 32, 2048, 128, true},
      {2, 32, 32, 8192, 128, true},
      {1, 32, 32, 16384, 128, true},
      {2, 8, 8, 8192, 256, true},
      {1, 32, 8, 4096, 128, true},
      // Phi-3-mini's heads (32, no GQA, head dim 96) at 4k and 8k tokens.
      {2, 32, 32, 4096, 96, true},
      {1, 32, 32, 8192, 96, true},
      // Head dims 80 and 112 (head dim 96's tilings) at 4k tokens.
      {1, 32, 32, 4096, 80, true},
      {1, 32, 32, 4096, 112, true},
  };
  if (only != nullptr) {
    Shape s{};
    int c = 0;
    if (std::sscanf(only, "%d,%d,%d,%d,%d", &s.B, &s.Hq, &s.S, &s.D, &c) != 5) {
      std::fprintf(stderr, "--only wants B,Hq,S,D,causal\n");
      return 2;
    }
    s.Hkv = s.Hq;
    s.causal = c != 0;
    shapes = {s};
  }
  const size_t flush_bytes = size_t{256} << 20;
  void* flush = nullptr;
  LLMK_CUDA_CHECK(cudaMalloc(&flush, flush_bytes));
  for (const Shape& s : shapes) run(s, samples, flush, flush_bytes, kernel);
  LLMK_CUDA_CHECK(cudaFree(flush));
  return 0;
}

}  // namespace
}  // namespace llmk::bench

int main(int argc, char** argv) {
  return llmk::bench::guarded_main("attention_prefill_bench", llmk::bench::main_impl, argc, argv);
}
