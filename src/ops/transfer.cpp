#include <cstring>

#include "ops/check.h"
#include "ops/ops.h"

#ifdef LLMK_HAS_CUDA
#include <cuda_runtime.h>

#include "core/cuda/check.h"
#include "core/cuda/stream.h"
#endif

namespace llmk::ops {

void transfer(Tensor& dst, const Tensor& src) {
  LLMK_CHECK(dst.shape() == src.shape() && dst.dtype() == src.dtype(),
             "ops::transfer: dst is {} but src is {}: shapes and dtypes must match", dst.str(),
             src.str());
  LLMK_CHECK(dst.is_contiguous() && src.is_contiguous(),
             "ops::transfer: dst {} and src {} must be contiguous", dst.str(), src.str());
  const auto bytes = static_cast<size_t>(src.nbytes());
  if (dst.device() == Device::CPU && src.device() == Device::CPU) {
    std::memmove(dst.data(), src.data(), bytes);
    return;
  }
#ifdef LLMK_HAS_CUDA
  cudaStream_t s = cuda::current_stream();
  if (dst.device() == Device::CUDA && src.device() == Device::CUDA) {
    LLMK_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice, s));
  } else if (dst.device() == Device::CUDA) {
    LLMK_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyHostToDevice, s));
  } else {
    LLMK_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToHost, s));
    LLMK_CUDA_CHECK(cudaStreamSynchronize(s));
  }
#else
  LLMK_FAIL("ops::transfer: {} -> {} needs a GPU, but llmk was not built with CUDA", src.str(),
            dst.str());
#endif
}

}  // namespace llmk::ops
