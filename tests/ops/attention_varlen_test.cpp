// ops::attention_varlen on the CPU against a direct float64 evaluation written here from the
// definition (softmax over each query's visible keys: bottom-right causal, window, softcap,
// GQA), on fresh random inputs; outputs and LSE poisoned first. Also the argument checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "ops/ops.h"
#include "ops/ops_test_util.h"

namespace llmk {
namespace {

using test::expect_error;
using test::poisoned;
using test::random_tensor;

Tensor i32(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::I32);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

struct Case {
  std::vector<std::pair<int, int>> seqs;
  int64_t Hq, Hkv, D;
  bool causal = true;
  int window = 0;
  float softcap = 0.0f;
  float scale = 0.0f;
};

void run_case(const Case& c, uint32_t seed) {
  std::vector<int32_t> cq{0}, ck{0};
  for (const auto& [nq, nk] : c.seqs) {
    cq.push_back(cq.back() + nq);
    ck.push_back(ck.back() + nk);
  }
  const int64_t Tq = cq.back(), Tk = ck.back() + 3, D = c.D;  // 3 unused k rows
  const Tensor q = random_tensor({Tq, c.Hq, D}, seed, -2, 2);
  const Tensor k = random_tensor({Tk, c.Hkv, D}, seed + 1);
  const Tensor v = random_tensor({Tk, c.Hkv, D}, seed + 2);
  Tensor out = poisoned({Tq, c.Hq, D});
  Tensor lse = poisoned({c.Hq, Tq});
  ops::AttentionVarlenParams p;
  p.causal = c.causal;
  p.window = c.window;
  p.softcap = c.softcap;
  p.scale = c.scale;
  ops::reset_attention_stats();
  ops::attention_varlen(out, q, k, v, i32(cq), i32(ck), p, &lse);
  EXPECT_EQ(ops::attention_stats().cpu, 1u) << "one CPU call counted";
  EXPECT_EQ(ops::attention_stats().prefill, 0u);

  const double scale = c.scale != 0.0f ? c.scale : 1.0 / std::sqrt(static_cast<double>(D));
  const int64_t group = c.Hq / c.Hkv;
  double max_err = 0, max_lse_err = 0;
  for (size_t b = 0; b + 1 < cq.size(); ++b) {
    const int64_t nq = cq[b + 1] - cq[b], nk = ck[b + 1] - ck[b];
    for (int64_t i = 0; i < nq; ++i) {
      const int64_t t = cq[b] + i, pos = i + nk - nq;
      for (int64_t h = 0; h < c.Hq; ++h) {
        std::vector<double> w(static_cast<size_t>(nk), 0.0);
        double mx = -INFINITY;
        std::vector<bool> seen(static_cast<size_t>(nk), false);
        for (int64_t j = 0; j < nk; ++j) {
          if (c.causal && (j > pos || (c.window > 0 && j <= pos - c.window))) continue;
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) {
            dot += static_cast<double>(q.data<float>()[(t * c.Hq + h) * D + d]) *
                   k.data<float>()[((ck[b] + j) * c.Hkv + h / group) * D + d];
          }
          double s = dot * scale;
          if (c.softcap > 0.0f) s = c.softcap * std::tanh(s / c.softcap);
          w[static_cast<size_t>(j)] = s;
          seen[static_cast<size_t>(j)] = true;
          mx = std::max(mx, s);
        }
        double sum = 0;
        for (int64_t j = 0; j < nk; ++j) {
          if (seen[static_cast<size_t>(j)])
            sum += w[static_cast<size_t>(j)] = std::exp(w[static_cast<size_t>(j)] - mx);
        }
        const float* o = out.data<float>() + (t * c.Hq + h) * D;
        for (int64_t d = 0; d < D; ++d) {
          double e = 0;
          for (int64_t j = 0; j < nk; ++j) {
            if (seen[static_cast<size_t>(j)]) {
              e += w[static_cast<size_t>(j)] *
                   v.data<float>()[((ck[b] + j) * c.Hkv + h / group) * D + d];
            }
          }
          e = sum > 0 ? e / sum : 0.0;
          ASSERT_TRUE(std::isfinite(o[d])) << "out row " << t << " head " << h << " dim " << d;
          max_err = std::max(max_err, std::abs(o[d] - e));
        }
        const float l = lse.data<float>()[h * Tq + t];
        if (sum == 0) {
          EXPECT_TRUE(std::isinf(l) && l < 0) << "lse row " << t << " head " << h << ": " << l;
        } else {
          max_lse_err = std::max(max_lse_err, std::abs(l - (mx + std::log(sum))));
        }
      }
    }
  }
  EXPECT_LE(max_err, 1e-5);
  EXPECT_LE(max_lse_err, 1e-5);
}

TEST(AttentionVarlen, MatchesFloat64Definition) {
  const std::vector<std::pair<int, int>> mixed = {{1, 1}, {17, 17}, {5, 40},   {0, 3},
                                                  {9, 0}, {30, 11}, {127, 127}};
  const Case cases[] = {
      {.seqs = {{17, 17}}, .Hq = 4, .Hkv = 4, .D = 16},
      {.seqs = mixed, .Hq = 6, .Hkv = 2, .D = 32},
      {.seqs = mixed, .Hq = 4, .Hkv = 1, .D = 8, .window = 5},
      {.seqs = mixed, .Hq = 3, .Hkv = 3, .D = 24, .softcap = 2.0f, .scale = 0.5f},
      {.seqs = mixed, .Hq = 4, .Hkv = 2, .D = 16, .causal = false},
      {.seqs = mixed, .Hq = 4, .Hkv = 2, .D = 16, .causal = false, .softcap = 3.0f},
      {.seqs = mixed, .Hq = 8, .Hkv = 2, .D = 16, .window = 1, .softcap = 1.0f},
  };
  uint32_t seed = 10;
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "case seed " << seed + 10);
    run_case(c, seed += 10);
    if (HasFatalFailure()) return;
  }
}

