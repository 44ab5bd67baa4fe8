// main() of the GPU tests: exits 77 (ctest SKIP) where no CUDA device can be used, so a
// machine without a GPU reports these tests as skipped, never as passed.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>

int main(int argc, char** argv) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess || n == 0) {
    std::printf("SKIP: no usable CUDA device (%s)\n",
                err != cudaSuccess ? cudaGetErrorString(err) : "device count is 0");
    return 77;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("GPU tests on %s (sm_%d%d, %d SMs)\n", prop.name, prop.major, prop.minor,
              prop.multiProcessorCount);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
