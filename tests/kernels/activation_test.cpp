#include "kernels/cpu/activation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/test_util.h"

namespace llmk {
namespace {

double ref_act(double x, cpu::Activation act) {
  if (act == cpu::Activation::SiLU) return x / (1.0 + std::exp(-x));
  const double k = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
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
          // exp to ~2 ulp plus a few f32 roundings: 8u relative. GELU for negative x is
          // x - x / (1 + e^(2u)), a difference of nearly equal terms (as 1 + tanh is in the
          // textbook form), so its absolute error scales with |x * up|.
          const double tol = 8 * test::kU * (std::fabs(want) + std::fabs(gate[j] * up[j])) + 1e-30;
          ASSERT_NEAR(out[j], want, tol)
              << "act=" << static_cast<int>(act) << " F=" << F << " x=" << gate[j];
        }
      }
    }
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