TEST(AttentionVarlen, ArgumentErrors) {
  const Tensor q = random_tensor({6, 4, 16}, 1), k = random_tensor({8, 2, 16}, 2);
  Tensor out = poisoned({6, 4, 16});
  expect_error(
      [&] {
        ops::attention_varlen(out, q, k, k, i32({0, 3, 5}), i32({0, 4, 8}), {});
      },
      {"ops::attention_varlen", "cu_q[2] = 5", "6 rows"});
  expect_error(
      [&] {
        ops::attention_varlen(out, q, k, k, i32({0, 4, 6}), i32({0, 5, 9}), {});
      },
      {"cu_k[2] = 9"});
  expect_error(
      [&] {
        ops::attention_varlen(out, q, k, k, i32({0, 4, 3}), i32({0, 4, 8}), {});
      },
      {"non-decreasing"});
  expect_error(
      [&] {
        ops::attention_varlen(out, q, k, k, i32({1, 6}), i32({0, 8}), {});
      },
      {"cu_q[0] = 1"});
  expect_error(
      [&] {
        ops::attention_varlen(out, q, k, k, i32({0, 6}), i32({0, 4, 8}), {});
      },
      {"cu_k"});
  ops::AttentionVarlenParams p;
  p.causal = false;
  p.window = 4;
  expect_error(
      [&] {
        ops::attention_varlen(out, q, k, k, i32({0, 6}), i32({0, 8}), p);
      },
      {"window = 4", "causal"});
  Tensor lse = poisoned({6, 4});
  expect_error(
      [&] {
        ops::attention_varlen(out, q, k, k, i32({0, 6}), i32({0, 8}), {}, &lse);
      },
      {"lse"});
  const Tensor q3 = random_tensor({6, 3, 16}, 3);
  Tensor out3 = poisoned({6, 3, 16});
  expect_error(
      [&] {
        ops::attention_varlen(out3, q3, k, k, i32({0, 6}), i32({0, 8}), {});
      },
      {"not a multiple"});
}

}  // namespace
}  // namespace llmk
