#include "kernels/cpu/attention_grad.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/test_util.h"

namespace llmk {
namespace {

using cpu::grad::FlashShape;

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Case {
  std::vector<int32_t> sq, sk;  // query and key counts per sequence
  int64_t Hq, Hkv, D;
  bool causal;
  int64_t left, right;  // window; -1 unbounded
  double softcap;
};

std::string name(const Case& c) {
  std::string s = "sq/sk=";
  for (size_t b = 0; b < c.sq.size(); ++b) {
    s += std::to_string(c.sq[b]) + "/" + std::to_string(c.sk[b]) + " ";
  }
  return s + "Hq/Hkv=" + std::to_string(c.Hq) + "/" + std::to_string(c.Hkv) +
         " D=" + std::to_string(c.D) + " causal=" + std::to_string(c.causal) +
         " window=" + std::to_string(c.left) + "," + std::to_string(c.right) +
         " softcap=" + std::to_string(c.softcap);
}

// Rows of NaN after the last sequence in q, k and v (reading them would poison the results) and
// in out, lse, dq, dk and dv (writing them would be caught).
constexpr int64_t kPadRows = 3;

// A case's offsets and inputs, the inputs in T. The offsets stay in place, so shape() may be
// called again after the problem has been moved.
template <class T>
struct Problem {
  Case c;
  std::vector<int32_t> cu_q{0}, cu_k{0};
  int64_t total_q = 0, total_k = 0;
  std::vector<T> q, k, v;

