// The CUDA device llmk runs on: whether one exists, what it is, and process-wide setup.
//
// llmk uses one device per process (the runtime's current device, 0 unless the caller selected
// another or set CUDA_VISIBLE_DEVICES).
#pragma once

#include <cstddef>
#include <string>
#include <utility>

namespace llmk::cuda {

// True when a CUDA driver and at least one device can be used. Never throws; probes once.
bool available() noexcept;
// Why available() is false ("" when it is true), e.g. "cudaErrorNoDevice (no CUDA-capable
// device is detected)".
const std::string& unavailable_reason() noexcept;

// Properties of the current device, read from the device once (never hard-coded): launchers size
// grids by sm_count and shared memory by max_smem_per_block_optin.
struct DeviceInfo {
  int id = 0;
  std::string name;
  int sm_count = 0;
  int cc_major = 0;
  int cc_minor = 0;
  size_t total_memory = 0;              // bytes of device memory
  size_t l2_bytes = 0;                  // L2 cache size
  size_t max_smem_per_block_optin = 0;  // after cudaFuncSetAttribute(MaxDynamicSharedMemorySize)
  size_t smem_per_sm = 0;
  int max_threads_per_sm = 0;
  int warp_size = 0;

  int compute_capability() const { return cc_major * 10 + cc_minor; }  // 90 for sm_90
};
// Throws llmk::Error when no device is available.
const DeviceInfo& device_info();

// (free, total) bytes of device memory, from cudaMemGetInfo.
std::pair<size_t, size_t> mem_info();

// Process-wide setup, idempotent: checks that a device is available (llmk::Error naming the
// reason if not), installs the caching allocator for Device::CUDA tensors and the host<->device
// copy used by Tensor::to. Call before creating CUDA tensors.
void init();

}  // namespace llmk::cuda
