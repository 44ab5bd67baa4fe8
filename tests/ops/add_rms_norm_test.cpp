// ops::add_rms_norm on the CPU: the residual sum lands in x exactly as f32 addition gives it, and
// out is the RMS norm of that sum, against a double reference; strided rows, no delta, aliasing
// and argument errors.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ops/ops.h"
#include "ops/ops_test_util.h"

namespace llmk {
namespace {

using test::elem;
using test::expect_error;
using test::poisoned;
using test::random_tensor;

// Double reference of rms_norm over row t of x (already holding the sum).
double ref_norm(const Tensor& x, const Tensor& w, int64_t t, int64_t i, float eps, bool add_one) {
  const int64_t D = x.dim(1);
  double ss = 0;
  for (int64_t k = 0; k < D; ++k) ss += static_cast<double>(elem(x, {t, k})) * elem(x, {t, k});
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(D) + eps);
  const double wi = elem(w, {i});
  return elem(x, {t, i}) * inv * (add_one ? 1.0 + wi : wi);
}

TEST(OpsAddRmsNorm, MatchesDoubleReferenceOnStridedRows) {
  uint32_t seed = 100;
  for (int64_t T : {1, 3, 17}) {
    for (int64_t D : {1, 3, 17, 127, 576}) {
      for (bool add_one : {false, true}) {
        for (bool with_delta : {true, false}) {
          // x, delta, out are column slices of wider buffers: their padding must stay as it was.
          Tensor xbuf = random_tensor({T, D + 3}, seed++, -3, 3);
          Tensor dbuf = random_tensor({T, D + 1}, seed++, -3, 3);
          Tensor obuf = poisoned({T, D + 5});
          Tensor x = xbuf.slice(1, 1, D + 1), delta = dbuf.slice(1, 0, D);
          Tensor out = obuf.slice(1, 2, D + 2);
          Tensor w = random_tensor({D}, seed++, -2, 2);
          test::expect_nontrivial(x.contiguous().data<float>(), static_cast<size_t>(T * D));
          const Tensor x0 = x.contiguous(), xbuf0 = xbuf.contiguous();
          const float eps = 1e-5f;
          ops::add_rms_norm(x, with_delta ? delta : Tensor(), out, w, eps, add_one);
          for (int64_t t = 0; t < T; ++t) {
            for (int64_t i = 0; i < D; ++i) {
              const float want_x =
                  with_delta ? elem(x0, {t, i}) + elem(delta, {t, i}) : elem(x0, {t, i});
              ASSERT_EQ(elem(x, {t, i}), want_x) << "x at " << t << "," << i;
              const double ref = ref_norm(x, w, t, i, eps, add_one);
              // As the rms_norm kernel test: four f32 roundings of relative size u.
              ASSERT_NEAR(elem(out, {t, i}), ref, 4 * test::kU * std::fabs(ref) + 1e-30)
                  << "T=" << T << " D=" << D << " add_one=" << add_one << " delta=" << with_delta
                  << " at " << t << "," << i;
            }
            EXPECT_TRUE(std::isnan(elem(obuf, {t, 0})) && std::isnan(elem(obuf, {t, 1})) &&
                        std::isnan(elem(obuf, {t, D + 2})))
                << "out padding written";
            for (int64_t c : {int64_t{0}, D + 1, D + 2}) {
              EXPECT_EQ(elem(xbuf, {t, c}), elem(xbuf0, {t, c})) << "x padding written";
            }
          }
        }
      }
    }
  }
}

TEST(OpsAddRmsNorm, SameAsSeparateAddAndRmsNorm) {
  Tensor x = random_tensor({5, 64}, 1, -2, 2), delta = random_tensor({5, 64}, 2, -2, 2);
  Tensor w = random_tensor({64}, 3);
  Tensor x2 = x.contiguous();
  Tensor out = poisoned({5, 64}), out2 = poisoned({5, 64});
  ops::add_rms_norm(x, delta, out, w, 1e-6f, true);
  ops::add(x2, x2, delta);
  ops::rms_norm(out2, x2, w, 1e-6f, true);
  for (int64_t i = 0; i < 5 * 64; ++i) {
    ASSERT_EQ(x.data<float>()[i], x2.data<float>()[i]);
    ASSERT_EQ(out.data<float>()[i], out2.data<float>()[i]);
  }
}

TEST(OpsAddRmsNorm, DeltaAliasingXDoublesIt) {
  Tensor x = random_tensor({3, 16}, 4);
  const Tensor x0 = x.contiguous();
  Tensor w = random_tensor({16}, 5);
  Tensor out = poisoned({3, 16});
  ops::add_rms_norm(x, x, out, w, 1e-6f);
  for (int64_t i = 0; i < 48; ++i) EXPECT_EQ(x.data<float>()[i], 2 * x0.data<float>()[i]);
}

TEST(OpsAddRmsNorm, ArgumentErrors) {
  Tensor x = random_tensor({2, 16}, 1), delta = random_tensor({2, 16}, 2);
  Tensor w = random_tensor({16}, 3);
  Tensor out = poisoned({2, 16});
  expect_error([&] { ops::add_rms_norm(x, delta, x, w, 1e-6f); },
               {"ops::add_rms_norm", "out", "overlaps", "x"});
  expect_error([&] { ops::add_rms_norm(x, delta, delta, w, 1e-6f); },
               {"ops::add_rms_norm", "out", "overlaps", "delta"});
  Tensor d_bad = random_tensor({2, 15}, 2);
  expect_error([&] { ops::add_rms_norm(x, d_bad, out, w, 1e-6f); },
               {"ops::add_rms_norm", "delta", "[2, 16]"});
  Tensor w_bad = random_tensor({15}, 3);
  expect_error([&] { ops::add_rms_norm(x, delta, out, w_bad, 1e-6f); },
               {"ops::add_rms_norm", "w", "[16]"});
  Tensor x3 = random_tensor({2, 1, 16}, 1);
  expect_error([&] { ops::add_rms_norm(x3, delta, out, w, 1e-6f); },
               {"ops::add_rms_norm", "x", "2 dimensions"});
  Tensor d16 = Tensor::zeros({2, 16}, DType::BF16);
  expect_error([&] { ops::add_rms_norm(x, d16, out, w, 1e-6f); },
               {"ops::add_rms_norm", "delta", "f32"});
  Tensor out_bad = poisoned({2, 17});
  expect_error([&] { ops::add_rms_norm(x, delta, out_bad, w, 1e-6f); },
               {"ops::add_rms_norm", "out"});
  expect_error([&] { ops::add_rms_norm(x, delta, out, w, -1.0f); }, {"eps = -1"});
  Tensor buf = random_tensor({40}, 3);
  Tensor a = buf.slice(0, 0, 32).view({2, 16}), b = buf.slice(0, 8, 40).view({2, 16});
  expect_error([&] { ops::add_rms_norm(a, b, out, w, 1e-6f); },
               {"ops::add_rms_norm", "partially overlaps"});
}

}  // namespace
}  // namespace llmk
