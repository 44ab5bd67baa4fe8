#include "kernels/cpu/softmax.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/test_util.h"

namespace llmk {
namespace {

TEST(Softmax, MatchesDoubleReference) {
  uint32_t seed = 1;
  for (int64_t N : {1, 3, 8, 17, 127, 1000}) {
    const int64_t rows = 4, ld = N + 3;
    std::vector<float> x = test::random_floats(static_cast<size_t>(rows * ld), seed++, -20, 20);
    test::expect_nontrivial(x);
    // Row 1 masks every other entry with -inf (they must come out as exactly 0); row 2 is
    // shifted far up, which the max subtraction must absorb.
    for (int64_t i = 0; i + 1 < N; i += 2) x[static_cast<size_t>(ld + i)] = -INFINITY;
    for (int64_t i = 0; i < N; ++i) x[static_cast<size_t>(2 * ld + i)] += 1000.0f;
    std::vector<float> y(x.size(), test::kPoison);
    cpu::softmax(y.data(), ld, x.data(), ld, rows, N);
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x.data() + r * ld;
      const double mx = *std::max_element(xr, xr + N);
      double sum = 0;
      for (int64_t i = 0; i < N; ++i) sum += std::exp(xr[i] - mx);
      for (int64_t i = 0; i < ld; ++i) {
        const float got = y[static_cast<size_t>(r * ld + i)];
        if (i >= N) {
          ASSERT_TRUE(std::isnan(got)) << "wrote padding";
          continue;
        }
        const double want = std::exp(xr[i] - mx) / sum;
        if (std::isinf(xr[i])) {
          ASSERT_EQ(got, 0.0f);
          continue;
        }
        // x - max is rounded (error u*|x - max| <= 40u at the exponent), exp adds ~2 ulp, the
        // f32 sum of N terms up to N*u, the division u.
        const double tol = (2.0 * static_cast<double>(N) + 48.0) * test::kU * want + 1e-30;
        ASSERT_NEAR(got, want, tol) << "N=" << N << " row " << r << " i=" << i;
      }
    }
  }
}

TEST(Softmax, InPlace) {
  std::vector<float> x = test::random_floats(3 * 50, 7, -5, 5);
  std::vector<float> y(x.size(), test::kPoison);
  cpu::softmax(y.data(), 50, x.data(), 50, 3, 50);
  cpu::softmax(x.data(), 50, x.data(), 50, 3, 50);
  EXPECT_EQ(x, y);
}

}  // namespace
}  // namespace llmk
