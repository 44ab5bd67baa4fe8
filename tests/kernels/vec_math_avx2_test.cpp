// vec_math.h's AVX2 code, built into this file alone (CMakeLists.txt gives it -march=x86-64-v3)
// under a namespace of its own, as the kernels' AVX2 build is (kernels/cpu/isa.h); run where the
// CPU has AVX2.
#define LLMK_CPU_ISA isa_test_avx2
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu/isa.h"
#include "kernels/cpu/vec_math.h"

#if defined(__AVX2__)  // x86-64 builds (elsewhere this file is empty)
namespace llmk {
namespace {

// The vector exp against the correctly rounded one over its whole documented range.
TEST(VecMath, Exp8IsWithinTwoUlp) {
  if (!cpu::isa_available(cpu::Isa::Avx2)) GTEST_SKIP() << "this CPU has no AVX2";
  double worst = 0;
  for (int i = 0; i <= 174900; ++i) {  // x in [-87, 87.9]: above 88 the input is clamped
    const float x = -87.0f + static_cast<float>(i) * 0.001f;
    alignas(32) float in[8], out[8];
    for (int l = 0; l < 8; ++l) in[l] = std::nextafter(x, l % 2 ? 100.0f : -100.0f);
    _mm256_store_ps(out, cpu::detail::exp8(_mm256_load_ps(in)));
    for (int l = 0; l < 8; ++l) {
      const double want = std::exp(static_cast<double>(in[l]));
      const double ulp = std::ldexp(1.0, std::ilogb(want) - 23);
      worst = std::max(worst, std::fabs(out[l] - want) / ulp);
    }
  }
  EXPECT_LE(worst, 2.0);
  alignas(32) float in[8] = {-INFINITY, -88.0f, -1000.0f, 88.0f, 1000.0f, NAN, 0.0f, -0.0f};
  alignas(32) float out[8];
  _mm256_store_ps(out, cpu::detail::exp8(_mm256_load_ps(in)));
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(out[1], 0.0f);
  EXPECT_EQ(out[2], 0.0f);
  EXPECT_TRUE(std::isfinite(out[3]) && out[3] > 1e38f);
  EXPECT_EQ(out[4], out[3]);
  EXPECT_TRUE(std::isnan(out[5]));
  EXPECT_EQ(out[6], 1.0f);
  EXPECT_EQ(out[7], 1.0f);
}

}  // namespace
}  // namespace llmk
#endif
