// cpu::linear against a double-precision reference, for every weight dtype, both paths, and
// awkward sizes. The reference dequantises weights with cpu::dequantize_row (itself checked
// bit-exactly against the gguf package in dequant_test), so it shares no code with the fused
// path, and only the row dequantisation with the tiled one.
#include "kernels/cpu/matmul.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "core/thread_pool.h"
#include "kernels/cpu/block_decode.h"
#include "kernels/cpu/dequant.h"
#include "kernels/cpu/isa.h"
#include "kernels/test_util.h"

namespace llmk {
namespace {

using cpu::LinearPath;

struct Problem {
  DType t;
  int64_t M, N, K;
  bool bias;
  uint32_t seed;
  int64_t ldx, ldy;
  std::vector<uint8_t> w;
  std::vector<float> x, b, y;

  Problem(DType t_, int64_t M_, int64_t N_, int64_t K_, bool bias_, uint32_t seed_)
      : t(t_), M(M_), N(N_), K(K_), bias(bias_), seed(seed_), ldx(K_ + 3), ldy(N_ + 2) {
    w = test::random_weights(t, N, K, seed);
    x = test::random_floats(static_cast<size_t>(M * ldx), seed + 1);
    b = test::random_floats(static_cast<size_t>(N), seed + 2);
    y.assign(static_cast<size_t>(M * ldy), test::kPoison);
  }
  int64_t row_bytes() const { return bytes_for(t, K); }

  cpu::LinearArgs args() {
    cpu::LinearArgs a;
    a.y = y.data();
    a.ldy = ldy;
    a.x = x.data();
    a.ldx = ldx;
    a.w = w.data();
    a.wtype = t;
    a.w_row_bytes = row_bytes();
    a.bias = bias ? b.data() : nullptr;
    a.M = M;
    a.N = N;
    a.K = K;
    return a;
  }

  // Checks y against sum_k x[m,k] w[n,k] in double. Tolerance: an f32 dot product of K terms,
  // in any summation order, is within about K*u*sum|x_k w_k| of the exact value. The fused
  // path computes scale * sum(q x) + min * sum(x), whose terms can exceed |w| (a weight near
  // zero may be a large scale*q cancelling a large min), so the magnitude also counts
  // sum|x_k| * max|w| of the row; the bias add and the final rounding count as two more
  // operations (|bias| joins the magnitude). A factor 2 on top. A single wrong weight would be
  // off by ~sum|x w| / K, well above this for these K.
  void check(const std::string& what) {
    std::vector<float> wrow(static_cast<size_t>(K));
    for (int64_t n = 0; n < N; ++n) {
      cpu::dequantize_row(t, w.data() + n * row_bytes(), wrow.data(), K);
      test::expect_nontrivial(wrow);
      double wmax = 0;
      for (float v : wrow) wmax = std::max(wmax, std::fabs(static_cast<double>(v)));
      for (int64_t m = 0; m < M; ++m) {
        const float* xr = x.data() + m * ldx;
        double ref = bias ? b[static_cast<size_t>(n)] : 0.0, mag = std::fabs(ref);
        for (int64_t k = 0; k < K; ++k) {
          const double xw = static_cast<double>(xr[k]) * wrow[static_cast<size_t>(k)];
          ref += xw;
          mag += std::fabs(xw) + std::fabs(xr[k]) * wmax;
        }
        const double tol = 2.0 * static_cast<double>(K + 2) * test::kU * mag + 1e-30;
        const float got = y[static_cast<size_t>(m * ldy + n)];
        ASSERT_NEAR(got, ref, tol) << what << " y[" << m << ", " << n << "]";
      }
    }
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t n = N; n < ldy; ++n) {
        ASSERT_TRUE(std::isnan(y[static_cast<size_t>(m * ldy + n)])) << what << ": wrote padding";
      }
    }
  }
};

struct Shape3 {
  int64_t M, N, K;
};

std::vector<Shape3> shapes_for(DType t) {
  const int64_t bs = block_size(t);
  if (bs == 1) {
    return {{1, 1, 1},    {1, 3, 17},  {2, 17, 127}, {3, 5, 8},    {4, 33, 576},
            {5, 17, 127}, {7, 40, 64}, {17, 13, 33}, {1, 150, 96}, {33, 70, 40}};
  }
  if (bs == 32) {
    return {{1, 1, 32},  {1, 17, 288}, {2, 3, 96},  {3, 20, 576},  {4, 7, 320},
            {5, 17, 96}, {9, 31, 288}, {17, 6, 32}, {1, 150, 576}, {33, 70, 288}};
  }
  return {{1, 1, 256},  {1, 17, 512}, {2, 3, 768},   {4, 9, 256},
          {5, 13, 512}, {17, 7, 256}, {1, 150, 512}, {33, 70, 256}};
}