  FlashShape shape() const {
    FlashShape s;
    s.batch = static_cast<int64_t>(c.sq.size());
    s.cu_q = cu_q.data();
    s.cu_k = cu_k.data();
    s.Hq = c.Hq;
    s.Hkv = c.Hkv;
    s.D = c.D;
    s.scale = 2.5 / std::sqrt(static_cast<double>(c.D));  // sharper than the default
    s.causal = c.causal;
    s.window_left = c.left;
    s.window_right = c.right;
    s.softcap = c.softcap;
    return s;
  }
  size_t q_size() const { return static_cast<size_t>(total_q * c.Hq * c.D); }
  size_t kv_size() const { return static_cast<size_t>(total_k * c.Hkv * c.D); }
  size_t lse_size() const { return static_cast<size_t>(total_q * c.Hq); }
};

template <class T>
std::vector<T> to(const std::vector<float>& x) {
  return std::vector<T>(x.begin(), x.end());
}

void expect_nontrivial(const std::vector<float>& x) { test::expect_nontrivial(x); }

// Inputs in [-1, 1], followed by kPadRows rows of NaN.
template <class T>
Problem<T> make_problem(const Case& c, uint32_t seed) {
  Problem<T> p;
  p.c = c;
  for (size_t b = 0; b < c.sq.size(); ++b) {
    p.cu_q.push_back(p.cu_q.back() + c.sq[b]);
    p.cu_k.push_back(p.cu_k.back() + c.sk[b]);
  }
  p.total_q = p.cu_q.back();
  p.total_k = p.cu_k.back();
  const auto padded = [&](int64_t rows, int64_t heads, uint32_t s) {
    std::vector<float> x = test::random_floats(static_cast<size_t>(rows * heads * c.D), s);
    if (!x.empty()) expect_nontrivial(x);
    x.resize(static_cast<size_t>((rows + kPadRows) * heads * c.D), test::kPoison);
    return to<T>(x);
  };
  p.q = padded(p.total_q, c.Hq, seed);
  p.k = padded(p.total_k, c.Hkv, seed + 1);
  p.v = padded(p.total_k, c.Hkv, seed + 2);
  return p;
}

// Query i of a sequence sees key j: the FlashShape comment, spelled out independently of the
// kernel's index ranges.
bool visible(const Case& c, int64_t sq, int64_t sk, int64_t i, int64_t j) {
  const int64_t diag = i + sk - sq;
  const int64_t right = c.causal ? 0 : c.right;
  return (c.left < 0 || j >= diag - c.left) && (right < 0 || j <= diag + right);
}

struct Forward {
  std::vector<double> out, lse;  // [total_q, Hq, D], [total_q, Hq]
};

// Materialises each sequence's scores, masks them and takes the softmax, all in double.
template <class T>
Forward reference_fwd(const Problem<T>& p) {
  const Case& c = p.c;
  const FlashShape s = p.shape();
  const int64_t D = c.D, group = c.Hq / c.Hkv;
  Forward f{std::vector<double>(p.q_size(), 0.0), std::vector<double>(p.lse_size(), 0.0)};
  for (size_t b = 0; b < c.sq.size(); ++b) {
    const int64_t sq = c.sq[b], sk = c.sk[b], q0 = p.cu_q[b], k0 = p.cu_k[b];
    for (int64_t h = 0; h < c.Hq; ++h) {
      const int64_t hk = h / group;
      for (int64_t i = 0; i < sq; ++i) {
        std::vector<double> sc(static_cast<size_t>(sk), -kInf);
        double max = -kInf;
        for (int64_t j = 0; j < sk; ++j) {
          if (!visible(c, sq, sk, i, j)) continue;
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) {
            dot += static_cast<double>(p.q[static_cast<size_t>(((q0 + i) * c.Hq + h) * D + d)]) *
                   static_cast<double>(p.k[static_cast<size_t>(((k0 + j) * c.Hkv + hk) * D + d)]);
          }
          double x = s.scale * dot;
          if (c.softcap > 0) x = c.softcap * std::tanh(x / c.softcap);
          sc[static_cast<size_t>(j)] = x;
          max = std::max(max, x);
        }
        double* o = &f.out[static_cast<size_t>(((q0 + i) * c.Hq + h) * D)];
        double& lse = f.lse[static_cast<size_t>(h * p.total_q + q0 + i)];
        if (max == -kInf) {
          lse = -kInf;  // sees no key; out stays 0
          continue;
        }
        double sum = 0;
        for (double& x : sc) sum += (x = std::exp(x - max));
        for (int64_t j = 0; j < sk; ++j) {
          const double w = sc[static_cast<size_t>(j)] / sum;
          for (int64_t d = 0; d < D; ++d) {
            o[d] +=
                w * static_cast<double>(p.v[static_cast<size_t>(((k0 + j) * c.Hkv + hk) * D + d)]);
          }
        }
        lse = max + std::log(sum);
      }
    }
  }
  return f;
}

struct Tol {
  double rel, abs;
};
// Products of two floats are exact in double and every sum is in double, so a float result is
// the double result rounded once (2^-24 relative); differences in summation order between the
// kernel and the reference stay near 1e-15. A masking or head-mapping mistake moves results by
// 1e-2 or more.
template <class T>
constexpr Tol kFwdTol = std::is_same_v<T, float> ? Tol{1e-6, 1e-12} : Tol{1e-12, 1e-13};

// Runs flash_fwd on poisoned outputs and compares with the reference; counts the rows that saw no
// key and those that saw some.
template <class T>
void check_forward(const Case& c, uint32_t seed, int64_t* empty_rows, int64_t* full_rows) {
  const Problem<T> p = make_problem<T>(c, seed);
  const int64_t D = c.D;
  std::vector<T> out(p.q_size() + static_cast<size_t>(kPadRows * c.Hq * D), T(test::kPoison));
  std::vector<T> lse(p.lse_size() + static_cast<size_t>(kPadRows * c.Hq), T(test::kPoison));
  cpu::grad::flash_fwd(out.data(), lse.data(), p.q.data(), p.k.data(), p.v.data(), p.shape());
  const Forward want = reference_fwd(p);
  const Tol tol = kFwdTol<T>;
  for (int64_t r = 0; r < p.total_q; ++r) {
    for (int64_t h = 0; h < c.Hq; ++h) {
      const size_t li = static_cast<size_t>(h * p.total_q + r);
      const double wl = want.lse[li];
      if (wl == -kInf) {
        ASSERT_EQ(static_cast<double>(lse[li]), -kInf) << name(c) << " row=" << r << " h=" << h;
        ++*empty_rows;
      } else {
        ASSERT_NEAR(lse[li], wl, tol.rel * std::abs(wl) + tol.abs)
            << name(c) << " row=" << r << " h=" << h;
        ++*full_rows;
      }
      for (int64_t d = 0; d < D; ++d) {
        const size_t oi = static_cast<size_t>((r * c.Hq + h) * D + d);
        const double w = want.out[oi];
        if (wl == -kInf) {
          ASSERT_EQ(out[oi], T(0)) << name(c) << " row=" << r << " h=" << h << " d=" << d;
        } else {
          ASSERT_NEAR(out[oi], w, tol.rel * std::abs(w) + tol.abs)
              << name(c) << " row=" << r << " h=" << h << " d=" << d;
        }
      }
    }
  }
  for (size_t i = p.q_size(); i < out.size(); ++i) {
    ASSERT_TRUE(std::isnan(out[i])) << name(c) << " wrote out past the last row";
  }
  for (size_t i = p.lse_size(); i < lse.size(); ++i) {
    ASSERT_TRUE(std::isnan(lse[i])) << name(c) << " wrote lse past the last row";
  }
}

// Query lengths {0, 1, 7, 33} against equal, shorter and longer keys; head groups of 1, 4, 7 and
// 4 with two kv heads; head dims 64, 96, 40; every mask option, with and without softcap.
std::vector<Case> forward_cases() {
  const std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>> batches = {
      {{0, 1, 7, 33}, {0, 1, 7, 33}},
      {{0, 1, 7, 33}, {5, 0, 20, 12}},  // sq > sk: bottom-right causal leaves top queries blind
      {{7, 1, 33, 0}, {7, 40, 33, 3}},
  };
  struct Heads {
    int64_t Hq, Hkv, D;
  };
  const std::vector<Heads> heads = {{1, 1, 64}, {4, 1, 96}, {8, 2, 40}, {7, 1, 64}};
  const std::vector<std::pair<int64_t, int64_t>> windows = {{-1, -1}, {5, -1}, {3, 2},
                                                            {0, 0},   {-1, 4}, {100, 100}};
  std::vector<Case> cases;
  for (const auto& [sq, sk] : batches) {
    for (const Heads& hd : heads) {
      for (bool causal : {false, true}) {
        for (const auto& [left, right] : windows) {
          for (double softcap : {0.0, 1.5}) {
            cases.push_back({sq, sk, hd.Hq, hd.Hkv, hd.D, causal, left, right, softcap});
          }
        }
      }
    }
  }
  return cases;
}

template <class T>
void check_all_forward_cases() {
  int64_t empty_rows = 0, full_rows = 0;
  uint32_t seed = 1;
  const std::vector<Case> cases = forward_cases();
  for (const Case& c : cases) {
    check_forward<T>(c, seed, &empty_rows, &full_rows);
    if (::testing::Test::HasFatalFailure()) return;
    seed += 3;
  }
  EXPECT_EQ(cases.size(), 3u * 4u * 2u * 6u * 2u);
  EXPECT_GT(empty_rows, 1000);           // rows that see no key are covered ...
  EXPECT_GT(full_rows, 4 * empty_rows);  // ... but most rows see some
}

TEST(FlashAttn, ForwardFloatMatchesNaiveDoubleReference) { check_all_forward_cases<float>(); }

TEST(FlashAttn, ForwardDoubleMatchesNaiveDoubleReference) { check_all_forward_cases<double>(); }

TEST(FlashAttn, ForwardWithNoSequencesWritesNothing) {
  const Case c{{}, {}, 2, 1, 8, true, -1, -1, 0.0};
  int64_t empty_rows = 0, full_rows = 0;
  check_forward<float>(c, 5, &empty_rows, &full_rows);
  EXPECT_EQ(empty_rows + full_rows, 0);
}

// Random loss weights: G for out, H for lse (zero on rows whose lse is -inf, where lse * H
// would be NaN).
struct LossWeights {
  std::vector<double> G, H;
};

LossWeights loss_weights(const Forward& f, uint32_t seed) {
  LossWeights w{to<double>(test::random_floats(f.out.size(), seed)),
                to<double>(test::random_floats(f.lse.size(), seed + 1))};
  for (size_t i = 0; i < f.lse.size(); ++i) {
    if (f.lse[i] == -kInf) w.H[i] = 0;
  }
  return w;
}

// L = sum(out * G) + sum(lse * H) over the rows that see a key.
double loss(const Forward& f, const LossWeights& w) {
  double l = 0;
  for (size_t i = 0; i < f.out.size(); ++i) l += f.out[i] * w.G[i];
  for (size_t i = 0; i < f.lse.size(); ++i) {
    if (f.lse[i] != -kInf) l += f.lse[i] * w.H[i];
  }
  return l;
}

struct Grads {
  std::vector<double> dq, dk, dv;
};

// The kernel's forward then backward with dout = G and dlse = H (or null); outputs poisoned.
template <class T>
void run_fwd_bwd(const Problem<T>& p, const LossWeights& w, bool with_dlse, std::vector<T>* dq,
                 std::vector<T>* dk, std::vector<T>* dv, std::vector<T>* out = nullptr,
                 std::vector<T>* lse = nullptr) {
  std::vector<T> o(p.q_size(), T(test::kPoison)), l(p.lse_size(), T(test::kPoison));
  const FlashShape s = p.shape();
  cpu::grad::flash_fwd(o.data(), l.data(), p.q.data(), p.k.data(), p.v.data(), s);
  dq->assign(p.q_size() + static_cast<size_t>(kPadRows * p.c.Hq * p.c.D), T(test::kPoison));
  dk->assign(p.kv_size() + static_cast<size_t>(kPadRows * p.c.Hkv * p.c.D), T(test::kPoison));
  dv->assign(dk->size(), T(test::kPoison));
  const std::vector<T> G(w.G.begin(), w.G.end()), H(w.H.begin(), w.H.end());
  cpu::grad::flash_bwd(dq->data(), dk->data(), dv->data(), G.data(), with_dlse ? H.data() : nullptr,
                       p.q.data(), p.k.data(), p.v.data(), o.data(), l.data(), s);
  for (size_t i = p.q_size(); i < dq->size(); ++i) {
    ASSERT_TRUE(std::isnan((*dq)[i])) << name(p.c) << " wrote dq past the last row";
  }
  for (size_t i = p.kv_size(); i < dk->size(); ++i) {
    ASSERT_TRUE(std::isnan((*dk)[i]) && std::isnan((*dv)[i]))
        << name(p.c) << " wrote dk or dv past the last row";
  }
  dq->resize(p.q_size());
  dk->resize(p.kv_size());
  dv->resize(p.kv_size());
  if (out != nullptr) *out = o;
  if (lse != nullptr) *lse = l;
}

double max_abs(const std::vector<double>& x) {
  double m = 0;
  for (double e : x) m = std::max(m, std::abs(e));
  return m;
}

// Central differences of the reference's loss by each element of x (one of p's inputs).
std::vector<double> finite_differences(Problem<double>& p, std::vector<double>& x, size_t n,
                                       const LossWeights& w) {
  constexpr double kStep = 1e-5;
  std::vector<double> g(n);
  for (size_t i = 0; i < n; ++i) {
    const double x0 = x[i];
    x[i] = x0 + kStep;
    const double up = loss(reference_fwd(p), w);
    x[i] = x0 - kStep;
    const double down = loss(reference_fwd(p), w);
    x[i] = x0;
    g[i] = (up - down) / (2 * kStep);
  }
  return g;
}

// Every element within 1e-6 of the tensor's largest gradient; truncation (step^2) and roundoff
// (1e-16 / step) of the differences stay near 1e-10.
void expect_close_to_differences(const std::vector<double>& got, const std::vector<double>& fd,
                                 const char* what, const Case& c) {
  ASSERT_EQ(got.size(), fd.size());
  const double scale = max_abs(fd);
  ASSERT_GT(scale, 1e-3) << what << " is trivially small: " << name(c);
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], fd[i], 1e-6 * scale) << what << "[" << i << "] " << name(c);
  }
}

