#include "kernels/cpu/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/test_util.h"

namespace llmk {
namespace {

struct AttnCase {
  int64_t T, pos0, Hq, Hkv, D, window;
  float softcap;
};

std::string name(const AttnCase& c) {
  return "T=" + std::to_string(c.T) + " pos0=" + std::to_string(c.pos0) +
         " Hq/Hkv=" + std::to_string(c.Hq) + "/" + std::to_string(c.Hkv) +
         " D=" + std::to_string(c.D) + " window=" + std::to_string(c.window) +
         " softcap=" + std::to_string(c.softcap);
}

void run_case(const AttnCase& c, uint32_t seed) {
  // The cache is longer than needed; positions >= pos0 + T hold NaN, so reading a future key
  // would poison the output.
  const int64_t L = c.pos0 + c.T + 3;
  const int64_t D = c.D;
  std::vector<float> q = test::random_floats(static_cast<size_t>(c.T * c.Hq * D), seed, -1, 1);
  std::vector<float> k = test::random_floats(static_cast<size_t>(L * c.Hkv * D), seed + 1, -1, 1);
  std::vector<float> v = test::random_floats(static_cast<size_t>(L * c.Hkv * D), seed + 2, -1, 1);
  test::expect_nontrivial(q);
  std::fill(k.begin() + (c.pos0 + c.T) * c.Hkv * D, k.end(), test::kPoison);
  std::fill(v.begin() + (c.pos0 + c.T) * c.Hkv * D, v.end(), test::kPoison);
  // out has a padded head stride (D + 1); the padding must stay poisoned.
  const int64_t oh = D + 1, ot = c.Hq * oh;
  std::vector<float> out(static_cast<size_t>(c.T * ot), test::kPoison);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D)) * 2.0f;  // sharper than default

  cpu::AttentionArgs a;
  a.out = out.data();
  a.out_t = ot;
  a.out_h = oh;
  a.q = q.data();
  a.q_t = c.Hq * D;
  a.q_h = D;
  a.k = k.data();
  a.k_t = c.Hkv * D;
  a.k_h = D;
  a.v = v.data();
  a.v_t = c.Hkv * D;
  a.v_h = D;
  a.T = c.T;
  a.Hq = c.Hq;
  a.Hkv = c.Hkv;
  a.D = D;
  a.pos0 = c.pos0;
  a.scale = scale;
  a.window = c.window;
  a.softcap = c.softcap;
  cpu::attention(a);

  const int64_t group = c.Hq / c.Hkv;
  for (int64_t t = 0; t < c.T; ++t) {
    for (int64_t h = 0; h < c.Hq; ++h) {
      const int64_t p = c.pos0 + t, hk = h / group;
      const int64_t first = c.window > 0 ? std::max<int64_t>(0, p - c.window + 1) : 0;
      std::vector<double> s;
      for (int64_t j = first; j <= p; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < D; ++d) {
          dot += static_cast<double>(q[static_cast<size_t>((t * c.Hq + h) * D + d)]) *
                 k[static_cast<size_t>((j * c.Hkv + hk) * D + d)];
        }
        double logit = dot * scale;
        if (c.softcap > 0) logit = c.softcap * std::tanh(logit / c.softcap);
        s.push_back(logit);
      }
      const double mx = *std::max_element(s.begin(), s.end());
      double sum = 0;
      for (double& e : s) sum += (e = std::exp(e - mx));
      for (int64_t d = 0; d < D; ++d) {
        double want = 0;
        for (int64_t j = first; j <= p; ++j) {
          want += s[static_cast<size_t>(j - first)] / sum *
                  v[static_cast<size_t>((j * c.Hkv + hk) * D + d)];
        }
        // Logits are f32 dot products of D terms, |q.k| * scale <= D * scale / 1 here, so their
        // error is below D * u * 2 * sqrt(D) ~ 1e-4 at D = 64 in the worst case and ~1e-6 in
        // practice; softmax weights move by about that relative amount, and the output is a
        // convex combination of |v| <= 1. 2e-5 absolute holds with a wide margin in practice
        // while any masking or head-mapping mistake moves outputs by ~1e-2.
        const float got = out[static_cast<size_t>(t * ot + h * oh + d)];
        ASSERT_NEAR(got, want, 2e-5) << name(c) << " t=" << t << " h=" << h << " d=" << d;
      }
      ASSERT_TRUE(std::isnan(out[static_cast<size_t>(t * ot + h * oh + D)])) << "wrote padding";
    }
  }
}

TEST(Attention, MatchesDoubleReferenceAcrossShapesAndOptions) {
  uint32_t seed = 1;
  int cases = 0;
  for (int64_t T : {1, 5, 17})
    for (int64_t pos0 : {0, 9})
      for (auto [hq, hkv] : {std::pair<int64_t, int64_t>{1, 1}, {4, 2}, {9, 3}})
        for (int64_t D : {64, 32})
          for (int64_t window : {0, 4})
            for (float softcap : {0.0f, 1.5f}) {
              run_case({T, pos0, hq, hkv, D, window, softcap}, seed++);
              if (HasFatalFailure()) return;
              ++cases;
            }
  EXPECT_EQ(cases, 144);
}

TEST(Attention, HeadDimsThatAreNotMultiplesOf8) {
  run_case({5, 3, 4, 2, 20, 0, 0.0f}, 77);
  run_case({3, 0, 2, 1, 7, 2, 0.0f}, 78);
  run_case({1, 30, 2, 2, 256, 0, 0.0f}, 79);
}

TEST(Attention, LongContextDecode) {
  // One query at position 1500 over 1501 keys, the decode shape; spreads over threads.
  run_case({1, 1500, 9, 3, 64, 0, 0.0f}, 80);
  run_case({1, 1500, 8, 1, 64, 512, 0.0f}, 81);
}

}  // namespace
}  // namespace llmk