class LinearAllTypes : public ::testing::TestWithParam<DType> {};

TEST_P(LinearAllTypes, MatchesDoubleReferenceOnEveryPath) {
  const DType t = GetParam();
  uint32_t seed = 100;
  for (const Shape3& s : shapes_for(t)) {
    for (LinearPath path : {LinearPath::Fused, LinearPath::Tiled, LinearPath::Auto}) {
      const bool bias = (seed % 2) == 0;
      Problem p(t, s.M, s.N, s.K, bias, seed++);
      test::expect_nontrivial(p.x);
      cpu::linear(p.args(), path);
      p.check(std::string(dtype_name(t)) + " M=" + std::to_string(s.M) +
              " N=" + std::to_string(s.N) + " K=" + std::to_string(s.K) +
              " path=" + std::to_string(static_cast<int>(path)) + (bias ? " +bias" : ""));
      if (HasFatalFailure()) return;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, LinearAllTypes,
                         ::testing::Values(DType::F32, DType::F16, DType::BF16, DType::Q4_0,
                                           DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0,
                                           DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K,
                                           DType::Q6_K),
                         [](const auto& p) { return std::string(dtype_name(p.param)); });

// Each output is computed whole by one thread, so the thread count must not change any bit.
TEST(Linear, ResultDoesNotDependOnThreadCount) {
  for (DType t : {DType::Q4_K, DType::Q8_0, DType::F16}) {
    for (int64_t M : {1, 3, 12}) {
      Problem a(t, M, 211, 512, true, 7), b(t, M, 211, 512, true, 7);
      set_num_threads(1);
      cpu::linear(a.args());
      set_num_threads(5);
      cpu::linear(b.args());
      set_num_threads(0);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < a.N; ++n) {
          const size_t i = static_cast<size_t>(m * a.ldy + n);
          ASSERT_EQ(a.y[i], b.y[i]) << dtype_name(t) << " M=" << M << " (" << m << ", " << n << ")";
        }
    }
  }
}

TEST(Linear, EmptyDimensions) {
  Problem p(DType::Q8_0, 2, 3, 32, true, 3);
  cpu::LinearArgs a = p.args();
  a.K = 0;  // y = bias
  cpu::linear(a);
  for (int64_t m = 0; m < 2; ++m)
    for (int64_t n = 0; n < 3; ++n) EXPECT_EQ(p.y[static_cast<size_t>(m * p.ldy + n)], p.b[n]);
  a.M = 0;
  EXPECT_NO_THROW(cpu::linear(a));
}

TEST(Linear, RejectsUnsupportedTypesAndPartialBlocks) {
  Problem p(DType::Q8_0, 1, 2, 64, false, 4);
  cpu::LinearArgs a = p.args();
  a.wtype = DType::Q8_K;
  EXPECT_THROW(cpu::linear(a), Error);
  a = p.args();
  a.K = 48;
  EXPECT_THROW(cpu::linear(a), Error);
  EXPECT_FALSE(cpu::linear_supports(DType::I32));
}

TEST(Linear, AutoPicksFusedForDecodeAndTiledForPrefill) {
  cpu::LinearArgs a;
  a.M = 1;
  a.wtype = DType::Q8_0;
  if (cpu::isa() != cpu::Isa::Base) {  // the baseline build has no fused path
    EXPECT_EQ(cpu::linear_choose_path(a), LinearPath::Fused);
    cpu::set_int8_activations(true);
    EXPECT_EQ(cpu::linear_choose_path(a), LinearPath::Int8);
    a.wtype = DType::F16;  // no 8-bit path for it: the f32 one
    EXPECT_EQ(cpu::linear_choose_path(a), LinearPath::Fused);
    cpu::set_int8_activations(false);
  }
  a.M = 64;
  EXPECT_EQ(cpu::linear_choose_path(a), LinearPath::Tiled);
}

// LinearPath::Int8 (x quantised per 32 to 8 bits, integer dots against every block type)
// against the f32 fused path on the same operands. Each output is the dot of the weights with
// the quantised x (minima times the quantised x's sums), and x's quantisation moves each x_k by at
// most d/2 (d = max |x| / 127 of its block of 32): so each output moves by at most
// sum_k d_k / 2 |w_k|; the two paths' f32 roundings add the double reference's bound
// (Problem::check, with the minima's terms) on each side. A wrong block, scale or sign is off by
// far more (each such change to the kernels fails here). Awkward shapes, bias, accumulation.
TEST(Linear, Int8ActivationsStayWithinTheirQuantisationBound) {
  if (cpu::isa() == cpu::Isa::Base) {
    EXPECT_FALSE(cpu::linear_int8_supports(DType::Q8_0));
    GTEST_SKIP() << "the baseline build has no 8-bit path";
  }
  EXPECT_FALSE(cpu::linear_int8_supports(DType::F16));
  uint32_t seed = 700;
  for (DType t : {DType::Q8_0, DType::Q4_1, DType::Q4_0, DType::Q5_0, DType::Q5_1, DType::Q2_K,
                  DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
    ASSERT_TRUE(cpu::linear_int8_supports(t)) << dtype_name(t);
    const int64_t be = block_size(t), bb = bytes_for(t, be);
    for (const Shape3& s : shapes_for(t)) {
      for (bool accumulate : {false, true}) {
        const bool bias = (seed % 2) == 0;
        Problem f(t, s.M, s.N, s.K, bias, seed), q(t, s.M, s.N, s.K, bias, seed);
        ++seed;
        for (size_t i = 0; i < f.y.size(); ++i) {
          f.y[i] = q.y[i] = 0.25f * static_cast<float>(i % 7);
        }
        cpu::LinearArgs fa = f.args(), qa = q.args();
        fa.accumulate = qa.accumulate = accumulate;
        cpu::linear(fa, LinearPath::Fused);
        cpu::linear(qa, LinearPath::Int8);
        const std::string what = std::string(dtype_name(t)) + " M=" + std::to_string(s.M) +
                                 " N=" + std::to_string(s.N) + " K=" + std::to_string(s.K) +
                                 (bias ? " +bias" : "") + (accumulate ? " accumulate" : "");
        // Per weight: |w| and |min| (its minimum, from the codec's scalar decode).
        std::vector<float> wa(static_cast<size_t>(s.K)), mn(static_cast<size_t>(s.K));
        for (int64_t n = 0; n < s.N; ++n) {
          const uint8_t* row = f.w.data() + n * f.row_bytes();
          cpu::dequantize_row(t, row, wa.data(), s.K);
          for (int64_t b = 0; b < s.K / be; ++b) {
            std::vector<int8_t> qv(static_cast<size_t>(be));
            std::vector<float> sc(static_cast<size_t>(be / 16)), mi(sc.size(), 0.0f);
            cpu::detail::visit_codec(t, [&](auto codec) {
              decltype(codec)::decode_scalar(row + b * bb, qv.data(), sc.data(), mi.data());
            });
            for (int64_t j = 0; j < be; ++j) {
              mn[static_cast<size_t>(b * be + j)] = std::fabs(mi[static_cast<size_t>(j / 16)]);
            }
          }
          for (int64_t m = 0; m < s.M; ++m) {
            const float* xr = f.x.data() + m * f.ldx;
            double bound = 0, mag = bias ? std::fabs(f.b[static_cast<size_t>(n)]) : 0.0;
            for (int64_t b0 = 0; b0 < s.K; b0 += 32) {
              double amax = 0, qsum = 0;
              for (int64_t k = b0; k < b0 + 32; ++k) {
                const double x = std::fabs(xr[k]);
                amax = std::max(amax, x);
                const double w = std::fabs(wa[static_cast<size_t>(k)]);
                qsum += w;
                mag += x * (w + 2 * mn[static_cast<size_t>(k)]);
              }
              bound += amax / 127.0 / 2.0 * qsum;
            }
            const size_t at = static_cast<size_t>(m * f.ldy + n);
            mag += std::fabs(f.y[at]);
            const double tol = bound + 4.0 * static_cast<double>(s.K + 3) * test::kU * mag;
            ASSERT_NEAR(q.y[at], f.y[at], tol) << what << " y[" << m << ", " << n << "]";
          }
        }
      }
    }
  }
  cpu::LinearArgs a = Problem(DType::F16, 1, 2, 64, false, 5).args();
  EXPECT_THROW(cpu::linear(a, LinearPath::Int8), Error);
}

}  // namespace
}  // namespace llmk