// dq of rows that see no key and dk, dv of keys no query sees are exactly zero; returns how many
// such rows there were.
int64_t check_structural_zeros(const Problem<double>& p, const Grads& g) {
  const Case& c = p.c;
  const int64_t D = c.D;
  int64_t zeros = 0;
  for (size_t b = 0; b < c.sq.size(); ++b) {
    const int64_t sq = c.sq[b], sk = c.sk[b];
    for (int64_t i = 0; i < sq; ++i) {
      bool sees = false;
      for (int64_t j = 0; j < sk; ++j) sees |= visible(c, sq, sk, i, j);
      if (sees) continue;
      ++zeros;
      const size_t at = static_cast<size_t>((p.cu_q[b] + i) * c.Hq * D);
      for (size_t e = at; e < at + static_cast<size_t>(c.Hq * D); ++e) EXPECT_EQ(g.dq[e], 0.0);
    }
    for (int64_t j = 0; j < sk; ++j) {
      bool seen = false;
      for (int64_t i = 0; i < sq; ++i) seen |= visible(c, sq, sk, i, j);
      if (seen) continue;
      ++zeros;
      const size_t at = static_cast<size_t>((p.cu_k[b] + j) * c.Hkv * D);
      for (size_t e = at; e < at + static_cast<size_t>(c.Hkv * D); ++e) {
        EXPECT_EQ(g.dk[e], 0.0);
        EXPECT_EQ(g.dv[e], 0.0);
      }
    }
  }
  return zeros;
}

