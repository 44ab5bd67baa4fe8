// Benchmark of the linear layer (cuda::linear) at the decode (M = 1) and prefill (M = 512)
// shapes of Qwen2.5-0.5B, Llama-3-8B and Phi-3-mini, against the device's copy rate. M = 1 runs
// twice: llmk's one-row kernel (gemv.h), then cuBLASLt (cuda::set_linear_gemv(false)); M = 512
// runs the tuned cuBLASLt plan (linear.h: set_linear_tuning), as prefill does. Then the
// one-row kernel with the decoder's fused epilogues at those models' shapes: the gated gate|up
// (SiLU-mul of the two halves, F outputs: cuda::linear_gated_row) and the Q|K|V projection with
// RoPE and the KV append (cuda::linear_rope_row), whose extra writes are under 0.1% of the bytes.
//
// Each shape rotates over enough weight buffers to span 4x the L2 (read from the device), so
// every call streams its weights from HBM as in a real decode step. Per shape: one warm-up pass,
// then `samples` timings (CUDA events) of B back-to-back calls, both launched from the stream and
// replayed from a CUDA graph of the same B calls; the median gives us per call. GB/s counts the
// weight bytes only (x and out are under 0.1% of them at M = 1); TFLOP/s counts 2*M*N*K.
//
// Standalone: build it beside a CUDA build of llmk (one line), e.g.
//   nvcc -std=c++20 -O2 -gencode=arch=compute_90a,code=sm_90a -Isrc bench/linear_bench.cu
//        build/cuda/libllmk_kernels.a build/cuda/libllmk_core.a -lcublasLt -lfmt -o linear_bench
//   ./linear_bench [--samples N] [--json FILE]
// (nvcc compiles this file, and cannot parse fmt: nothing here includes core/error.h.)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_util.cuh"
#include "core/cuda/check.h"
#include "core/cuda/device.h"
#include "core/cuda/stream.h"
#include "kernels/cuda/gemm/linear.h"

