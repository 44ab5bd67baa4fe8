// ops::argmax on the CPU: the first maximum of each row against a plain scan, over awkward
// widths, strided rows and outputs, ties, infinities and NaN; argument errors.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "ops/ops.h"
#include "ops/ops_test_util.h"

namespace llmk {
namespace {

using test::elem;
using test::expect_error;
using test::random_tensor;

// The index of the first largest element, NaN counted as -inf.
int32_t first_max(const Tensor& x, int64_t r) {
  int32_t best = 0;
  double best_v = -INFINITY;
  for (int64_t i = 0; i < x.dim(1); ++i) {
    const float v = elem(x, {r, i});
    const double key = std::isnan(v) ? -INFINITY : v;
    if (i == 0 || key > best_v) {
      best_v = key;
      best = static_cast<int32_t>(i);
    }
  }
  return best;
}

TEST(OpsArgmax, FirstMaximumOfEachRow) {
  uint32_t seed = 7;
  for (int64_t M : {1, 3, 17}) {
    for (int64_t N : {1, 3, 17, 127, 1000, 4099}) {
      // x rows strided (a slice of a wider buffer); out every other element of an i32 buffer.
      Tensor xbuf = random_tensor({M, N + 2}, seed++, -5, 5);
      Tensor x = xbuf.slice(1, 1, N + 1);
      // A tie for the maximum in some rows: the lower index must win.
      for (int64_t r = 0; r < M; r += 2) {
        if (N >= 3) elem(x, {r, N - 1}) = elem(x, {r, N / 3}) = 6.0f;
      }
      Tensor obuf = Tensor::empty({M, 2}, DType::I32);
      std::fill(obuf.data<int32_t>(), obuf.data<int32_t>() + 2 * M, -7);
      Tensor out = obuf.select(1, 0);
      ops::argmax(out, x);
      for (int64_t r = 0; r < M; ++r) {
        ASSERT_EQ(elem<int32_t>(out, {r}), first_max(x, r)) << "M=" << M << " N=" << N;
        if (r % 2 == 0 && N >= 3) {
          EXPECT_EQ(elem<int32_t>(out, {r}), N / 3);
        }
        EXPECT_EQ(elem<int32_t>(obuf, {r, 1}), -7) << "wrote between outputs";
      }
    }
  }
}

TEST(OpsArgmax, InfinitiesAndNaN) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<std::vector<float>> rows = {
      {-inf, -inf, -inf, -inf},  // all equal: the first
      {nan, -3.0f, 2.0f, nan},   // NaN ignored
      {nan, nan, nan, nan},      // NaN counts as -inf: the first
      {1.0f, inf, 3.0f, inf},    // +inf wins, first of two
      {nan, -inf, -inf, -5.0f},  // NaN ties -inf at index 0, -5 is larger
  };
  const std::vector<int32_t> want = {0, 2, 0, 1, 3};
  Tensor x = Tensor::empty({5, 4}, DType::F32);
  for (int64_t r = 0; r < 5; ++r)
    for (int64_t i = 0; i < 4; ++i) elem(x, {r, i}) = rows[r][i];
  Tensor out = Tensor::empty({5}, DType::I32);
  ops::argmax(out, x);
  for (int64_t r = 0; r < 5; ++r) EXPECT_EQ(out.data<int32_t>()[r], want[r]) << "row " << r;
}

TEST(OpsArgmax, ArgumentErrors) {
  Tensor x = random_tensor({3, 10}, 1);
  Tensor out = Tensor::empty({3}, DType::I32);
  Tensor out_bad = Tensor::empty({4}, DType::I32);
  expect_error([&] { ops::argmax(out_bad, x); }, {"ops::argmax", "out", "[3]"});
  Tensor out_f = Tensor::empty({3}, DType::F32);
  expect_error([&] { ops::argmax(out_f, x); }, {"ops::argmax", "out", "i32"});
  Tensor x1 = random_tensor({10}, 1);
  expect_error([&] { ops::argmax(out, x1); }, {"ops::argmax", "x", "2 dimensions"});
  Tensor x0 = random_tensor({3, 0}, 1);
  expect_error([&] { ops::argmax(out, x0); }, {"ops::argmax", "1 to 2^31 - 1"});
  Tensor x16 = Tensor::zeros({3, 10}, DType::BF16);
  expect_error([&] { ops::argmax(out, x16); }, {"ops::argmax", "x", "f32"});
  Tensor xt = random_tensor({10, 3}, 1).transpose(0, 1);
  expect_error([&] { ops::argmax(out, xt); }, {"ops::argmax", "contiguous last dimension"});
}

TEST(OpsDispatch, NewOpsRejectGpuTensorsWithoutCuda) {
#ifdef LLMK_HAS_CUDA
  GTEST_SKIP() << "built with CUDA: GPU tensors are accepted (tests/gpu covers them)";
#else
  float dummy[64];
  Tensor g = Tensor::borrow(dummy, {4, 16}, DType::F32, Device::CUDA);
  Tensor c = random_tensor({4, 16}, 1), w = random_tensor({16}, 2);
  Tensor o = test::poisoned({4, 16});
  Tensor ids = Tensor::empty({4}, DType::I32);
  expect_error([&] { ops::add_rms_norm(c, g, o, w, 1e-6f); },
               {"ops::add_rms_norm", "delta", "not built with CUDA"});
  expect_error([&] { ops::argmax(ids, g); }, {"ops::argmax", "x", "not built with CUDA"});
  Tensor g3 = Tensor::borrow(dummy, {4, 1, 16}, DType::F32, Device::CUDA);
  Tensor c3 = random_tensor({4, 1, 16}, 3);
  expect_error([&] { ops::kv_append(c3, c3, g3, c3, ids); },
               {"ops::kv_append", "k", "not built with CUDA"});
#endif
}

}  // namespace
}  // namespace llmk

