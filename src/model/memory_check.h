#pragma once

#include <cstdint>
#include <string>

#include "core/tensor.h"

namespace llmk {

// On CUDA: throws llmk::Error before any copy when weights + KV cache + activations exceed the
// free GPU memory, naming each figure. Initialises the CUDA runtime. Nothing to check on the CPU.
void check_device_memory(const std::string& path, Device device, uint64_t weight_bytes,
                         uint64_t kv_bytes, uint64_t activation_bytes);

}  // namespace llmk
