// Rotary position embedding on the GPU, in place on bf16, fp16 or f32.
#pragma once

#include <cstdint>

#include "kernels/cuda/kv_cache.h"

namespace llmk::cuda {

struct RopeArgs {
  void* x = nullptr;          // [T, H, D] of dtype; strides (ld_t, ld_h, 1)
  DType dtype = DType::BF16;  // BF16, F16 or F32
  int64_t T = 0, H = 0, D = 0;
  int64_t ld_t = 0, ld_h = 0;
  const int32_t* positions = nullptr;  // [T] i32 in device memory, pos_stride apart
  int64_t pos_stride = 1;
  int rot_dim = 0;                      // even, in (0, D], at most 2 * kMaxRopePairs
  double theta = 1e4;                   // inv_freq[i] = theta^(-2i/rot_dim)
  bool half_split = true;               // pairs (i, i + rot_dim/2) if true, else (2i, 2i+1)
  double freq_scale = 1.0;              // angle = pos * freq_scale * inv_freq[i]
  const float* freq_factors = nullptr;  // optional [rot_dim/2] f32 in device memory: inv_freq /=
  // Optional, in the same launch: the last append->H heads of x are keys; once rotated they are
  // written to append->k_cache, and append->v to append->v_cache, at the rows append->positions
  // names (as kv_append; append->k is ignored; the caches and v must be of x's dtype).
  const KvAppendArgs* append = nullptr;
};

// Most rotated pairs per head the launcher takes (rot_dim <= 2 * kMaxRopePairs = 512): the
// per-pair frequencies travel in the kernel's parameters.
inline constexpr int kMaxRopePairs = 256;

// As cpu::rope (then cuda::kv_append when a.append is set): the angle pos * inv_freq[i] is formed
// in double and reduced to [-pi, pi] before a float sincos, so positions far beyond 2^17 keep full
// float accuracy.
void rope(const RopeArgs& a);

}  // namespace llmk::cuda