namespace llmk {
namespace {

// One row of logits repeated `rows` times, each with its own seed, drawn by sample_gumbel.
std::vector<int32_t> draws(const std::vector<float>& row, int64_t rows, float temperature,
                           float min_p, uint64_t seed0) {
  const auto N = static_cast<int64_t>(row.size());
  Tensor x = Tensor::empty({rows, N}, DType::F32);
  Tensor t = Tensor::empty({rows}, DType::F32), p = Tensor::empty({rows}, DType::F32);
  Tensor s = Tensor::empty({rows}, DType::I64), out = Tensor::empty({rows}, DType::I32);
  for (int64_t r = 0; r < rows; ++r) {
    std::copy(row.begin(), row.end(), x.data<float>() + r * N);
    t.data<float>()[r] = temperature;
    p.data<float>()[r] = min_p;
    s.data<int64_t>()[r] = static_cast<int64_t>(seed0 + static_cast<uint64_t>(r) * 7919);
  }
  ops::sample_gumbel(out, x, t, p, s);
  return {out.data<int32_t>(), out.data<int32_t>() + rows};
}

// The draws follow softmax(x / T) over the tokens within min_p of the most likely (each count
// within 4.5 standard deviations of its expectation over 40,000 draws); -inf is never drawn; the
// same seeds give the same draws.
TEST(OpsSampleGumbel, DrawsFollowTheSoftmaxAtTheTemperatureAboveMinP) {
  const std::vector<float> row = {1.0f, 2.5f, -INFINITY, 0.0f, 2.0f, -1.0f, 3.0f, 0.5f};
  constexpr int64_t kDraws = 40000;
  for (float temperature : {0.5f, 1.0f, 2.0f}) {
    for (float min_p : {0.0f, 0.2f}) {
      const std::vector<int32_t> got = draws(row, kDraws, temperature, min_p, 11);
      std::vector<double> p(row.size(), 0.0);
      double sum = 0;
      for (size_t i = 0; i < row.size(); ++i) {
        p[i] = std::exp((row[i] - 3.0) / temperature);  // 0 for -inf
        if (p[i] < min_p * 1.0) p[i] = 0;               // the top token's weight is exp(0) = 1
        sum += p[i];
      }
      std::vector<int64_t> count(row.size(), 0);
      for (const int32_t g : got) {
        ASSERT_GE(g, 0);
        ASSERT_LT(g, static_cast<int32_t>(row.size()));
        ++count[static_cast<size_t>(g)];
      }
      for (size_t i = 0; i < row.size(); ++i) {
        const double want = kDraws * p[i] / sum;
        const double sd = std::sqrt(want * (1 - p[i] / sum));
        if (p[i] == 0) {
          EXPECT_EQ(count[i], 0) << "T " << temperature << " min_p " << min_p << " token " << i;
        } else {
          EXPECT_NEAR(static_cast<double>(count[i]), want, 4.5 * sd + 1)
              << "T " << temperature << " min_p " << min_p << " token " << i;
        }
      }
      EXPECT_EQ(draws(row, 50, temperature, min_p, 11),
                std::vector<int32_t>(got.begin(), got.begin() + 50));
    }
  }
  // A row with nothing finite gives its argmax (the first element).
  EXPECT_EQ(draws({-INFINITY, -INFINITY}, 3, 1.0f, 0.0f, 1), (std::vector<int32_t>{0, 0, 0}));
}

TEST(OpsSampleGumbel, ArgumentErrors) {
  Tensor x = Tensor::empty({2, 5}, DType::F32);
  std::fill(x.data<float>(), x.data<float>() + 10, 0.0f);
  Tensor t = Tensor::empty({2}, DType::F32), p = Tensor::empty({2}, DType::F32);
  Tensor s = Tensor::empty({2}, DType::I64), out = Tensor::empty({2}, DType::I32);
  t.data<float>()[0] = t.data<float>()[1] = 1.0f;
  p.data<float>()[0] = p.data<float>()[1] = 0.0f;
  s.data<int64_t>()[0] = s.data<int64_t>()[1] = 3;
  EXPECT_NO_THROW(ops::sample_gumbel(out, x, t, p, s));
  t.data<float>()[1] = 0.0f;
  expect_error([&] { ops::sample_gumbel(out, x, t, p, s); },
               {"row 1: temperature 0 must be > 0 and min_p 0 in [0, 1)"});
  t.data<float>()[1] = 1.0f;
  Tensor wrong = Tensor::empty({3}, DType::F32);
  expect_error([&] { ops::sample_gumbel(out, x, wrong, p, s); }, {"temperature"});
  Tensor s32 = Tensor::empty({2}, DType::I32);
  expect_error([&] { ops::sample_gumbel(out, x, t, p, s32); }, {"seed"});
}

TEST(OpsApplyPenalties, ArgumentErrors) {
  Tensor x = Tensor::empty({2, 5}, DType::F32);
  std::fill(x.data<float>(), x.data<float>() + 10, 1.0f);
  std::vector<int32_t> at = {1, 4, 0, 0};
  std::vector<float> by = {2.0f, 0.5f, 1.0f, 0.25f};
  ops::apply_penalties(x, Tensor::borrow(at.data(), {2, 2}, DType::I32),
                       Tensor::borrow(by.data(), {2, 2}, DType::F32));
  EXPECT_EQ(elem(x, {1, 4}), 0.0f);   // 1 / 2 - 0.5
  EXPECT_EQ(elem(x, {0, 0}), 0.75f);  // 1 / 1 - 0.25
  EXPECT_EQ(elem(x, {0, 1}), 1.0f);
  at = {2, 0};
  expect_error(
      [&] {
        ops::apply_penalties(x, Tensor::borrow(at.data(), {1, 2}, DType::I32),
                             Tensor::borrow(by.data(), {1, 2}, DType::F32));
      },
      {"entry 0 is at (2, 0), outside logits"});
  expect_error(
      [&] {
        ops::apply_penalties(x, Tensor::borrow(at.data(), {1, 2}, DType::I32),
                             Tensor::borrow(by.data(), {2, 2}, DType::F32));
      },
      {"by"});
}

}  // namespace
}  // namespace llmk
