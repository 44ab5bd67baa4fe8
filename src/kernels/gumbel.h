// Gumbel noise for sampling by the Gumbel-max trick, the same bits on the CPU and the GPU: the
// index of the largest logit / T + g_i over a row, with g_i independent standard Gumbel draws,
// is a draw from softmax(logits / T). g_i comes from a counter-based generator keyed by a row's
// seed and the column, so a draw depends on nothing but its row's logits and seed.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/host_device.h"

namespace llmk::gumbel {

// splitmix64's finaliser.
LLMK_HOST_DEVICE inline uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The standard Gumbel draw of column i under `seed`: -log(-log(u)), u uniform in (0, 1) on a
// 2^-24 grid (never 0 or 1). In double, rounded once: float logarithms differ by an ulp between
// the CPU's library and the GPU's, doubles rounded to float agree.
LLMK_HOST_DEVICE inline float noise(uint64_t seed, int64_t i) {
  const uint64_t z = mix(seed ^ mix(static_cast<uint64_t>(i) + 0x9e3779b97f4a7c15ull));
  const double u = (static_cast<double>(z >> 40) + 0.5) * 0x1.0p-24;
  return static_cast<float>(-log(-log(u)));
}

// A column's key: x / T + g as one fused multiply-add (the same rounding on both sides).
LLMK_HOST_DEVICE inline float key(float x, float inv_t, float g) { return fmaf(x, inv_t, g); }

// The lowest logit a draw may take: top + T log(min_p) (min_p 0: -inf).
LLMK_HOST_DEVICE inline float floor_of(float top, float temperature, float min_p) {
  return min_p > 0 ? fmaf(temperature, static_cast<float>(log(static_cast<double>(min_p))), top)
                   : -INFINITY;
}

// The row's seed for the draw of a sequence's token at `position` from a request's seed.
LLMK_HOST_DEVICE inline uint64_t row_seed(uint64_t seed, int64_t position) {
  return mix(mix(seed) ^ static_cast<uint64_t>(position));
}

}  // namespace llmk::gumbel
