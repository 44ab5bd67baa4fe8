#include "kernels/cpu/rms_norm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/test_util.h"

namespace llmk {
namespace {

// Double reference: y = x / sqrt(mean(x^2) + eps) * (w or 1 + w).
double ref_rms(const float* x, const float* w, int64_t D, int64_t i, float eps, bool add_one) {
  double ss = 0;
  for (int64_t k = 0; k < D; ++k) ss += static_cast<double>(x[k]) * x[k];
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(D) + eps);
  return x[i] * inv * (add_one ? 1.0 + w[i] : static_cast<double>(w[i]));
}

TEST(RmsNorm, MatchesDoubleReference) {
  uint32_t seed = 1;
  for (int64_t rows : {1, 3, 17}) {
    for (int64_t D : {1, 3, 17, 127, 576}) {
      for (bool add_one : {false, true}) {
        const int64_t ld = D + 5;  // row padding: must stay poisoned
        const std::vector<float> x =
            test::random_floats(static_cast<size_t>(rows * ld), seed++, -3, 3);
        const std::vector<float> w = test::random_floats(static_cast<size_t>(D), seed++, -2, 2);
        test::expect_nontrivial(x);
        std::vector<float> y(x.size(), test::kPoison);
        const float eps = 1e-5f;
        cpu::rms_norm(y.data(), ld, x.data(), ld, rows, D, w.data(), eps, add_one);
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t i = 0; i < ld; ++i) {
            const float got = y[static_cast<size_t>(r * ld + i)];
            if (i >= D) {
              ASSERT_TRUE(std::isnan(got)) << "wrote padding";
              continue;
            }
            const double ref = ref_rms(x.data() + r * ld, w.data(), D, i, eps, add_one);
            // The f32 kernel rounds the inverse norm, the (1 + w) and two products: four
            // roundings of relative size u each.
            ASSERT_NEAR(got, ref, 4 * test::kU * std::fabs(ref) + 1e-30)
                << "rows=" << rows << " D=" << D << " add_one=" << add_one << " at " << r << ","
                << i;
          }
        }
      }
    }
  }
}

TEST(RmsNorm, InPlace) {
  std::vector<float> x = test::random_floats(3 * 64, 9);
  const std::vector<float> w = test::random_floats(64, 10);
  std::vector<float> y(x.size(), test::kPoison);
  cpu::rms_norm(y.data(), 64, x.data(), 64, 3, 64, w.data(), 1e-6f, false);
  cpu::rms_norm(x.data(), 64, x.data(), 64, 3, 64, w.data(), 1e-6f, false);
  EXPECT_EQ(x, y);
}

}  // namespace
}  // namespace llmk
