// Rotary position embedding, in place.
#pragma once

#include <cstdint>

namespace llmk::cpu {

struct RopeArgs {
  float* x = nullptr;  // [T, H, D] f32; dim 0 and 1 strides below, the last dim contiguous
  int64_t T = 0, H = 0, D = 0;
  int64_t ld_t = 0, ld_h = 0;
  const int32_t* positions = nullptr;  // [T], pos_stride apart
  int64_t pos_stride = 1;
  int rot_dim = 0;                      // even, <= D: dims [rot_dim, D) are left untouched
  double theta = 1e4;                   // inv_freq[i] = theta^(-2i/rot_dim)
  bool half_split = true;               // pairs (i, i + rot_dim/2) if true, else (2i, 2i+1)
  double freq_scale = 1.0;              // angle = pos * freq_scale * inv_freq[i]
  const float* freq_factors = nullptr;  // optional [rot_dim/2]: inv_freq[i] /= factors[i]
};

// Frequencies and angles are computed in double (positions up to 1e5 and beyond keep their
// accuracy), sin/cos rounded to f32, the rotation done in f32:
//   (a, b) -> (a cos - b sin, a sin + b cos).
void rope(const RopeArgs& a);

}  // namespace llmk::cpu
