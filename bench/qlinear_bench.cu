// Benchmark of the linear layer over block-quantised weights (cuda::qlinear, kernels/cuda/gemm/
// qlinear.h) at Llama-3-8B's and Qwen2.5-0.5B's decode shapes, beside the bf16 linear
// (cuda::linear: llmk's one-row kernel at M = 1, or cuBLASLt with --cublas; cuBLASLt above) on the
// same shape in the same run; above 16 rows (qgemm on sm_90) also the bands qgemm replaces there,
// and each path's TFLOP/s. Last, the dequantisation of a band (the bands' first step).
//
// Weights: random bytes in the GPU layout (kernels/quant_layout.h) with every block's f16 scale
// fields set to finite values (never zeros), rotated over enough buffers to span 4x the L2 so
// every call streams its weights from HBM, as a decode step does. Per shape: a warm-up pass, then
// `samples` timings (CUDA events) of a batch of calls replayed from a CUDA graph; the median gives
// us per call. GB/s counts the weight bytes read (the quantised bytes; bf16's 2 per weight).
//
//   build/cuda/bench/qlinear_bench [--samples N] [--types q4_k,q6_k,q8_0,q4_0] [--rows 1,8]
//                                  [--only MODEL/LAYER] [--cublas]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_util.cuh"
#include "core/cuda/check.h"
#include "core/cuda/device.h"
#include "core/cuda/stream.h"
#include "kernels/cuda/gemm/gemm_act.h"
#include "kernels/cuda/gemm/linear.h"
#include "kernels/cuda/gemm/qlinear.h"
#include "kernels/quant_layout.h"

