#pragma once

#include <cstdint>
#include <string>

#include "core/tensor.h"

namespace llmk {

// What a CUDA load needs beside the figures the model knows: cuBLASLt's workspace and the CUDA
// context's own needs. A margin, not a measurement.
inline constexpr uint64_t kDeviceMemoryMargin = 256ull << 20;

// The device memory a load needs, in bytes.
struct DeviceMemoryNeed {
  uint64_t weights = 0, kv_cache = 0, activations = 0;
};

// Throws llmk::Error naming each figure when need + kDeviceMemoryMargin exceeds free_bytes (of
// total_bytes); a need equal to free_bytes fits. A sum too large for 64 bits does not fit.
void check_memory_fits(const std::string& path, const DeviceMemoryNeed& need, uint64_t free_bytes,
                       uint64_t total_bytes);

// On CUDA: check_memory_fits against the free GPU memory now, before any copy. Initialises the
// CUDA runtime. Nothing to check on the CPU; a build without CUDA refuses Device::CUDA.
void check_device_memory(const std::string& path, Device device, uint64_t weight_bytes,
                         uint64_t kv_bytes, uint64_t activation_bytes);

}  // namespace llmk
