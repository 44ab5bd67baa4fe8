// cpu::topk_lse against a plain reference: every row sorted whole (value descending, id
// ascending, NaN above everything) and its log-sum-exp in long double, over the awkward cases of
// topk_cases.h; then the documented rules for ties, signed zeros and non-finite logits, one by
// one.
#include "kernels/cpu/topk.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/test_util.h"
#include "kernels/topk_cases.h"

namespace llmk {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

struct Ref {
  std::vector<int32_t> ids;  // [rows, k]
  std::vector<float> values;
  std::vector<float> lse;  // [rows]
};

// a before b in the order topk_lse documents; all NaNs equal and above +inf.
bool ref_before(float a, int32_t ia, float b, int32_t ib) {
  if (std::isnan(a) != std::isnan(b)) return std::isnan(a);
  if (!std::isnan(a) && a != b) return a > b;
  return ia < ib;
}

float ref_lse(const float* x, int64_t n) {
  bool nan = false, pos_inf = false;
  long double max = -INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    nan |= std::isnan(x[i]);
    pos_inf |= x[i] == kInf;
    if (!std::isnan(x[i])) max = std::max<long double>(max, x[i]);
  }
  if (nan) return NAN;
  if (pos_inf) return INFINITY;
  if (max == -INFINITY) return -INFINITY;
  long double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<long double>(x[i]) - max);
  return static_cast<float>(max + std::log(sum));
}

Ref reference(const std::vector<float>& x, int64_t rows, int64_t vocab, int64_t ld, int k) {
  Ref ref;
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x.data() + r * ld;
    for (int64_t i = 0; i < vocab; ++i) order[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    std::sort(order.begin(), order.end(),
              [&](int32_t a, int32_t b) { return ref_before(row[a], a, row[b], b); });
    for (int j = 0; j < k; ++j) {
      ref.ids.push_back(order[static_cast<size_t>(j)]);
      ref.values.push_back(row[order[static_cast<size_t>(j)]]);
    }
    ref.lse.push_back(ref_lse(row, vocab));
  }
  return ref;
}

struct Out {
  std::vector<int32_t> ids;
  std::vector<float> values, lse;
};

Out run(const std::vector<float>& x, int64_t rows, int64_t vocab, int64_t ld, int k) {
  Out o{std::vector<int32_t>(static_cast<size_t>(rows * k), -7),
        std::vector<float>(static_cast<size_t>(rows * k), test::kPoison),
        std::vector<float>(static_cast<size_t>(rows), test::kPoison)};
  cpu::topk_lse(o.ids.data(), o.values.data(), o.lse.data(), x.data(), rows, vocab, ld, k);
  return o;
}

// lse in double, rounded once to f32: within an ulp of the long double result; 1e-12 absolute
// for rows whose lse is near 0 (the sum's rounding is relative to log(sum), not to lse).
void expect_lse_near(float got, float want, const std::string& what) {
  if (std::isnan(want)) {
    EXPECT_TRUE(std::isnan(got)) << what << ": got " << got;
  } else if (std::isinf(want)) {
    EXPECT_EQ(got, want) << what;
  } else {
    EXPECT_NEAR(got, want, 2 * test::kU * std::abs(want) + 1e-12) << what;
  }
}

TEST(TopkLse, MatchesSortedReference) {
  uint32_t seed = 1;
  for (const test::TopkCase& c : test::topk_cases()) {
    const std::vector<float> x = test::topk_logits(c, seed++);
    if (c.fill == test::TopkFill::Uniform) {
      test::expect_nontrivial(x.data(), static_cast<size_t>(c.vocab));
    }
    const Ref ref = reference(x, c.rows, c.vocab, c.ld, c.k);
    const Out got = run(x, c.rows, c.vocab, c.ld, c.k);
    for (int64_t r = 0; r < c.rows; ++r) {
      const std::string what = c.label() + " row " + std::to_string(r);
      for (int64_t j = r * c.k; j < (r + 1) * c.k; ++j) {
        const auto jj = static_cast<size_t>(j);
        ASSERT_EQ(got.ids[jj], ref.ids[jj]) << what << " place " << j - r * c.k;
        ASSERT_EQ(std::bit_cast<uint32_t>(got.values[jj]), std::bit_cast<uint32_t>(ref.values[jj]))
            << what << " place " << j - r * c.k;
      }
      expect_lse_near(got.lse[static_cast<size_t>(r)], ref.lse[static_cast<size_t>(r)], what);
    }
  }
}

// One row of x; returns ids, values and lse for k.
Out run_row(const std::vector<float>& x, int k) {
  return run(x, 1, static_cast<int64_t>(x.size()), static_cast<int64_t>(x.size()), k);
}

TEST(TopkLse, TiesGoToTheLowestIds) {
  const Out o = run_row({1, 3, 3, 2, 3, 2}, 4);
  EXPECT_EQ(o.ids, (std::vector<int32_t>{1, 2, 4, 3}));
  EXPECT_EQ(o.values, (std::vector<float>{3, 3, 3, 2}));
}

TEST(TopkLse, SignedZerosAreEqual) {
  const Out o = run_row({-1.0f, 0.0f, -0.0f, -2.0f, -0.0f}, 3);
  EXPECT_EQ(o.ids, (std::vector<int32_t>{1, 2, 4}));
  EXPECT_FALSE(std::signbit(o.values[0]));  // the logits' own bits
  EXPECT_TRUE(std::signbit(o.values[1]));
}

TEST(TopkLse, NegativeInfinity) {
  // -inf adds nothing to lse: log(e^0 + e^1) with -inf around.
  const Out o = run_row({-kInf, 0.0f, -kInf, 1.0f, -kInf}, 3);
  EXPECT_EQ(o.ids, (std::vector<int32_t>{3, 1, 0}));
  EXPECT_EQ(o.values[2], -kInf);
  EXPECT_NEAR(o.lse[0], std::log(1.0 + std::exp(1.0)), 1e-6);
  // A row of -inf only: the first k ids, lse -inf.
  const Out all = run_row({-kInf, -kInf, -kInf}, 2);
  EXPECT_EQ(all.ids, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(all.values, (std::vector<float>{-kInf, -kInf}));
  EXPECT_EQ(all.lse[0], -kInf);
}

TEST(TopkLse, NaNAndPositiveInfinity) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // NaNs rank above +inf, among themselves by id; lse is NaN.
  const Out o = run_row({2.0f, nan, kInf, -nan, 5.0f}, 4);
  EXPECT_EQ(o.ids, (std::vector<int32_t>{1, 3, 2, 4}));
  EXPECT_TRUE(std::isnan(o.values[0]) && std::isnan(o.values[1]));
  EXPECT_TRUE(std::signbit(o.values[1]));
  EXPECT_TRUE(std::isnan(o.lse[0]));
  // +inf without NaN: lse +inf.
  const Out inf = run_row({2.0f, kInf, -kInf}, 1);
  EXPECT_EQ(inf.ids[0], 1);
  EXPECT_EQ(inf.lse[0], kInf);
}

TEST(TopkLse, LargeLogitsDoNotOverflow) {
  const Out o = run_row({1000.0f, 1000.0f, -1000.0f}, 1);
  EXPECT_EQ(o.ids[0], 0);
  EXPECT_NEAR(o.lse[0], 1000.0 + std::log(2.0), 1e-4);
}

}  // namespace
}  // namespace llmk