namespace llmk::bench {
namespace {

struct Layer {
  const char* model;
  const char* name;
  int64_t N, K;
  // A fused epilogue (M = 1): none, the gated output, or RoPE + KV append over Hq, Hkv heads of D.
  enum class Epilogue { None, Gated, Rope } epilogue = Epilogue::None;
  int Hq = 0, Hkv = 0, D = 0;
};

struct Result {
  Layer layer;
  int64_t M;
  DType out_dtype;
  const char* kernel;  // "gemv" (llmk's one-row kernel) or "cublasLt"
  int buffers, batch;
  double us_graph, us_stream;  // per call
  double weight_gbs, tflops;   // from the graph time
};

Result run(const Layer& layer, int64_t M, DType out_dtype, int samples, Events& ev) {
  const int64_t N = layer.N, K = layer.K;
  const size_t l2 = cuda::device_info().l2_bytes;
  const size_t wbytes = static_cast<size_t>(N * K) * 2;
  const size_t wstride = (wbytes + 255) / 256 * 256;  // every buffer 256-byte aligned: one plan
  const int buffers = static_cast<int>(std::max<size_t>(1, (4 * l2 + wbytes - 1) / wbytes));
  const int batch = std::max(buffers, M == 1 ? 50 : 10);
  const size_t out_es = out_dtype == DType::F32 ? 4 : 2;

  void *w = nullptr, *x = nullptr, *out = nullptr, *cache = nullptr;
  int32_t* pos = nullptr;  // RoPE: the position and the cache row
  LLMK_CUDA_CHECK(cudaMalloc(&w, wstride * static_cast<size_t>(buffers)));
  LLMK_CUDA_CHECK(cudaMalloc(&x, static_cast<size_t>(M * K) * 2));
  LLMK_CUDA_CHECK(cudaMalloc(&out, static_cast<size_t>(M * N) * out_es));
  for (int b = 0; b < buffers; ++b) {
    fill(static_cast<char*>(w) + wstride * static_cast<size_t>(b), N * K, 1000 + b,
         1.0f / static_cast<float>(K));
  }
  fill(x, M * K, 7, 1.0f);

  cuda::LinearArgs a;
  a.out = out;
  a.out_dtype = out_dtype;
  a.ldo = N;
  a.x = x;
  a.ldx = K;
  a.ldw = K;
  a.M = M;
  a.N = N;
  a.K = K;
  cuda::GemvRope rope;
  if (layer.epilogue == Layer::Epilogue::Rope) {
    constexpr int64_t kRows = 16;  // cache rows
    const size_t cache_elems = static_cast<size_t>(kRows * layer.Hkv * layer.D);
    LLMK_CUDA_CHECK(cudaMalloc(&cache, 2 * cache_elems * 2));
    LLMK_CUDA_CHECK(cudaMalloc(&pos, 2 * sizeof(int32_t)));
    const int32_t host_pos[2] = {1000, 3};  // position 1000 in cache row 3
    LLMK_CUDA_CHECK(cudaMemcpy(pos, host_pos, sizeof host_pos, cudaMemcpyHostToDevice));
    rope.position = pos;
    rope.cache_row = pos + 1;
    rope.k_cache = cache;
    rope.v_cache = static_cast<char*>(cache) + cache_elems * 2;
    rope.kc_ld_l = rope.vc_ld_l = layer.Hkv * layer.D;
    rope.kc_ld_h = rope.vc_ld_h = layer.D;
    rope.L = kRows;
    rope.D = layer.D;
    rope.Hq = layer.Hq;
    rope.Hkv = layer.Hkv;
  }
  bool fused = true;  // every call took the fused epilogue
  const auto calls = [&] {
    for (int i = 0; i < batch; ++i) {
      a.w = static_cast<char*>(w) + wstride * static_cast<size_t>(i % buffers);
      if (layer.epilogue == Layer::Epilogue::Gated) {
        fused = cuda::linear_gated_row(a, cuda::Activation::SiLU) && fused;
      } else if (layer.epilogue == Layer::Epilogue::Rope) {
        fused = cuda::linear_rope_row(a, rope) && fused;
      } else {
        cuda::linear(a);
      }
    }
  };
  calls();  // warm-up: plan, workspace, module loads
  LLMK_CUDA_CHECK(cudaStreamSynchronize(cuda::current_stream()));

  std::vector<float> stream_ms;
  for (int i = 0; i < samples; ++i) stream_ms.push_back(ev.time(calls));
  const float graph_median_ms = graph_ms(ev, samples, calls);
  const uint64_t gemv_before = cuda::linear_stats().gemv;
  calls();
  LLMK_CUDA_CHECK(cudaStreamSynchronize(cuda::current_stream()));
  const char* kernel = cuda::linear_stats().gemv > gemv_before ? "gemv" : "cublasLt";
  if (layer.epilogue != Layer::Epilogue::None) {
    if (!fused)
      throw std::runtime_error(std::string(layer.name) + ": the fused epilogue did not run");
    kernel = layer.epilogue == Layer::Epilogue::Gated ? "gemv+silu" : "gemv+rope";
  }
  if (cache) LLMK_CUDA_CHECK(cudaFree(cache));
  if (pos) LLMK_CUDA_CHECK(cudaFree(pos));
  LLMK_CUDA_CHECK(cudaFree(w));
  LLMK_CUDA_CHECK(cudaFree(x));
  LLMK_CUDA_CHECK(cudaFree(out));
  Result r{layer, M, out_dtype, kernel, buffers, batch, 0, 0, 0, 0};
  r.us_graph = graph_median_ms * 1e3 / batch;
  r.us_stream = median(stream_ms) * 1e3 / batch;
  r.weight_gbs = static_cast<double>(wbytes) / (r.us_graph * 1e-6) / 1e9;
  r.tflops = 2.0 * static_cast<double>(M * N * K) / (r.us_graph * 1e-6) / 1e12;
  return r;
}

int main_impl(int argc, char** argv) {
  int samples = 25;
  const char* json_path = nullptr;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--samples") && i + 1 < argc) {
      samples = std::max(3, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--json") && i + 1 < argc) {
      json_path = argv[++i];
    } else {
      std::fprintf(stderr, "usage: linear_bench [--samples N] [--json FILE]\n");
      return 2;
    }
  }
  cuda::init();
  const cuda::DeviceInfo& dev = cuda::device_info();
  Events ev;
  const double copy_gbs = print_device(ev, samples);

