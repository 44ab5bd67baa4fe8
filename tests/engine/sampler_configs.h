// Sampler settings shared by the engine's tests.
#pragma once

#include <cstdint>

#include "engine/sampler.h"

namespace llmk::test {

// Plain sampling at `temperature` (no top-k, top-p or min-p) from `seed`.
inline SamplerConfig untruncated(float temperature, uint64_t seed = 1) {
  SamplerConfig c;
  c.temperature = temperature;
  c.top_k = 0;
  c.top_p = 1.0f;
  c.min_p = 0.0f;
  c.seed = seed;
  return c;
}

}  // namespace llmk::test
