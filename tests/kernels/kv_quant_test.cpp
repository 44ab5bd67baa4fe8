// The 8-bit KV formats of kernels/kv_quant.h. E4M3's codes by hand from the OCP 8-bit floating
// point specification (bias 7, 3 mantissa bits, no infinities, S.1111.111 NaN, largest 448); the
// GPU's own conversion instruction is checked against the same encoder in
// tests/gpu/kv_quant_gpu_test.cu.
#include "kernels/kv_quant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace llmk {
namespace {

using kvq::Format;

TEST(KvQuant, E4M3CodesByHand) {
  EXPECT_EQ(kvq::e4m3_to_float(0x38), 1.0f);              // exponent 7 = bias
  EXPECT_EQ(kvq::e4m3_to_float(0x7E), 448.0f);            // 1.75 x 2^8
  EXPECT_EQ(kvq::e4m3_to_float(0x08), 0.015625f);         // 2^-6, the smallest normal
  EXPECT_EQ(kvq::e4m3_to_float(0x01), 0.001953125f);      // 2^-9, the smallest subnormal
  EXPECT_EQ(kvq::e4m3_to_float(0x07), 7 * 0.001953125f);  // the largest subnormal
  EXPECT_EQ(kvq::e4m3_to_float(0xBC), -1.5f);
  EXPECT_TRUE(std::isnan(kvq::e4m3_to_float(0x7F)));
  EXPECT_TRUE(std::isnan(kvq::e4m3_to_float(0xFF)));
  EXPECT_EQ(kvq::e4m3_from_float(1.0f), 0x38);
  EXPECT_EQ(kvq::e4m3_from_float(-448.0f), 0xFE);
  EXPECT_EQ(kvq::e4m3_from_float(0.0f), 0x00);
  EXPECT_EQ(kvq::e4m3_from_float(-0.0f), 0x80);
  EXPECT_EQ(kvq::e4m3_from_float(NAN), 0x7F);
}

TEST(KvQuant, E4M3EveryCodeRoundTrips) {
  for (int b = 0; b < 256; ++b) {
    const auto code = static_cast<uint8_t>(b);
    if ((code & 0x7F) == 0x7F) continue;  // NaN
    EXPECT_EQ(kvq::e4m3_from_float(kvq::e4m3_to_float(code)), code) << "code " << b;
  }
}

TEST(KvQuant, E4M3RoundsToNearestEvenAndSaturates) {
  EXPECT_EQ(kvq::e4m3_from_float(1.0625f), 0x38);        // halfway 1 | 1.125: the even mantissa, 1
  EXPECT_EQ(kvq::e4m3_from_float(1.1875f), 0x3A);        // halfway 1.125 | 1.25: 1.25
  EXPECT_EQ(kvq::e4m3_from_float(1.07f), 0x39);          // nearer 1.125
  EXPECT_EQ(kvq::e4m3_from_float(1.97f), 0x40);          // rounds up into the next binade: 2
  EXPECT_EQ(kvq::e4m3_from_float(0.0009765625f), 0x00);  // half the smallest subnormal: even, 0
  EXPECT_EQ(kvq::e4m3_from_float(0.0029296875f), 0x02);  // 1.5 subnormal steps: even, 2
  EXPECT_EQ(kvq::e4m3_from_float(0.0146484375f), 0x08);  // 7.5 steps: even, 8 = 2^-6
  EXPECT_EQ(kvq::e4m3_from_float(460.0f), 0x7E);         // past 448: saturated, never NaN
  EXPECT_EQ(kvq::e4m3_from_float(1e30f), 0x7E);
  EXPECT_EQ(kvq::e4m3_from_float(-INFINITY), 0xFE);
  // Every float maps to the code nearest it (ties to even), checked by brute force.
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> mag(-12.0f, 9.0f);
  for (int i = 0; i < 20000; ++i) {
    const float x = std::exp2(mag(rng)) * (i % 2 ? -1.0f : 1.0f);
    const uint8_t got = kvq::e4m3_from_float(x);
    float best = INFINITY;
    for (int b = 0; b < 256; ++b) {
      const float v = kvq::e4m3_to_float(static_cast<uint8_t>(b));
      if (!std::isnan(v))
        best = std::min(best, std::fabs(v - std::fmin(std::fmax(x, -448.0f), 448.0f)));
    }
    EXPECT_EQ(std::fabs(kvq::e4m3_to_float(got) - std::fmin(std::fmax(x, -448.0f), 448.0f)), best)
        << "x = " << x;
  }
}

TEST(KvQuant, Int8RoundsToNearestEvenAndClamps) {
  EXPECT_EQ(static_cast<int8_t>(kvq::encode<Format::I8>(2.5f)), 2);
  EXPECT_EQ(static_cast<int8_t>(kvq::encode<Format::I8>(3.5f)), 4);
  EXPECT_EQ(static_cast<int8_t>(kvq::encode<Format::I8>(-126.6f)), -127);
  EXPECT_EQ(static_cast<int8_t>(kvq::encode<Format::I8>(200.0f)), 127);
  EXPECT_EQ(static_cast<int8_t>(kvq::encode<Format::I8>(-200.0f)), -127);
  EXPECT_EQ(kvq::decode<Format::I8>(kvq::encode<Format::I8>(-7.0f)), -7.0f);
}

// A head row through its scale: the largest value comes back exactly, every other within half a
// step of its format at that magnitude.
template <Format F>
void check_row(uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  float x[64], absmax = 0;
  for (float& v : x) {
    v = dist(rng);
    absmax = std::max(absmax, std::fabs(v));
  }
  const float inv = kvq::inverse_scale<F>(absmax), scale = kvq::scale_of<F>(absmax);
  for (const float v : x) {
    const float back = kvq::decode<F>(kvq::encode<F>(v * inv)) * scale;
    const float step = F == Format::I8 ? scale : std::max(std::fabs(v) / 8.0f, scale / 512.0f);
    EXPECT_LE(std::fabs(back - v), 0.5f * step * 1.0001f) << v;
    if (std::fabs(v) == absmax) {
      EXPECT_NEAR(back, v, 1e-6f * absmax);
    }
  }
  EXPECT_EQ(kvq::inverse_scale<F>(0.0f), 0.0f);  // a row of zeros: scale 0, codes 0
  EXPECT_EQ(kvq::decode<F>(kvq::encode<F>(0.0f * kvq::inverse_scale<F>(0.0f))), 0.0f);
}

TEST(KvQuant, RowsComeBackWithinHalfAStep) {
  for (uint32_t s = 0; s < 20; ++s) {
    check_row<Format::E4M3>(s);
    check_row<Format::I8>(s);
  }
}

}  // namespace
}  // namespace llmk
