// Benchmark of llmk's own GEMM with the activation in its epilogue (cuda::gemm_act) against
// cuBLASLt's GEMM alone (cuda::linear, its tuned plan) and cuBLASLt with its GELU epilogue
// (cuda::linear_gelu), at the linear_act shapes of issue 15 (128 and 8192 rows x 4096 x 16384 /
// 14336) and a few more. bf16 in and out, no bias.
//
// Each function's inputs rotate over enough x and w buffers to span twice the L2, so every call
// reads its operands from HBM. Samples are interleaved function by function (so all see the same
// clocks under the power cap): each sample times a batch of back-to-back calls with CUDA events;
// the median gives us per call.
//
//   build/cuda/bench/gemm_act_bench [--samples N] [--shape MxNxK]...
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_util.cuh"
#include "core/cuda/check.h"
#include "core/cuda/device.h"
#include "core/cuda/stream.h"
#include "kernels/cuda/gemm/gemm_act.h"
#include "kernels/cuda/gemm/linear.h"

namespace llmk::bench {
namespace {

using cpu::grad::Act;

struct Shape3 {
  int64_t M, N, K;
};

int run(int argc, char** argv) {
  int samples = 15;
  std::vector<Shape3> shapes;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--samples") && i + 1 < argc) {
      samples = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--shape") && i + 1 < argc) {
      Shape3 s{};
      if (std::sscanf(argv[++i], "%ldx%ldx%ld", &s.M, &s.N, &s.K) != 3) {
        std::fprintf(stderr, "gemm_act_bench: --shape takes MxNxK, not %s\n", argv[i]);
        return 2;
      }
      shapes.push_back(s);
    } else {
      std::fprintf(stderr, "usage: gemm_act_bench [--samples N] [--shape MxNxK]...\n");
      return 2;
    }
  }
  if (shapes.empty()) {
    shapes = {{128, 16384, 4096}, {8192, 14336, 4096}, {8192, 4096, 14336}, {8192, 16384, 4096}};
  }
  cuda::init();
  const cuda::DeviceInfo& dev = cuda::device_info();
  std::printf("device: %s, %d SMs\n", dev.name.c_str(), dev.sm_count);
  Events ev;
  std::printf(
      "| M | N | K | cuBLASLt us | TFLOP/s | llmk none | x | llmk silu | x | llmk gelu | x "
      "| llmk gelu_tanh | x | cuBLASLt gelu_tanh | x |\n|---|---|---|---|---|---|---|---|"
      "---|---|---|---|---|---|---|\n");
  for (const Shape3& s : shapes) {
    const int64_t bytes = (s.M * s.K + s.N * s.K) * 2;
    const int sets = static_cast<int>(std::max<int64_t>(2, 2 * dev.l2_bytes / bytes + 1));
    Pool xs(s.M * s.K, sets, 1, 1.0f), ws(s.N * s.K, sets, 2, 0.03f);
    __nv_bfloat16* y = nullptr;
    LLMK_CUDA_CHECK(cudaMalloc(&y, static_cast<size_t>(s.M * s.N) * 2));
    auto lin = [&](int i, bool gelu) {
      cuda::LinearArgs a{.out = y,
                         .ldo = s.N,
                         .x = xs.at(i),
                         .ldx = s.K,
                         .w = ws.at(i),
                         .ldw = s.K,
                         .M = s.M,
                         .N = s.N,
                         .K = s.K};
      if (gelu) {
        a.gelu = true;
        if (!cuda::linear_gelu(a)) throw std::runtime_error("no cuBLASLt GELU epilogue");
      } else {
        cuda::linear(a);
      }
    };
    auto own = [&](int i, Act act) {
      const cuda::GemmActArgs a{
          .y = y, .x = xs.at(i), .w = ws.at(i), .M = s.M, .N = s.N, .K = s.K, .act = act};
      if (!cuda::gemm_act(a)) throw std::runtime_error("gemm_act declined the shape");
    };
    std::vector<std::function<void(int)>> fns = {
        [&](int i) { lin(i, false); },         [&](int i) { own(i, Act::None); },
        [&](int i) { own(i, Act::SiLU); },     [&](int i) { own(i, Act::GeluErf); },
        [&](int i) { own(i, Act::GeluTanh); }, [&](int i) { lin(i, true); }};
    const int batch = std::max(sets, 10);
    for (auto& f : fns) {
      for (int i = 0; i < sets; ++i) f(i);
    }
    std::vector<std::vector<float>> ms(fns.size());
    for (int r = 0; r < samples; ++r) {
      for (size_t f = 0; f < fns.size(); ++f) {
        ms[f].push_back(ev.time([&] {
          for (int i = 0; i < batch; ++i) fns[f](i);
        }));
      }
    }
    std::vector<double> us;
    for (auto& v : ms) us.push_back(median(v) * 1e3 / batch);
    const double tflops = 2.0 * s.M * s.N * s.K / (us[0] * 1e-6) / 1e12;
    std::printf("| %ld | %ld | %ld | %.1f | %.0f |", s.M, s.N, s.K, us[0], tflops);
    for (size_t f = 1; f < us.size(); ++f) std::printf(" %.1f | %.3f |", us[f], us[f] / us[0]);
    std::printf("\n");
    LLMK_CUDA_CHECK(cudaFree(y));
  }
  return 0;
}

}  // namespace
}  // namespace llmk::bench

int main(int argc, char** argv) {
  return llmk::bench::guarded_main("gemm_act_bench", llmk::bench::run, argc, argv);
}