// Returns the number of structural zero rows (see check_structural_zeros).
int64_t check_backward_against_differences(const Case& c, uint32_t seed, bool with_dlse) {
  Problem<double> p = make_problem<double>(c, seed);
  LossWeights w = loss_weights(reference_fwd(p), seed + 10);
  if (!with_dlse) std::fill(w.H.begin(), w.H.end(), 0.0);
  Grads got;
  run_fwd_bwd(p, w, with_dlse, &got.dq, &got.dk, &got.dv);
  if (::testing::Test::HasFatalFailure()) return 0;
  expect_close_to_differences(got.dq, finite_differences(p, p.q, p.q_size(), w), "dq", c);
  expect_close_to_differences(got.dk, finite_differences(p, p.k, p.kv_size(), w), "dk", c);
  expect_close_to_differences(got.dv, finite_differences(p, p.v, p.kv_size(), w), "dv", c);
  return check_structural_zeros(p, got);
}

TEST(AttentionGrad, BackwardMatchesFiniteDifferences) {
  // Tiny batches with an empty sequence, sq > sk (blind top queries under causal) and keys that
  // no query sees (windows); two query heads on one or two kv heads, D = 8.
  const std::vector<int32_t> sq = {3, 0, 4, 1}, sk = {5, 2, 2, 3};
  const std::vector<Case> cases = {
      {sq, sk, 2, 1, 8, false, -1, -1, 0.0},  {sq, sk, 2, 1, 8, true, -1, -1, 0.0},
      {sq, sk, 2, 2, 8, true, 1, -1, 0.0},    {sq, sk, 2, 1, 8, false, 1, 1, 0.0},
      {sq, sk, 2, 2, 8, false, 0, 2, 0.8},    {sq, sk, 2, 1, 8, true, 2, -1, 0.8},
      {{6}, {6}, 2, 1, 8, true, -1, -1, 0.5},
  };
  int64_t zeros = 0;
  uint32_t seed = 100;
  for (const Case& c : cases) {
    for (bool with_dlse : {true, false}) {
      zeros += check_backward_against_differences(c, seed, with_dlse);
      if (HasFatalFailure()) return;
      seed += 20;
    }
  }
  EXPECT_GT(zeros, 10);  // blind queries and unseen keys were exercised
}

