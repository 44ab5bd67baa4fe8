#include "model/memory_check.h"

#include "core/error.h"

#ifdef LLMK_HAS_CUDA
#include "core/cuda/device.h"
#endif

namespace llmk {

void check_device_memory(const std::string& path, Device device, uint64_t weight_bytes,
                         uint64_t kv_bytes, uint64_t activation_bytes) {
  if (device == Device::CPU) return;
#ifdef LLMK_HAS_CUDA
  cuda::init();
  // cuBLASLt's workspace and the CUDA context's own needs: a margin, not a measurement.
  constexpr uint64_t kMargin = 256ull << 20;
  const auto [free, total] = cuda::mem_info();
  const uint64_t need = weight_bytes + kv_bytes + activation_bytes + kMargin;
  constexpr double MiB = 1 << 20;
  LLMK_CHECK(need <= free,
             "not enough GPU memory for {}: needs {:.0f} MiB (weights {:.0f}, KV cache {:.0f}, "
             "activations {:.0f}, margin {:.0f}) but {:.0f} MiB of {:.0f} MiB are free; try a "
             "smaller --ctx",
             path, need / MiB, weight_bytes / MiB, kv_bytes / MiB, activation_bytes / MiB,
             kMargin / MiB, free / MiB, total / MiB);
#else
  (void)path, (void)weight_bytes, (void)kv_bytes, (void)activation_bytes;
  LLMK_FAIL("{}: --device cuda needs a GPU build of llmk (cmake --preset cuda)", path);
#endif
}

}  // namespace llmk