namespace llmk::bench {
namespace {

// Every block's f16 fields (meta offsets f0, f1; -1: none) set to +-(0.5..1.5) * size.
__global__ void set_halves(uint8_t* meta, int64_t blocks, int meta_bytes, int f0, int f1,
                           float size) {
  for (int64_t b = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; b < blocks;
       b += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int fields[2] = {f0, f1};
    for (int f : fields) {
      if (f < 0) continue;
      const float u = static_cast<float>((b * 2654435761u + f) % 1000) / 1000.0f;
      const __half h = __float2half_rn((b % 2 ? 1.0f : -1.0f) * (0.5f + u) * size);
      std::memcpy(meta + b * meta_bytes + f, &h, 2);
    }
  }
}

struct TypeCase {
  const char* name;
  DType t;
  int f0, f1;  // f16 fields in the meta
  float size;
};
const TypeCase kTypes[] = {
    {"q4_0", DType::Q4_0, 0, -1, 0.004f}, {"q4_1", DType::Q4_1, 0, 2, 0.004f},
    {"q5_0", DType::Q5_0, 0, -1, 0.002f}, {"q8_0", DType::Q8_0, 0, -1, 0.0002f},
    {"q4_k", DType::Q4_K, 0, 2, 0.0001f}, {"q6_k", DType::Q6_K, 16, -1, 0.00001f},
    {"q5_1", DType::Q5_1, 0, 2, 0.002f},  {"q5_k", DType::Q5_K, 0, 2, 0.00005f},
};

struct Layer {
  const char* model;
  const char* name;
  int64_t N, K;
};

// us per call of fn(i) (i over the buffers) replayed from a graph of `batch` calls.
template <class Fn>
double graph_us(Events& ev, int samples, int batch, Fn&& fn) {
  return graph_ms(ev, samples,
                  [&] {
                    for (int i = 0; i < batch; ++i) fn(i);
                  }) *
         1e3 / batch;
}

int main_impl(int argc, char** argv) {
  int samples = 25;
  std::string types = "q4_k,q6_k,q8_0,q4_0", rows = "1,8", only;
  bool cublas = false;  // the bf16 peer at M = 1: cuBLASLt instead of llmk's one-row kernel
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--samples") && i + 1 < argc) {
      samples = std::max(3, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--types") && i + 1 < argc) {
      types = argv[++i];
    } else if (!std::strcmp(argv[i], "--rows") && i + 1 < argc) {
      rows = argv[++i];
    } else if (!std::strcmp(argv[i], "--cublas")) {
      cublas = true;
    } else if (!std::strcmp(argv[i], "--only") && i + 1 < argc) {
      only = argv[++i];  // "model/layer", e.g. llama-3-8b/gate/up
    } else {
      std::fprintf(
          stderr,
          "usage: qlinear_bench [--samples N] [--types q4_k,q6_k,q8_0,q4_0,q4_1,q5_0,q5_1,q5_k] "
          "[--rows 1,8,16] [--only MODEL/LAYER] [--cublas]\n");
      return 2;
    }
  }
  std::vector<int64_t> ms;
  for (size_t p = 0; p < rows.size();) {
    const size_t e = rows.find(',', p);
    ms.push_back(std::atoll(rows.substr(p, e - p).c_str()));
    if (ms.back() < 1 || ms.back() > 65536) {
      std::fprintf(stderr, "qlinear_bench: --rows: '%s' is not a row count from 1 to 65536\n",
                   rows.substr(p, e - p).c_str());
      return 2;
    }
    p = e == std::string::npos ? rows.size() : e + 1;
  }
  const Layer layers[] = {
      {"llama-3-8b", "q/o", 4096, 4096},        {"llama-3-8b", "k/v", 1024, 4096},
      {"llama-3-8b", "gate/up", 14336, 4096},   {"llama-3-8b", "down", 4096, 14336},
      {"llama-3-8b", "lm_head", 128256, 4096},  {"qwen2.5-0.5b", "q/o", 896, 896},
      {"qwen2.5-0.5b", "gate/up", 4864, 896},   {"qwen2.5-0.5b", "down", 896, 4864},
      {"qwen2.5-0.5b", "lm_head", 151936, 896},
  };
  if (!only.empty() && std::none_of(std::begin(layers), std::end(layers), [&](const Layer& l) {
        return only == std::string(l.model) + "/" + l.name;
      })) {
    std::fprintf(stderr, "qlinear_bench: --only '%s' names no layer; one of:", only.c_str());
    for (const Layer& l : layers) std::fprintf(stderr, " %s/%s", l.model, l.name);
    std::fprintf(stderr, "\n");
    return 2;
  }
  for (size_t p = 0; p < types.size();) {
    const size_t e = types.find(',', p);
    const std::string name = types.substr(p, e - p);
    if (std::none_of(std::begin(kTypes), std::end(kTypes),
                     [&](const TypeCase& tc) { return name == tc.name; })) {
      std::fprintf(stderr,
                   "qlinear_bench: --types: unknown type '%s' (q4_k, q6_k, q8_0, q4_0, "
                   "q4_1, q5_0, q5_1, q5_k)\n",
                   name.c_str());
      return 2;
    }
    p = e == std::string::npos ? types.size() : e + 1;
  }
  cuda::init();
  const cuda::DeviceInfo& dev = cuda::device_info();
  Events ev;
  const double copy_gbs = print_device(ev, samples);
  const size_t l2 = dev.l2_bytes;
  std::printf("\n%-13s %-8s %3s %15s %-5s %9s %10s %8s %6s %10s %8s %7s  %9s  %7s %7s %7s\n",
              "model", "layer", "M", "N x K", "type", "weight MB", "us", "GB/s", "%copy", "bf16 us",
              "bf16 GB/s", "x bf16", "bands us", "TFLOP/s", "bf16", "bands");
  for (const Layer& l : layers) {
    if (!only.empty() && only != std::string(l.model) + "/" + l.name) continue;
    for (int64_t M : ms) {
      // bf16 first: llmk's one-row kernel at M = 1 (with --cublas: cuBLASLt), cuBLASLt above.
      cuda::set_linear_gemv(!cublas);
      const size_t bbytes = static_cast<size_t>(l.N * l.K) * 2;
      const int bbufs = static_cast<int>(std::max<size_t>(1, (4 * l2 + bbytes - 1) / bbytes));
      void *wb = nullptr, *x = nullptr, *out = nullptr;
      LLMK_CUDA_CHECK(cudaMalloc(&wb, bbytes * bbufs));
      LLMK_CUDA_CHECK(cudaMalloc(&x, static_cast<size_t>(M * l.K) * 2));
      LLMK_CUDA_CHECK(cudaMalloc(&out, static_cast<size_t>(M * l.N) * 2));
      fill(wb, l.N * l.K * bbufs, 11, 1.0f / static_cast<float>(l.K), true);
      fill(x, M * l.K, 7, 1.0f, true);
      cuda::LinearArgs a;
      a.out = out;
      a.ldo = l.N;
      a.x = x;
      a.ldx = l.K;
      a.ldw = l.K;
      a.M = M;
      a.N = l.N;
      a.K = l.K;
      const int batch = std::max(bbufs, 40);
      const double bf16_us = graph_us(ev, samples, batch, [&](int i) {
        a.w = static_cast<char*>(wb) + bbytes * static_cast<size_t>(i % bbufs);
        cuda::linear(a);
      });
      LLMK_CUDA_CHECK(cudaFree(wb));
      cuda::set_linear_gemv(true);
      for (const TypeCase& tc : kTypes) {
        if (types.find(tc.name) == std::string::npos) continue;
        const qlayout::Layout lay = qlayout::layout(tc.t);
        if (l.K % lay.block_elems != 0) continue;  // no such matrix (rows of whole blocks)
        const int64_t blocks = l.N * (l.K / lay.block_elems);
        const size_t qbytes = static_cast<size_t>(blocks * lay.block_bytes);
        const size_t stride = (qbytes + 255) / 256 * 256;
        const int bufs = static_cast<int>(std::max<size_t>(1, (4 * l2 + qbytes - 1) / qbytes));
        uint8_t* wq = nullptr;
        LLMK_CUDA_CHECK(cudaMalloc(&wq, stride * bufs));
        fill_bytes(wq, static_cast<int64_t>(stride * bufs), 5);
        for (int b = 0; b < bufs; ++b) {
          set_halves<<<1024, 256, 0, cuda::current_stream()>>>(
              wq + stride * b + blocks * lay.q_bytes, blocks, lay.meta_bytes(), tc.f0, tc.f1,
              tc.size);
        }
        cuda::check_launch("qlinear_bench fill");
        cuda::QLinearArgs q;
        q.out = out;
        q.ldo = l.N;
        q.x = x;
        q.ldx = l.K;
        q.wtype = tc.t;
        q.M = M;
        q.N = l.N;
        q.K = l.K;
        const int qbatch = std::max(bufs, 40);
        // Tuning off: qgemm wherever it applies (tuned, qlinear runs the faster of the two).
        cuda::set_linear_tuning(false);
        const double us = graph_us(ev, samples, qbatch, [&](int i) {
          q.w = wq + stride * static_cast<size_t>(i % bufs);
          cuda::qlinear(q);
        });
        cuda::set_linear_tuning(true);
        // Above 16 rows on sm_90 qlinear runs qgemm; beside it, the bands it replaces there.
        double bands_us = 0.0;
        if (M > cuda::kQGemvMaxRows) {
          cuda::set_gemm_act(false);
          bands_us = graph_us(ev, samples, qbatch, [&](int i) {
            q.w = wq + stride * static_cast<size_t>(i % bufs);
            cuda::qlinear(q);
          });
          cuda::set_gemm_act(true);
        }
        LLMK_CUDA_CHECK(cudaFree(wq));
        const double gbs = static_cast<double>(qbytes) / (us * 1e-6) / 1e9;
        const std::string nk = std::to_string(l.N) + " x " + std::to_string(l.K);
        std::printf("%-13s %-8s %3lld %15s %-5s %9.2f %10.2f %8.0f %5.0f%% %10.2f %8.0f %7.2f",
                    l.model, l.name, static_cast<long long>(M), nk.c_str(), tc.name,
                    static_cast<double>(qbytes) / 1e6, us, gbs, 100.0 * gbs / copy_gbs, bf16_us,
                    static_cast<double>(bbytes) / (bf16_us * 1e-6) / 1e9, bf16_us / us);
        if (bands_us > 0.0) {
          // TFLOP/s of the product at M rows: 2 M N K flops.
          const double flop = 2.0 * static_cast<double>(M) * static_cast<double>(l.N * l.K);
          std::printf("  %9.2f  %7.1f %7.1f %7.1f", bands_us, flop / (us * 1e-6) / 1e12,
                      flop / (bf16_us * 1e-6) / 1e12, flop / (bands_us * 1e-6) / 1e12);
        }
        std::printf("\n");
      }
      LLMK_CUDA_CHECK(cudaFree(x));
      LLMK_CUDA_CHECK(cudaFree(out));
    }
  }
  // The dequantisation of a band (qlinear above 16 rows): 8,192 rows of 4,096 (64 MiB of bf16
  // written, the quantised bytes read), weights rotated as above.
  std::printf("\n%-22s %-5s %10s %10s %8s\n", "dequantised band", "type", "us", "GB/s", "%copy");
  for (const TypeCase& tc : kTypes) {
    if (types.find(tc.name) == std::string::npos) continue;
    const int64_t N = 8192, K = 4096;
    const qlayout::Layout lay = qlayout::layout(tc.t);
    const int64_t blocks = N * (K / lay.block_elems);
    const size_t qbytes = static_cast<size_t>(blocks * lay.block_bytes);
    const size_t stride = (qbytes + 255) / 256 * 256;
    const int bufs = static_cast<int>(std::max<size_t>(1, (4 * l2 + qbytes - 1) / qbytes));
    uint8_t* wq = nullptr;
    void* band = nullptr;
    LLMK_CUDA_CHECK(cudaMalloc(&wq, stride * bufs));
    LLMK_CUDA_CHECK(cudaMalloc(&band, static_cast<size_t>(N * K) * 2));
    fill_bytes(wq, static_cast<int64_t>(stride * bufs), 9);
    for (int b = 0; b < bufs; ++b) {
      set_halves<<<1024, 256, 0, cuda::current_stream()>>>(
          wq + stride * b + blocks * lay.q_bytes, blocks, lay.meta_bytes(), tc.f0, tc.f1, tc.size);
    }
    cuda::check_launch("qlinear_bench fill");
    const double us = graph_us(ev, samples, std::max(bufs, 20), [&](int i) {
      cuda::qdequant(band, DType::BF16, K, wq + stride * static_cast<size_t>(i % bufs), tc.t, N, K,
                     0, N);
    });
    const double gbs = static_cast<double>(qbytes + N * K * 2) / (us * 1e-6) / 1e9;
    std::printf("%-22s %-5s %10.2f %10.0f %7.0f%%\n", "8192 x 4096", tc.name, us, gbs,
                100.0 * gbs / copy_gbs);
    LLMK_CUDA_CHECK(cudaFree(wq));
    LLMK_CUDA_CHECK(cudaFree(band));
  }
  return 0;
}

}  // namespace
}  // namespace llmk::bench

int main(int argc, char** argv) {
  return llmk::bench::guarded_main("qlinear_bench", llmk::bench::main_impl, argc, argv);
}
