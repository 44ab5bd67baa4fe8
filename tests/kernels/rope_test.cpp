#include "kernels/cpu/rope.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/test_util.h"

namespace llmk {
namespace {

struct RopeCase {
  int64_t T, H, D;
  int rot;
  bool half_split;
  double theta, freq_scale;
  bool factors;
};

// x: [T, H, D] with head stride D + 2 (padding poisoned) and row stride H * (D + 2).
void run_case(const RopeCase& c, const std::vector<int32_t>& pos, uint32_t seed) {
  const int64_t ldh = c.D + 2, ldt = c.H * ldh;
  std::vector<float> x = test::random_floats(static_cast<size_t>(c.T * ldt), seed, -2, 2);
  for (int64_t t = 0; t < c.T; ++t)
    for (int64_t h = 0; h < c.H; ++h)
      for (int64_t d = c.D; d < ldh; ++d)
        x[static_cast<size_t>(t * ldt + h * ldh + d)] = test::kPoison;
  const std::vector<float> x0 = x;
  std::vector<float> ff = test::random_floats(static_cast<size_t>(c.rot / 2), seed + 1, 1, 8);
  cpu::RopeArgs a;
  a.x = x.data();
  a.T = c.T;
  a.H = c.H;
  a.D = c.D;
  a.ld_t = ldt;
  a.ld_h = ldh;
  a.positions = pos.data();
  a.rot_dim = c.rot;
  a.theta = c.theta;
  a.half_split = c.half_split;
  a.freq_scale = c.freq_scale;
  a.freq_factors = c.factors ? ff.data() : nullptr;
  cpu::rope(a);

  const int half = c.rot / 2;
  for (int64_t t = 0; t < c.T; ++t) {
    for (int64_t h = 0; h < c.H; ++h) {
      const float* in = x0.data() + t * ldt + h * ldh;
      const float* out = x.data() + t * ldt + h * ldh;
      std::vector<double> want(static_cast<size_t>(c.D));
      for (int64_t d = 0; d < c.D; ++d) want[static_cast<size_t>(d)] = in[d];
      for (int i = 0; i < half; ++i) {
        double inv_freq = std::pow(c.theta, -2.0 * i / c.rot);
        if (c.factors) inv_freq /= ff[static_cast<size_t>(i)];
        const double angle =
            static_cast<double>(pos[static_cast<size_t>(t)]) * c.freq_scale * inv_freq;
        const int64_t i0 = c.half_split ? i : 2 * i;
        const int64_t i1 = c.half_split ? i + half : 2 * i + 1;
        want[static_cast<size_t>(i0)] = in[i0] * std::cos(angle) - in[i1] * std::sin(angle);
        want[static_cast<size_t>(i1)] = in[i0] * std::sin(angle) + in[i1] * std::cos(angle);
      }
      for (int64_t d = 0; d < c.D; ++d) {
        if (d >= c.rot) {
          ASSERT_EQ(out[d], in[d]) << "dims beyond rot_dim must be untouched";
          continue;
        }
        // cos/sin rounded to f32 (u each), two products and a sum in f32: within 3u of the
        // magnitude of the pair's terms; the angle itself is exact to double precision.
        const int64_t partner = c.half_split ? (d < half ? d + half : d - half) : (d ^ 1);
        const double mag = std::fabs(in[d]) + std::fabs(in[partner]);
        ASSERT_NEAR(out[d], want[static_cast<size_t>(d)], 4 * test::kU * mag + 1e-30)
            << "t=" << t << " h=" << h << " d=" << d << " pos=" << pos[static_cast<size_t>(t)]
            << " rot=" << c.rot << " half_split=" << c.half_split;
      }
      for (int64_t d = c.D; d < ldh; ++d) ASSERT_TRUE(std::isnan(out[d])) << "wrote padding";
    }
  }
}

TEST(Rope, MatchesReferenceFormulas) {
  const std::vector<int32_t> pos = {0, 1, 7, 511, 4097, 32768, 99999, 100000, 3};
  uint32_t seed = 1;
  const RopeCase cases[] = {
      {9, 3, 64, 64, false, 10000, 1, false},   {9, 3, 64, 64, true, 10000, 1, false},
      {9, 2, 64, 32, true, 500000, 1, false},   {9, 2, 64, 32, false, 500000, 1, false},
      {9, 1, 20, 20, true, 1e6, 0.25, false},   {9, 4, 128, 128, true, 500000, 1, true},
      {9, 4, 128, 96, false, 10000, 0.5, true}, {9, 1, 6, 2, true, 10000, 1, false},
      {9, 5, 18, 10, false, 10000, 1, true},
  };
  for (const RopeCase& c : cases) {
    run_case(c, pos, seed++);
    if (HasFatalFailure()) return;
  }
}

TEST(Rope, PositionZeroIsIdentity) {
  std::vector<float> x = test::random_floats(2 * 3 * 16, 5);
  const std::vector<float> x0 = x;
  const std::vector<int32_t> pos = {0, 0};
  cpu::RopeArgs a;
  a.x = x.data();
  a.T = 2;
  a.H = 3;
  a.D = 16;
  a.ld_t = 48;
  a.ld_h = 16;
  a.positions = pos.data();
  a.rot_dim = 16;
  cpu::rope(a);
  EXPECT_EQ(x, x0);
}

}  // namespace
}  // namespace llmk
