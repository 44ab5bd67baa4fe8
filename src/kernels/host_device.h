// LLMK_HOST_DEVICE: a function both the CPU and the GPU compile (nvcc's __host__ __device__).
#pragma once

#if defined(__CUDACC__)
#define LLMK_HOST_DEVICE __host__ __device__
#else
#define LLMK_HOST_DEVICE
#endif