// The same float inputs through the float and the double kernels.
void check_float_against_double(const Case& c, uint32_t seed) {
  const Problem<float> pf = make_problem<float>(c, seed);
  const Problem<double> pd = make_problem<double>(c, seed);
  const LossWeights w = loss_weights(reference_fwd(pd), seed + 10);
  std::vector<float> dqf, dkf, dvf;
  std::vector<double> dqd, dkd, dvd;
  run_fwd_bwd(pf, w, true, &dqf, &dkf, &dvf);
  run_fwd_bwd(pd, w, true, &dqd, &dkd, &dvd);
  if (::testing::Test::HasFatalFailure()) return;
  // The float kernel reads its own out and lse, rounded to float: p = exp(s - lse) moves by
  // |lse| * 2^-24 and delta = dout . out by 2^-24 relative before ds = p (dp - delta) cancels.
  // Measured: up to 1.1e-7 of each tensor's largest element.
  const auto expect_close = [&](const std::vector<float>& got, const std::vector<double>& want,
                                const char* what) {
    const double scale = max_abs(want);
    ASSERT_GT(scale, 1e-2) << what << " is trivially small: " << name(c);
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      worst = std::max(worst, std::abs(static_cast<double>(got[i]) - want[i]));
    }
    EXPECT_LT(worst, 1e-6 * scale) << what << " " << name(c);
  };
  expect_close(dqf, dqd, "dq");
  expect_close(dkf, dkd, "dk");
  expect_close(dvf, dvd, "dv");
}

TEST(AttentionGrad, FloatBackwardMatchesDoubleBackward) {
  const std::vector<int32_t> sq = {17, 64, 5, 0, 30}, sk = {17, 80, 0, 9, 12};
  check_float_against_double({sq, sk, 8, 2, 64, true, -1, -1, 0.0}, 300);
  check_float_against_double({sq, sk, 7, 1, 40, false, 20, 5, 1.5}, 301);
  check_float_against_double({sq, sk, 4, 4, 96, true, 8, -1, 0.0}, 302);
}

