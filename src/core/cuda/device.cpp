#include "core/cuda/device.h"

#include <cuda_runtime.h>

#include <mutex>

#include "core/cuda/allocator.h"
#include "core/cuda/check.h"
#include "core/cuda/stream.h"
#include "core/error.h"
#include "core/tensor.h"

namespace llmk::cuda {

namespace {

struct Probe {
  bool ok = false;
  std::string reason;
};

const Probe& probe() noexcept {
  static const Probe p = []() noexcept {
    Probe r;
    int n = 0;
    const cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      try {
        r.reason = std::string(cudaGetErrorName(err)) + " (" + cudaGetErrorString(err) + ")";
      } catch (...) {
      }
      return r;
    }
    if (n == 0) {
      try {
        r.reason = "no CUDA device found";
      } catch (...) {
      }
      return r;
    }
    r.ok = true;
    return r;
  }();
  return p;
}

DeviceInfo read_device_info() {
  LLMK_CHECK(available(), "no usable CUDA device: {}", unavailable_reason());
  DeviceInfo info;
  LLMK_CUDA_CHECK(cudaGetDevice(&info.id));
  cudaDeviceProp prop{};
  LLMK_CUDA_CHECK(cudaGetDeviceProperties(&prop, info.id));
  info.name = prop.name;
  info.sm_count = prop.multiProcessorCount;
  info.cc_major = prop.major;
  info.cc_minor = prop.minor;
  info.total_memory = prop.totalGlobalMem;
  info.l2_bytes = static_cast<size_t>(prop.l2CacheSize);
  info.max_smem_per_block_optin = prop.sharedMemPerBlockOptin;
  info.smem_per_sm = prop.sharedMemPerMultiprocessor;
  info.max_threads_per_sm = prop.maxThreadsPerMultiProcessor;
  info.warp_size = prop.warpSize;
  return info;
}

cudaMemcpyKind copy_kind(Device dst, Device src) {
  if (src == Device::CPU) return dst == Device::CPU ? cudaMemcpyHostToHost : cudaMemcpyHostToDevice;
  return dst == Device::CPU ? cudaMemcpyDeviceToHost : cudaMemcpyDeviceToDevice;
}

}  // namespace

bool available() noexcept { return probe().ok; }

const std::string& unavailable_reason() noexcept { return probe().reason; }

const DeviceInfo& device_info() {
  // A function-local static whose initialiser throws is retried on the next call.
  static const DeviceInfo info = read_device_info();
  return info;
}

std::pair<size_t, size_t> mem_info() {
  size_t free_bytes = 0, total_bytes = 0;
  LLMK_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return {free_bytes, total_bytes};
}

void init() {
  // call_once leaves the flag unset when the callable throws, so a failed init can be retried.
  static std::once_flag once;
  std::call_once(once, [] {
    LLMK_CHECK(available(), "cuda::init(): no usable CUDA device: {}", unavailable_reason());
    (void)device_info();
    install_allocator();
    set_device_copy(
        [](void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
          memcpy_sync(dst, src, bytes, copy_kind(dst_device, src_device));
        });
  });
}

}  // namespace llmk::cuda
