// The sampler's logit penalties, the same arithmetic on the CPU and the GPU (engine/sampler.h's
// chain): a token's logit under the repetition penalty rp (CTRL / llama.cpp: a positive logit is
// divided by rp, a negative one multiplied; rp 1 leaves it as is), then less `sub`, OpenAI's
// presence_penalty + frequency_penalty * count (0 for a token not generated).
#pragma once

#include "kernels/host_device.h"

namespace llmk::penalty {

LLMK_HOST_DEVICE inline float apply(float logit, float rp, float sub) {
  const float l = logit > 0 ? logit / rp : logit * rp;
  return l - sub;
}

// What a token generated `count` times has subtracted (0 when count is 0).
inline float subtracted(float presence, float frequency, int count) {
  return count > 0 ? presence + frequency * static_cast<float>(count) : 0.0f;
}

}  // namespace llmk::penalty
