#include "kernels/cuda/common.cuh"

#include "core/cuda/device.h"

namespace llmk::cuda {

bool dependent_launch_supported() {
  static const bool yes = device_info().cc_major >= 9;
  return yes;
}

}  // namespace llmk::cuda
