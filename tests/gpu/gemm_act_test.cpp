// cuda::gemm_act (llmk's own Hopper GEMM with the activation in its epilogue) against a float64
// product of the same bf16 inputs.
//
// Each output is the fp32 sum rounded once to bf16 after the activation, so with u = 2^-8:
//   |y - act(ref)| <= u |act(ref)| + 1e-4 max|ref|   and the same for z against ref
// (one rounding, plus the fp32 accumulation's error in another order, far below u at these K).
// Outputs sit in a poisoned buffer with a poisoned tail, so an element never written, or written
// past the end, fails.
#include "kernels/cuda/gemm/gemm_act.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "core/cuda/device.h"
#include "core/cuda/stream.h"
#include "core/half.h"
#include "core/tensor.h"
#include "ops_gpu_util.h"

namespace llmk {
namespace {

using cpu::grad::Act;
using gpu_test::poisoned_cuda;
using gpu_test::random_host;

class GemmAct : public ::testing::Test {
 protected:
  void SetUp() override {
    cuda::init();
    if (cuda::device_info().compute_capability() != 90) {
      GTEST_SKIP() << "gemm_act runs on sm_90 only; this device is sm_"
                   << cuda::device_info().compute_capability();
    }
  }
};

double act_ref(double v, Act act) {
  switch (act) {
    case Act::SiLU:
      return v / (1.0 + std::exp(-v));
    case Act::GeluTanh:
      return 0.5 * v * (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
    case Act::GeluErf:
      return 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0)));
    case Act::None:
      return v;
  }
  return v;
}

const char* act_name(Act act) {
  switch (act) {
    case Act::SiLU:
      return "silu";
    case Act::GeluTanh:
      return "gelu_tanh";
    case Act::GeluErf:
      return "gelu";
    case Act::None:
      return "none";
  }
  return "?";
}

float bf16_at(const Tensor& t, int64_t i) { return bf16_to_float(t.data<const uint16_t>()[i]); }

// One problem: every activation, with and without bias and z. Rows checked: all of them up to
// 600, else every 13th and the last 130 (the ragged last tile).
void check_problem(int64_t M, int64_t N, int64_t K, uint32_t seed) {
  const Tensor x = random_host({M, K}, DType::BF16, seed, -2.0f, 2.0f);
  const float ws = 2.0f / std::sqrt(static_cast<float>(K));  // pre-activations of order 1-3
  const Tensor w = random_host({N, K}, DType::BF16, seed + 1, -ws, ws);
  const Tensor b = random_host({N}, DType::BF16, seed + 2, -1.0f, 1.0f);
  const Tensor xd = x.to(Device::CUDA), wd = w.to(Device::CUDA), bd = b.to(Device::CUDA);
  std::vector<int64_t> rows;
  for (int64_t m = 0; m < M; ++m) {
    if (M <= 600 || m % 13 == 0 || m >= M - 130) rows.push_back(m);
  }
  // The float64 product of the checked rows, without bias.
  std::vector<double> ref(rows.size() * N);
  double ref_max = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    for (int64_t n = 0; n < N; ++n) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) {
        s += static_cast<double>(bf16_at(x, rows[i] * K + k)) * bf16_at(w, n * K + k);
      }
      ref[i * N + n] = s;
      ref_max = std::max(ref_max, std::abs(s) + 1.0);
    }
  }
  constexpr int64_t kTail = 64;  // poisoned elements past the end of y and z
  for (Act act : {Act::None, Act::SiLU, Act::GeluTanh, Act::GeluErf}) {
    for (bool bias : {false, true}) {
      for (bool with_z : {false, true}) {
        const std::string what =
            fmt::format("M={} N={} K={} act {} bias {} z {}", M, N, K, act_name(act), bias, with_z);
        Tensor y = poisoned_cuda({M * N + kTail}, DType::BF16);
        Tensor z = poisoned_cuda({M * N + kTail}, DType::BF16);
        cuda::GemmActArgs a{.y = y.data(),
                            .z = with_z ? z.data() : nullptr,
                            .x = xd.data(),
                            .w = wd.data(),
                            .bias = bias ? bd.data() : nullptr,
                            .M = M,
                            .N = N,
                            .K = K,
                            .act = act};
        ASSERT_TRUE(cuda::gemm_act(a)) << what;
        const Tensor yh = y.to(Device::CPU), zh = z.to(Device::CPU);
        int64_t bad = 0, shown = 0;
        double worst = 0;
        auto check = [&](const Tensor& t, int64_t at, double want, const char* which) {
          const double got = bf16_at(t, at);
          const double err = std::abs(got - want), lim = std::abs(want) / 256 + 1e-4 * ref_max;
          worst = std::max(worst, err / lim);
          if (!(err <= lim)) {  // NaN (poison) fails too
            ++bad;
            if (shown++ < 5) {
              ADD_FAILURE() << what << ": " << which << "[" << at / N << ", " << at % N
                            << "] = " << got << ", want " << want;
            }
          }
        };
        for (size_t i = 0; i < rows.size(); ++i) {
          for (int64_t n = 0; n < N; ++n) {
            const double pre = ref[i * N + n] + (bias ? bf16_at(b, n) : 0.0);
            const int64_t at = rows[i] * N + n;
            check(yh, at, act_ref(pre, act), "y");
            if (with_z) check(zh, at, pre, "z");
          }
        }
        for (int64_t i = M * N; i < M * N + kTail; ++i) {
          EXPECT_EQ(yh.data<const uint16_t>()[i], 0xFFFF) << what << ": y written past its end";
          EXPECT_EQ(zh.data<const uint16_t>()[i], 0xFFFF) << what << ": z written past its end";
        }
        if (!with_z) {
          EXPECT_EQ(gpu_test::unpoisoned(zh), 0) << what << ": z written though not asked for";
        }
        EXPECT_EQ(bad, 0) << what << " (worst error " << worst << " of the limit)";
      }
    }
  }
  std::printf("  M=%-5lld N=%-5lld K=%-5lld checked %zu rows\n", static_cast<long long>(M),
              static_cast<long long>(N), static_cast<long long>(K), rows.size());
}

