// Tests of kernels/cpu/attention_transfer.h: the forward against a naive double reference written
// here (every score materialised), the backward against central finite differences of the mean
// KL (in double), float against double, and the results independent of the thread count.
// Outputs start as NaN so an element left unwritten fails.
#include "kernels/cpu/attention_transfer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "core/thread_pool.h"

namespace llmk {
namespace {

namespace g = cpu::grad;
using Vec = std::vector<double>;

Vec random_vec(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> dist(0.0, 1.0);
  Vec v(n);
  for (double& x : v) x = dist(rng);
  return v;
}

struct Inputs {
  Vec tq, tk, sq, sk;
};
Inputs random_inputs(const g::AttentionTransferParams& p, uint32_t seed) {
  const size_t nt = static_cast<size_t>(p.B * p.S * p.R * p.dt);
  const size_t ns = static_cast<size_t>(p.B * p.S * p.R * p.ds);
  return {random_vec(nt, seed), random_vec(nt, seed + 1), random_vec(ns, seed + 2),
          random_vec(ns, seed + 3)};
}

// kl, lse_t, lse_s of every row [B, R, S], from the full S x S scores of each (b, r).
struct Rows {
  Vec kl, lse_t, lse_s;
};
Rows naive_forward(const Inputs& in, const g::AttentionTransferParams& p) {
  Rows out{Vec(static_cast<size_t>(p.rows())), Vec(static_cast<size_t>(p.rows())),
           Vec(static_cast<size_t>(p.rows()))};
  const double st = 1.0 / (std::sqrt(static_cast<double>(p.dt)) * p.temperature);
  const double ss = 1.0 / (std::sqrt(static_cast<double>(p.ds)) * p.temperature);
  auto score = [&](const Vec& q, const Vec& k, int64_t d, double scale, int64_t b, int64_t r,
                   int64_t i, int64_t j) {
    double s = 0.0;
    for (int64_t c = 0; c < d; ++c) {
      s += q[static_cast<size_t>(((b * p.S + i) * p.R + r) * d + c)] *
           k[static_cast<size_t>(((b * p.S + j) * p.R + r) * d + c)];
    }
    return s * scale;
  };
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t r = 0; r < p.R; ++r)
      for (int64_t i = 0; i < p.S; ++i) {
        const int64_t n = p.causal ? i + 1 : p.S;
        Vec a_t(static_cast<size_t>(n)), a_s(static_cast<size_t>(n));
        for (int64_t j = 0; j < n; ++j) {
          a_t[static_cast<size_t>(j)] = score(in.tq, in.tk, p.dt, st, b, r, i, j);
          a_s[static_cast<size_t>(j)] = score(in.sq, in.sk, p.ds, ss, b, r, i, j);
        }
        auto lse = [](const Vec& a) {
          const double m = *std::max_element(a.begin(), a.end());
          double z = 0.0;
          for (const double x : a) z += std::exp(x - m);
          return m + std::log(z);
        };
        const double lt = lse(a_t), ls = lse(a_s);
        double kl = 0.0;  // sum p_t (log p_t - log p_s)
        for (size_t j = 0; j < a_t.size(); ++j) {
          kl += std::exp(a_t[j] - lt) * ((a_t[j] - lt) - (a_s[j] - ls));
        }
        const size_t row = static_cast<size_t>((b * p.R + r) * p.S + i);
        out.kl[row] = kl;
        out.lse_t[row] = lt;
        out.lse_s[row] = ls;
      }
  return out;
}

template <class T, class U>
std::vector<T> cast(const std::vector<U>& v) {
  return std::vector<T>(v.begin(), v.end());
}

template <class T>
struct Result {
  std::vector<T> kl, lse_t, lse_s, dq, dk;
};
// The kernels on `in` rounded to T: forward, then the backward of the mean for dout = 1.
template <class T>
Result<T> run(const Inputs& in, const g::AttentionTransferParams& p) {
  const auto tq = cast<T>(in.tq), tk = cast<T>(in.tk), sq = cast<T>(in.sq), sk = cast<T>(in.sk);
  const T nan = std::numeric_limits<T>::quiet_NaN();
  Result<T> out;
  for (auto* v : {&out.kl, &out.lse_t, &out.lse_s}) v->assign(static_cast<size_t>(p.rows()), nan);
  out.dq.assign(sq.size(), nan);
  out.dk.assign(sk.size(), nan);
  g::attention_transfer_fwd(out.kl.data(), out.lse_t.data(), out.lse_s.data(), tq.data(), tk.data(),
                            sq.data(), sk.data(), p);
  g::attention_transfer_bwd(out.dq.data(), out.dk.data(), tq.data(), tk.data(), sq.data(),
                            sk.data(), out.lse_t.data(), out.lse_s.data(),
                            1.0 / static_cast<double>(p.rows()), p);
  return out;
}

double mean_kl(const Inputs& in, const g::AttentionTransferParams& p) {
  const Result<double> r = run<double>(in, p);
  double s = 0.0;
  for (const double x : r.kl) s += x;
  return s / static_cast<double>(p.rows());
}

template <class T>
double max_abs_diff(const std::vector<T>& a, const Vec& b) {
  double m = 0.0;
  for (size_t i = 0; i < b.size(); ++i) {
    m = std::max(m, std::abs(static_cast<double>(a[i]) - b[i]));
    if (std::isnan(static_cast<double>(a[i]))) return std::numeric_limits<double>::infinity();
  }
  return m;
}
double max_abs(const Vec& v) {
  double m = 0.0;
  for (const double x : v) m = std::max(m, std::abs(x));
  return m;
}

g::AttentionTransferParams params(int64_t B, int64_t S, int64_t R, int64_t dt, int64_t ds, double T,
                                  bool causal) {
  g::AttentionTransferParams p;
  p.B = B;
  p.S = S;
  p.R = R;
  p.dt = dt;
  p.ds = ds;
  p.temperature = T;
  p.causal = causal;
  return p;
}

class AttentionTransferTest : public ::testing::TestWithParam<bool> {};  // causal

TEST_P(AttentionTransferTest, ForwardMatchesNaiveReference) {
  for (const auto& p :
       {params(2, 1, 1, 4, 4, 1.0, GetParam()), params(1, 37, 3, 5, 7, 2.0, GetParam()),
        params(2, 70, 2, 16, 8, 4.0, GetParam())}) {
    const Inputs in = random_inputs(p, 11);
    const Rows want = naive_forward(in, p);
    const Result<double> got = run<double>(in, p);
    EXPECT_LE(max_abs_diff(got.kl, want.kl), 1e-12 * std::max(max_abs(want.kl), 1.0));
    EXPECT_LE(max_abs_diff(got.lse_t, want.lse_t), 1e-12 * max_abs(want.lse_t));
    EXPECT_LE(max_abs_diff(got.lse_s, want.lse_s), 1e-12 * max_abs(want.lse_s));
    // float: the inputs rounded to float, sums in double, each result rounded once.
    const Inputs in32{cast<double>(cast<float>(in.tq)), cast<double>(cast<float>(in.tk)),
                      cast<double>(cast<float>(in.sq)), cast<double>(cast<float>(in.sk))};
    const Rows want32 = naive_forward(in32, p);
    const Result<float> got32 = run<float>(in, p);
    EXPECT_LE(max_abs_diff(got32.kl, want32.kl), 1e-6 * std::max(max_abs(want32.kl), 1.0));
    EXPECT_LE(max_abs_diff(got32.lse_t, want32.lse_t), 1e-6 * max_abs(want32.lse_t));
  }
}

TEST_P(AttentionTransferTest, BackwardMatchesFiniteDifferences) {
  const auto p = params(2, 9, 2, 3, 5, 2.0, GetParam());
  Inputs in = random_inputs(p, 21);
  const Result<double> got = run<double>(in, p);
  const double h = 1e-5;
  for (Vec* x : {&in.sq, &in.sk}) {
    const std::vector<double>& grad = x == &in.sq ? got.dq : got.dk;
    Vec fd(x->size());
    for (size_t i = 0; i < x->size(); ++i) {
      const double keep = (*x)[i];
      (*x)[i] = keep + h;
      const double up = mean_kl(in, p);
      (*x)[i] = keep - h;
      const double down = mean_kl(in, p);
      (*x)[i] = keep;
      fd[i] = (up - down) / (2 * h);
    }
    EXPECT_LE(max_abs_diff(grad, fd), 1e-7 * std::max(max_abs(fd), 1e-3))
        << (x == &in.sq ? "dq" : "dk");
    EXPECT_GT(max_abs(fd), 1e-4) << "a vanishing gradient would pass vacuously";
  }
}

TEST_P(AttentionTransferTest, SameResultsOnOneThread) {
  const auto p = params(2, 130, 3, 8, 12, 1.0, GetParam());
  const Inputs in = random_inputs(p, 31);
  const Result<float> many = run<float>(in, p);
  set_num_threads(1);
  const Result<float> one = run<float>(in, p);
  set_num_threads(0);
  EXPECT_EQ(many.kl, one.kl);
  EXPECT_EQ(many.lse_t, one.lse_t);
  EXPECT_EQ(many.dq, one.dq);
  EXPECT_EQ(many.dk, one.dk);
}

INSTANTIATE_TEST_SUITE_P(Causal, AttentionTransferTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& c) {
                           return c.param ? "causal" : "full";
                         });

}  // namespace
}  // namespace llmk