TEST(AttentionGrad, RowsWithInfiniteLseContributeNothing) {
  // Marking a row's lse -inf (or +inf, flash-attn's CUDA mark for a row that sees no key) gives
  // the gradients of that row having no loss weight: dout = 0, dlse = 0.
  const Case c{{9, 5}, {9, 7}, 4, 2, 16, true, -1, -1, 0.0};
  const Problem<double> p = make_problem<double>(c, 500);
  const FlashShape s = p.shape();
  std::vector<double> out(p.q_size()), lse(p.lse_size());
  cpu::grad::flash_fwd(out.data(), lse.data(), p.q.data(), p.k.data(), p.v.data(), s);
  LossWeights w = loss_weights(reference_fwd(p), 510);
  const auto bwd = [&](const std::vector<double>& G, const std::vector<double>& H,
                       const std::vector<double>& L) {
    Grads g{std::vector<double>(p.q_size()), std::vector<double>(p.kv_size()),
            std::vector<double>(p.kv_size())};
    cpu::grad::flash_bwd(g.dq.data(), g.dk.data(), g.dv.data(), G.data(), H.data(), p.q.data(),
                         p.k.data(), p.v.data(), out.data(), L.data(), s);
    return g;
  };
  // Rows 3 (head 1) and 12 (head 2) see keys; they are marked with -inf and +inf (lse is
  // [heads, rows], dout [rows, heads, D]).
  const size_t marked[2] = {1 * 14 + 3, 2 * 14 + 12};
  const size_t marked_rows[2] = {3 * 4 + 1, 12 * 4 + 2};
  ASSERT_EQ(p.total_q, 14);
  ASSERT_TRUE(std::isfinite(lse[marked[0]]) && std::isfinite(lse[marked[1]]));
  std::vector<double> L = lse, G = w.G, H = w.H;
  L[marked[0]] = -kInf;
  L[marked[1]] = kInf;
  for (size_t r : marked) H[r] = 0;
  for (size_t r : marked_rows) {
    std::fill(G.begin() + static_cast<std::ptrdiff_t>(r * 16),
              G.begin() + static_cast<std::ptrdiff_t>((r + 1) * 16), 0.0);
  }
  const Grads got = bwd(w.G, w.H, L), want = bwd(G, H, lse);
  EXPECT_EQ(got.dq, want.dq);
  EXPECT_EQ(got.dk, want.dk);
  EXPECT_EQ(got.dv, want.dv);
  EXPECT_NE(want.dk, bwd(w.G, w.H, lse).dk);  // the marked rows do contribute otherwise
}

TEST(AttentionGrad, SameResultForAnyThreadCount) {
  const Case c{{40, 3, 129, 0, 64}, {40, 9, 100, 5, 64}, 8, 2, 64, true, 50, -1, 1.5};
  const Problem<float> p = make_problem<float>(c, 400);
  const LossWeights w = loss_weights(reference_fwd(make_problem<double>(c, 400)), 410);
  struct Run {
    std::vector<float> out, lse, dq, dk, dv;
  };
  const auto run = [&] {
    Run r;
    run_fwd_bwd(p, w, true, &r.dq, &r.dk, &r.dv, &r.out, &r.lse);
    return r;
  };
  const auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  const auto expect_same = [&](const Run& a, const Run& b, const char* what) {
    EXPECT_TRUE(same_bits(a.out, b.out)) << "out " << what;
    EXPECT_TRUE(same_bits(a.lse, b.lse)) << "lse " << what;
    EXPECT_TRUE(same_bits(a.dq, b.dq)) << "dq " << what;
    EXPECT_TRUE(same_bits(a.dk, b.dk)) << "dk " << what;
    EXPECT_TRUE(same_bits(a.dv, b.dv)) << "dv " << what;
  };
  set_num_threads(4);
  const Run first = run();
  expect_same(first, run(), "differs between two runs on 4 threads");
  set_num_threads(1);
  expect_same(first, run(), "differs between 4 threads and 1");
  set_num_threads(3);
  expect_same(first, run(), "differs between 4 threads and 3");
  set_num_threads(0);  // back to the default
}

}  // namespace
}  // namespace llmk
