// Helpers shared by the kernel and ops tests: seeded random data, poisoned outputs, and random
// ggml blocks with sane scales.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/half.h"

namespace llmk::test {

inline constexpr float kPoison = std::numeric_limits<float>::quiet_NaN();
// Unit roundoff of f32.
inline constexpr double kU = 1.0 / (1 << 24);

inline std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.0f,
                                        float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Inputs must not be trivially zero (or constant), or a test could pass vacuously.
inline void expect_nontrivial(const float* v, size_t n) {
  ASSERT_GT(n, 0u);
  size_t nonzero = 0;
  bool varied = false;
  for (size_t i = 0; i < n; ++i) {
    nonzero += v[i] != 0.0f;
    varied |= v[i] != v[0];
  }
  ASSERT_GE(nonzero * 2, n) << "test input is mostly zeros";
  if (n > 1) {
    ASSERT_TRUE(varied) << "test input is constant";
  }
}
inline void expect_nontrivial(const std::vector<float>& v) {
  expect_nontrivial(v.data(), v.size());
}

// Byte offsets of the f16 scale fields in one ggml block (from ggml's structs; deliberately not
// taken from llmk's own layout definitions).
inline std::vector<int> f16_field_offsets(DType t) {
  switch (t) {
    case DType::Q4_0:
      return {0};
    case DType::Q4_1:
      return {0, 2};
    case DType::Q5_0:
      return {0};
    case DType::Q5_1:
      return {0, 2};
    case DType::Q8_0:
      return {0};
    case DType::Q2_K:
      return {80, 82};
    case DType::Q3_K:
      return {108};
    case DType::Q4_K:
      return {0, 2};
    case DType::Q5_K:
      return {0, 2};
    case DType::Q6_K:
      return {208};
    default:
      return {};
  }
}

// `nblocks` blocks of random bytes whose f16 scales are finite, of either sign, with
// magnitudes in [2^-8, 2^-2].
inline std::vector<uint8_t> random_blocks(DType t, int64_t nblocks, uint32_t seed) {
  const int64_t bb = dtype_info(t).block_bytes;
  std::mt19937 rng(seed);
  std::vector<uint8_t> b(static_cast<size_t>(nblocks * bb));
  for (uint8_t& x : b) x = static_cast<uint8_t>(rng() & 0xFF);
  std::uniform_real_distribution<float> expo(-8.0f, -2.0f);
  for (int64_t i = 0; i < nblocks; ++i) {
    for (int off : f16_field_offsets(t)) {
      const float v = std::exp2(expo(rng)) * ((rng() & 1) ? 1.0f : -1.0f);
      const uint16_t h = float_to_fp16(v);
      std::memcpy(&b[static_cast<size_t>(i * bb + off)], &h, 2);
    }
  }
  return b;
}

// Random weights for a [rows, K] matrix of dtype t, as raw bytes.
inline std::vector<uint8_t> random_weights(DType t, int64_t rows, int64_t K, uint32_t seed) {
  if (is_quantized(t)) return random_blocks(t, rows * K / block_size(t), seed);
  const std::vector<float> f = random_floats(static_cast<size_t>(rows * K), seed);
  std::vector<uint8_t> b(static_cast<size_t>(rows * K) * element_size(t));
  for (size_t i = 0; i < f.size(); ++i) {
    if (t == DType::F32) {
      std::memcpy(&b[i * 4], &f[i], 4);
    } else {
      const uint16_t h = t == DType::F16 ? float_to_fp16(f[i]) : float_to_bf16(f[i]);
      std::memcpy(&b[i * 2], &h, 2);
    }
  }
  return b;
}

}  // namespace llmk::test
