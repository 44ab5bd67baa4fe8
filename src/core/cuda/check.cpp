#include "core/cuda/check.h"

#include "core/error.h"

namespace llmk::cuda {

void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line) {
  (void)cudaGetLastError();
  throw Error(fmt::format("CUDA error {} ({}) in {} at {}:{}", cudaGetErrorName(err),
                          cudaGetErrorString(err), expr, file, line));
}

void check_launch(const char* op) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    throw Error(fmt::format("CUDA error in {}: {} ({})", op, cudaGetErrorName(err),
                            cudaGetErrorString(err)));
  }
}

}  // namespace llmk::cuda
