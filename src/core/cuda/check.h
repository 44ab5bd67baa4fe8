// Checking CUDA runtime calls. Every CUDA call in llmk goes through LLMK_CUDA_CHECK, and every
// kernel launch is followed by check_launch(op); both throw llmk::Error.
//
// This header includes only cuda_runtime.h, so .cu files can use it freely. Launch errors are
// reported where they happen only for invalid launches; errors inside a kernel surface at the next
// synchronising call (run with CUDA_LAUNCH_BLOCKING=1 to pin them to their launch).
#pragma once

#include <cuda_runtime.h>

namespace llmk::cuda {

// Throws llmk::Error "CUDA error <name> (<string>) in <expr> at <file>:<line>". Clears the
// runtime's last-error state first, so a caught error does not resurface in check_launch.
[[noreturn]] void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line);

// Call after every kernel launch: throws llmk::Error "CUDA error in <op>: <name> (<string>)" when
// the launch (or an earlier asynchronous call) failed.
void check_launch(const char* op);

}  // namespace llmk::cuda

#define LLMK_CUDA_CHECK(expr)                                                    \
  do {                                                                           \
    const cudaError_t llmk_cuda_err_ = (expr);                                   \
    if (llmk_cuda_err_ != cudaSuccess) {                                         \
      ::llmk::cuda::throw_cuda_error(llmk_cuda_err_, #expr, __FILE__, __LINE__); \
    }                                                                            \
  } while (0)
