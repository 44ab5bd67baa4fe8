#include "model/memory_check.h"

#include <initializer_list>

#include "core/error.h"

#ifdef LLMK_HAS_CUDA
#include "core/cuda/device.h"
#endif

namespace llmk {

void check_memory_fits(const std::string& path, const DeviceMemoryNeed& need, uint64_t free_bytes,
                       uint64_t total_bytes) {
  uint64_t sum = kDeviceMemoryMargin;
  bool overflow = false;
  for (const uint64_t part : {need.weights, need.kv_cache, need.activations}) {
    overflow |= __builtin_add_overflow(sum, part, &sum);
  }
  constexpr double MiB = 1 << 20;
  LLMK_CHECK(!overflow && sum <= free_bytes,
             "not enough GPU memory for {}: needs {:.0f} MiB (weights {:.0f}, KV cache {:.0f}, "
             "activations {:.0f}, margin {:.0f}) but {:.0f} MiB of {:.0f} MiB are free; try a "
             "smaller --ctx",
             path,
             (static_cast<double>(need.weights) + static_cast<double>(need.kv_cache) +
              static_cast<double>(need.activations) + kDeviceMemoryMargin) /
                 MiB,
             need.weights / MiB, need.kv_cache / MiB, need.activations / MiB,
             kDeviceMemoryMargin / MiB, free_bytes / MiB, total_bytes / MiB);
}

void check_device_memory(const std::string& path, Device device, uint64_t weight_bytes,
                         uint64_t kv_bytes, uint64_t activation_bytes) {
  if (device == Device::CPU) return;
#ifdef LLMK_HAS_CUDA
  cuda::init();
  const auto [free, total] = cuda::mem_info();
  check_memory_fits(path, {weight_bytes, kv_bytes, activation_bytes}, free, total);
#else
  (void)path, (void)weight_bytes, (void)kv_bytes, (void)activation_bytes;
  LLMK_FAIL("{}: --device cuda needs a GPU build of llmk (cmake --preset cuda)", path);
#endif
}

}  // namespace llmk