  const Layer layers[] = {
      {"qwen2.5-0.5b", "q/o", 896, 896},        {"qwen2.5-0.5b", "k/v", 128, 896},
      {"qwen2.5-0.5b", "gate/up", 4864, 896},   {"qwen2.5-0.5b", "down", 896, 4864},
      {"qwen2.5-0.5b", "lm_head", 151936, 896}, {"llama-3-8b", "q/o", 4096, 4096},
      {"llama-3-8b", "k/v", 1024, 4096},        {"llama-3-8b", "gate/up", 14336, 4096},
      {"llama-3-8b", "down", 4096, 14336},      {"llama-3-8b", "lm_head", 128256, 4096},
      {"phi-3-mini", "qkv", 9216, 3072},        {"phi-3-mini", "o", 3072, 3072},
      {"phi-3-mini", "gate|up", 16384, 3072},   {"phi-3-mini", "down", 3072, 8192},
  };
  std::vector<Result> results;
  // M = 1: llmk's one-row kernel, then cuBLASLt on the same shape.
  for (const Layer& l : layers) {
    for (bool gemv : {true, false}) {
      cuda::set_linear_gemv(gemv);
      results.push_back(run(l, 1, DType::BF16, samples, ev));
      if (std::strcmp(l.name, "lm_head") == 0)
        results.push_back(run(l, 1, DType::F32, samples, ev));
    }
  }
  cuda::set_linear_gemv(true);
  // The fused epilogues of a decode step (M = 1).
  using E = Layer::Epilogue;
  const Layer fused[] = {
      {"qwen2.5-0.5b", "qkv+rope", 1152, 896, E::Rope, 14, 2, 64},
      {"qwen2.5-0.5b", "gate|up+", 9728, 896, E::Gated},
      {"llama-3-8b", "qkv+rope", 6144, 4096, E::Rope, 32, 8, 128},
      {"llama-3-8b", "gate|up+", 28672, 4096, E::Gated},
      {"phi-3-mini", "qkv+rope", 9216, 3072, E::Rope, 32, 32, 96},
      {"phi-3-mini", "gate|up+", 16384, 3072, E::Gated},
  };
  for (const Layer& l : fused) results.push_back(run(l, 1, DType::BF16, samples, ev));
  for (const Layer& l : layers) results.push_back(run(l, 512, DType::BF16, samples, ev));

  std::printf("\n%-13s %-8s %4s %15s %4s %-8s %9s %5s %10s %10s %9s %6s %8s\n", "model", "layer",
              "M", "N x K", "out", "kernel", "weight MB", "bufs", "us (graph)", "us (strm)", "GB/s",
              "%copy", "TFLOP/s");
  for (const Result& r : results) {
    const std::string nk = std::to_string(r.layer.N) + " x " + std::to_string(r.layer.K);
    std::printf("%-13s %-8s %4lld %15s %4s %-8s %9.2f %5d %10.2f %10.2f %9.0f %5.0f%% %8.1f\n",
                r.layer.model, r.layer.name, static_cast<long long>(r.M), nk.c_str(),
                r.out_dtype == DType::F32 ? "f32" : "bf16", r.kernel,
                static_cast<double>(r.layer.N * r.layer.K * 2) / 1e6, r.buffers, r.us_graph,
                r.us_stream, r.weight_gbs, 100.0 * r.weight_gbs / copy_gbs, r.tflops);
  }
  const cuda::LinearStats st = cuda::linear_stats();
  std::printf("\ncuBLASLt plans %llu (%llu tuned) for %llu calls\n",
              static_cast<unsigned long long>(st.plans), static_cast<unsigned long long>(st.tuned),
              static_cast<unsigned long long>(st.calls));

  if (json_path) {
    FILE* f = std::fopen(json_path, "w");
    if (!f) {
      std::fprintf(stderr, "cannot write %s\n", json_path);
      return 1;
    }
    std::fprintf(f, "{\"device\": \"%s\", \"l2_bytes\": %zu, \"copy_gbs\": %.1f, \"results\": [\n",
                 dev.name.c_str(), dev.l2_bytes, copy_gbs);
    for (size_t i = 0; i < results.size(); ++i) {
      const Result& r = results[i];
      std::fprintf(f,
                   "  {\"model\": \"%s\", \"layer\": \"%s\", \"M\": %lld, \"N\": %lld, \"K\": "
                   "%lld, \"out\": \"%s\", \"kernel\": \"%s\", \"buffers\": %d, \"batch\": %d, "
                   "\"us_graph\": %.3f, "
                   "\"us_stream\": %.3f, \"weight_gbs\": %.1f, \"tflops\": %.2f}%s\n",
                   r.layer.model, r.layer.name, static_cast<long long>(r.M),
                   static_cast<long long>(r.layer.N), static_cast<long long>(r.layer.K),
                   r.out_dtype == DType::F32 ? "f32" : "bf16", r.kernel, r.buffers, r.batch,
                   r.us_graph, r.us_stream, r.weight_gbs, r.tflops,
                   i + 1 < results.size() ? "," : "");
    }
    std::fprintf(f, "]}\n");
    std::fclose(f);
  }
  return 0;
}

}  // namespace
}  // namespace llmk::bench

int main(int argc, char** argv) {
  return llmk::bench::guarded_main("linear_bench", llmk::bench::main_impl, argc, argv);
}