TEST_F(GemmAct, MatchesFloat64AtAwkwardShapes) {
  // One row; rows and columns short of a tile; K short of a step and not a multiple of 64; a
  // product with a ragged last tile in every dimension on the narrow tiles (few tiles) and on
  // the wide ones (enough tiles for every SM twice over).
  const int64_t shapes[][3] = {{1, 8, 8},        {7, 136, 72},    {128, 264, 1000},
                               {300, 1000, 520}, {129, 4104, 64}, {4100, 4104, 136}};
  uint32_t seed = 1;
  for (const auto& s : shapes) check_problem(s[0], s[1], s[2], seed += 10);
  cuda::synchronize();
}

TEST_F(GemmAct, DeclinesOperandsItDoesNotTake) {
  const Tensor x = poisoned_cuda({64, 72}, DType::BF16), w = poisoned_cuda({40, 72}, DType::BF16);
  Tensor y = poisoned_cuda({64 * 40 + 8}, DType::BF16);
  cuda::GemmActArgs a{.y = y.data(), .x = x.data(), .w = w.data(), .M = 64, .N = 40, .K = 72};
  cuda::GemmActArgs odd_n = a;
  odd_n.N = 36 + 1;
  EXPECT_FALSE(cuda::gemm_act(odd_n));
  cuda::GemmActArgs odd_k = a;
  odd_k.K = 70;
  EXPECT_FALSE(cuda::gemm_act(odd_k));
  cuda::GemmActArgs misaligned = a;
  misaligned.y = static_cast<uint16_t*>(y.data()) + 1;
  EXPECT_FALSE(cuda::gemm_act(misaligned));
  cuda::GemmActArgs empty = a;
  empty.M = 0;
  EXPECT_FALSE(cuda::gemm_act(empty));
  cuda::set_gemm_act(false);
  EXPECT_FALSE(cuda::gemm_act(a));
  cuda::set_gemm_act(true);
  EXPECT_TRUE(cuda::gemm_act(a));
  cuda::synchronize();
}

}  // namespace
}  // namespace llmk
