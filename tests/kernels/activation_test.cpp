#include "kernels/cpu/activation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/test_util.h"

namespace llmk {
namespace {

// GELU as x / (1 + e^(-2u)), u = sqrt(2/pi) (x + 0.044715 x^3): 0.5 x (1 + tanh u) without the
// cancellation of 1 + tanh u for negative x.
double ref_act(double x, cpu::Activation act) {
  if (act == cpu::Activation::SiLU) return x / (1.0 + std::exp(-x));
  const double k = std::sqrt(2.0 / M_PI);
  return x / (1.0 + std::exp(-2.0 * k * (x + 0.044715 * x * x * x)));
}

TEST(GatedAct, MatchesDoubleReference) {
  uint32_t seed = 1;
  for (auto act : {cpu::Activation::SiLU, cpu::Activation::GeluTanh}) {
    for (int64_t F : {1, 7, 8, 17, 127, 1536}) {
      const int64_t rows = 3, ld = F + 4;
      std::vector<float> gate =
          test::random_floats(static_cast<size_t>(rows * ld), seed++, -10, 10);
      const std::vector<float> up =
          test::random_floats(static_cast<size_t>(rows * ld), seed++, -2, 2);
      // Extremes: saturation on both sides and zero.
      const float extremes[] = {-100.0f, 100.0f, 0.0f, -30.0f, 30.0f, -1e-3f};
      for (size_t i = 0; i < std::size(extremes) && i < static_cast<size_t>(F); ++i)
        gate[i] = extremes[i];
      test::expect_nontrivial(gate);
      std::vector<float> out(gate.size(), test::kPoison);
      cpu::gated_act(out.data(), ld, gate.data(), ld, up.data(), ld, rows, F, act);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t i = 0; i < ld; ++i) {
          const size_t j = static_cast<size_t>(r * ld + i);
          if (i >= F) {
            ASSERT_TRUE(std::isnan(out[j])) << "wrote padding";
            continue;
          }
          const double want = ref_act(gate[j], act) * up[j];
          // exp to ~2 ulp plus a few f32 roundings: 8u relative. GELU for negative x is a small
          // fraction of x whose relative error grows with |x| (the f32 rounding of the exponent's
          // argument), so it is held to a multiple of |x * up| here and checked relative to its
          // size in GeluTanhKeepsItsDigitsForNegativeX.
          const double tol = 8 * test::kU * (std::fabs(want) + std::fabs(gate[j] * up[j])) + 1e-30;
          ASSERT_NEAR(out[j], want, tol)
              << "act=" << static_cast<int>(act) << " F=" << F << " x=" << gate[j];
        }
      }
    }
  }
}

// Below x = -4 the form x - x / (1 + e^(2u)) loses all of GELU's digits; x / (1 + e^(-2u)) keeps
// them, but for rounding the exponent's argument: about |2u| ulp, under 2e-5 down to x = -9.
TEST(GatedAct, GeluTanhKeepsItsDigitsForNegativeX) {
  constexpr int64_t F = 67;  // eight AVX2 blocks, then the scalar tail
  std::vector<float> gate(F), up(F, 1.0f), out(F, test::kPoison);
  for (int64_t i = 0; i < F; ++i) gate[i] = -4.0f - 5.0f * static_cast<float>(i) / (F - 1);
  cpu::gated_act(out.data(), F, gate.data(), F, up.data(), F, 1, F, cpu::Activation::GeluTanh);
  for (int64_t i = 0; i < F; ++i) {
    const double want = ref_act(gate[i], cpu::Activation::GeluTanh);
    EXPECT_NEAR(out[i], want, 2e-5 * std::fabs(want)) << "x=" << gate[i];
  }
}

TEST(GatedAct, OutputMayAliasAnInput) {
  std::vector<float> gate = test::random_floats(2 * 40, 3, -4, 4);
  std::vector<float> up = test::random_floats(2 * 40, 4);
  std::vector<float> want(gate.size(), test::kPoison);
  cpu::gated_act(want.data(), 40, gate.data(), 40, up.data(), 40, 2, 40, cpu::Activation::SiLU);
  cpu::gated_act(gate.data(), 40, gate.data(), 40, up.data(), 40, 2, 40, cpu::Activation::SiLU);
  EXPECT_EQ(gate, want);
}

}  // namespace
}  // namespace llmk
