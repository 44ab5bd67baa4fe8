// kernels/kv_quant.h's E4M3 encoder and decoder, which the CPU and the GPU share, against the
// GPU's own conversion instructions (cvt.rn.satfinite.e4m3x2.f32 and its inverse, through
// cuda_fp8.h): the same code for every float tried, and the same value for every code.
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/cuda/check.h"
#include "core/cuda/device.h"
#include "kernels/kv_quant.h"

namespace llmk {
namespace {

__global__ void encode_kernel(uint8_t* hw, uint8_t* ours, const float* x, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= n) return;
  hw[i] = static_cast<uint8_t>(__nv_cvt_float_to_fp8(x[i], __NV_SATFINITE, __NV_E4M3));
  ours[i] = kvq::e4m3_from_float(x[i]);
}

__global__ void decode_kernel(float* hw, float* ours) {
  const int i = static_cast<int>(threadIdx.x);
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(i), __NV_E4M3);
  __half v;
  std::memcpy(&v, &h, sizeof(v));
  hw[i] = __half2float(v);
  ours[i] = kvq::e4m3_to_float(static_cast<uint8_t>(i));
}

TEST(KvQuantGpu, E4M3MatchesTheHardwareConversion) {
  cuda::init();
  std::vector<float> x;
  for (int b = 0; b < 256; ++b) {  // every code, and the midpoints between neighbours
    const float v = kvq::e4m3_to_float(static_cast<uint8_t>(b));
    if (std::isnan(v)) continue;
    x.push_back(v);
    const float next = kvq::e4m3_to_float(static_cast<uint8_t>(b + 1));
    if (b != 127 && b != 255 && !std::isnan(next)) x.push_back(0.5f * (v + next));
  }
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> mag(-14.0f, 10.0f);
  for (int i = 0; i < 200000; ++i) x.push_back(std::exp2(mag(rng)) * (i % 2 ? -1.0f : 1.0f));
  x.insert(x.end(), {0.0f, -0.0f, 449.0f, 464.0f, 1e30f, -1e30f, INFINITY, -INFINITY});
  const int n = static_cast<int>(x.size());
  float* dx = nullptr;
  uint8_t *dhw = nullptr, *dours = nullptr;
  LLMK_CUDA_CHECK(cudaMalloc(&dx, n * sizeof(float)));
  LLMK_CUDA_CHECK(cudaMalloc(&dhw, n));
  LLMK_CUDA_CHECK(cudaMalloc(&dours, n));
  LLMK_CUDA_CHECK(cudaMemcpy(dx, x.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  encode_kernel<<<(n + 255) / 256, 256>>>(dhw, dours, dx, n);
  LLMK_CUDA_CHECK(cudaGetLastError());
  std::vector<uint8_t> hw(n), ours(n);
  LLMK_CUDA_CHECK(cudaMemcpy(hw.data(), dhw, n, cudaMemcpyDeviceToHost));
  LLMK_CUDA_CHECK(cudaMemcpy(ours.data(), dours, n, cudaMemcpyDeviceToHost));
  int bad = 0;
  for (int i = 0; i < n; ++i) {
    const uint8_t host = kvq::e4m3_from_float(x[i]);
    if (hw[i] != ours[i] || hw[i] != host) {
      if (++bad <= 5) {
        ADD_FAILURE() << "x = " << x[i] << ": hardware " << int(hw[i]) << ", device "
                      << int(ours[i]) << ", host " << int(host);
      }
    }
  }
  EXPECT_EQ(bad, 0) << "of " << n;
  float *dh = nullptr, *do_ = nullptr;
  LLMK_CUDA_CHECK(cudaMalloc(&dh, 256 * sizeof(float)));
  LLMK_CUDA_CHECK(cudaMalloc(&do_, 256 * sizeof(float)));
  decode_kernel<<<1, 256>>>(dh, do_);
  LLMK_CUDA_CHECK(cudaGetLastError());
  std::vector<float> h(256), o(256);
  LLMK_CUDA_CHECK(cudaMemcpy(h.data(), dh, 256 * sizeof(float), cudaMemcpyDeviceToHost));
  LLMK_CUDA_CHECK(cudaMemcpy(o.data(), do_, 256 * sizeof(float), cudaMemcpyDeviceToHost));
  for (int b = 0; b < 256; ++b) {
    if (std::isnan(h[b])) {
      EXPECT_TRUE(std::isnan(o[b])) << b;
    } else {
      EXPECT_EQ(o[b], h[b]) << "code " << b;
    }
  }
  for (void* p : {static_cast<void*>(dx), static_cast<void*>(dhw), static_cast<void*>(dours),
                  static_cast<void*>(dh), static_cast<void*>(do_)}) {
    LLMK_CUDA_CHECK(cudaFree(p));
  }
}

}  // namespace
}  // namespace llmk
