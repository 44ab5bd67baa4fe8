// act_fast (kernels/cuda/activation.cuh), the activations of gemm_act's epilogue, against a
// double-precision reference over x in [-40, 40] and a few special values: relative error under
// 2^-16, or absolute error under 2^-118 (near the bottom of the float range, where the fast forms
// flush subnormal intermediates to zero), and finite everywhere.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "core/cuda/check.h"
#include "core/cuda/device.h"
#include "kernels/cuda/activation.cuh"

namespace llmk {
namespace {

using cpu::grad::Act;

template <Act kAct>
__global__ void act_fast_kernel(float* y, const float* x, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) y[i] = cuda::act_fast<kAct>(x[i]);
}

double reference(double x, Act act) {
  switch (act) {
    case Act::SiLU:
      return x / (1.0 + std::exp(-x));
    case Act::GeluTanh:  // 0.5 x (1 + tanh u) as x / (1 + e^(-2u)): no cancellation for x < 0
      return x / (1.0 + std::exp(-2.0 * 0.7978845608028654 * (x + 0.044715 * x * x * x)));
    case Act::GeluErf:
      return 0.5 * x * std::erfc(-x / std::sqrt(2.0));
    case Act::None:
      return x;
  }
  return x;
}

template <Act kAct>
void check(const char* name) {
  std::vector<float> x;
  for (int i = -400000; i <= 400000; ++i) x.push_back(static_cast<float>(i) * 1e-4f);
  for (float v : {0.0f, -0.0f, 1e-20f, -1e-20f, 80.0f, -80.0f, 1e4f, -1e4f, 3e38f, -3e38f}) {
    x.push_back(v);
  }
  const int n = static_cast<int>(x.size());
  float *dx = nullptr, *dy = nullptr;
  LLMK_CUDA_CHECK(cudaMalloc(&dx, n * sizeof(float)));
  LLMK_CUDA_CHECK(cudaMalloc(&dy, n * sizeof(float)));
  LLMK_CUDA_CHECK(cudaMemcpy(dx, x.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  act_fast_kernel<kAct><<<(n + 255) / 256, 256>>>(dy, dx, n);
  LLMK_CUDA_CHECK(cudaGetLastError());
  std::vector<float> y(n);
  LLMK_CUDA_CHECK(cudaMemcpy(y.data(), dy, n * sizeof(float), cudaMemcpyDeviceToHost));
  cudaFree(dx);
  cudaFree(dy);
  double worst = 0;
  float worst_x = 0;
  int bad = 0;
  for (int i = 0; i < n; ++i) {
    const double want = reference(x[i], kAct), got = y[i];
    const double err = std::abs(got - want);
    const bool ok = std::isfinite(got) && (err <= 0x1.0p-16 * std::abs(want) || err <= 0x1.0p-118);
    if (std::abs(want) >= 0x1.0p-118 && err / std::abs(want) > worst) {
      worst = err / std::abs(want);
      worst_x = x[i];
    }
    if (!ok && bad++ < 5) {
      ADD_FAILURE() << name << "(" << x[i] << ") = " << got << ", want " << want;
    }
  }
  EXPECT_EQ(bad, 0) << name;
  std::printf("  %-9s worst relative error %.2e (2^%.1f) at x = %g\n", name, worst,
              worst > 0 ? std::log2(worst) : -INFINITY, worst_x);
}

TEST(ActFast, WithinTwoToTheMinus16OfDouble) {
  cuda::init();
  check<Act::SiLU>("silu");
  check<Act::GeluTanh>("gelu_tanh");
  check<Act::GeluErf>("gelu");
}

}  // namespace
}  // namespace llmk
