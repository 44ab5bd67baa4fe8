// Tests of kernels/cpu/grad.h: every forward against a naive double reference written here, every
// backward against central finite differences of its forward (in double), and float against
// double on larger shapes. Outputs start as NaN so an element left unwritten fails.
#include "kernels/cpu/grad.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numbers>
#include <random>
#include <string>
#include <vector>

#include "core/thread_pool.h"

namespace llmk {
namespace {

namespace g = cpu::grad;
using Vec = std::vector<double>;

// Unit roundoff of T.
template <class T>
constexpr double unit() {
  return std::numeric_limits<T>::epsilon() / 2;
}

template <class T>
const char* type_name() {
  return sizeof(T) == 4 ? "float" : "double";
}

template <class T>
constexpr T kNaN = std::numeric_limits<T>::quiet_NaN();

// n values uniform in [lo, hi], drawn in double and rounded to T: the references below read the
// very values the kernel reads.
template <class T>
std::vector<T> random_vec(size_t n, uint32_t seed, double lo = -1, double hi = 1) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<T> v(n);
  for (T& x : v) x = static_cast<T>(dist(rng));
  return v;
}

// Inputs (and gradients checked against them) must not be mostly zero or constant, or a test
// could pass vacuously.
template <class T>
void expect_nontrivial(const std::vector<T>& v, const char* what) {
  ASSERT_FALSE(v.empty()) << what;
  size_t nonzero = 0;
  bool varied = false;
  for (const T x : v) {
    nonzero += x != T(0);
    varied |= x != v[0];
  }
  ASSERT_GE(nonzero * 2, v.size()) << what << " is mostly zeros";
  if (v.size() > 1) {
    ASSERT_TRUE(varied) << what << " is constant";
  }
}

template <class T>
Vec to_double(const std::vector<T>& v) {
  return Vec(v.begin(), v.end());
}

// Central differences of loss() in every element of x (each restored after). The losses below are
// smooth and of size ~1, so with h = 1e-5 both the truncation (h^2) and the rounding (u / h)
// errors stay near 1e-10.
template <class F>
Vec numeric_grad(F loss, Vec& x, double h = 1e-5) {
  Vec grad(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const double up = loss();
    x[i] = x0 - h;
    const double down = loss();
    x[i] = x0;
    grad[i] = (up - down) / (2 * h);
  }
  return grad;
}

// Each analytic element within 1e-6 of the numeric one, relative to max(|numeric|, 1e-2) (the
// floor keeps the test meaningful where a derivative crosses zero: 1e-8 absolute, still 100
// times the finite-difference error).
void expect_grad_near(const Vec& analytic, const Vec& numeric, const std::string& what) {
  ASSERT_EQ(analytic.size(), numeric.size()) << what;
  expect_nontrivial(analytic, what.c_str());
  for (size_t i = 0; i < analytic.size(); ++i) {
    ASSERT_LE(std::fabs(analytic[i] - numeric[i]), 1e-6 * std::max(std::fabs(numeric[i]), 1e-2))
        << what << " element " << i << ": analytic " << analytic[i] << ", numeric " << numeric[i];
  }
}

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

constexpr g::Act kActs[] = {g::Act::SiLU, g::Act::GeluTanh, g::Act::GeluErf, g::Act::None};

const char* act_name(g::Act a) {
  switch (a) {
    case g::Act::SiLU:
      return "silu";
    case g::Act::GeluTanh:
      return "gelu_tanh";
    case g::Act::GeluErf:
      return "gelu_erf";
    case g::Act::None:
      return "none";
  }
  return "?";
}

// The activations in double, from their definitions.
double act_ref(double x, g::Act a) {
  switch (a) {
    case g::Act::SiLU:
      return x / (1 + std::exp(-x));
    case g::Act::GeluTanh:
      return 0.5 * x *
             (1 + std::tanh(std::sqrt(2 / std::numbers::pi) * (x + 0.044715 * x * x * x)));
    case g::Act::GeluErf:
      return 0.5 * x * std::erfc(-x / std::numbers::sqrt2);
    case g::Act::None:
      return x;
  }
  return kNaN<double>;
}

// What act(x) may be off by in T: exp/tanh/erf within a few ulp, and the 1 + tanh or 1 + erf of
// the gelus cancels for negative x, leaving an absolute error of a few u times |x|.
template <class T>
double act_tol(double x) {
  return 16 * unit<T>() * (1 + std::fabs(x));
}

// ---------------------------------------------------------------------------------------------
// rms_norm

struct RmsRef {
  Vec y, rstd;
};

RmsRef rms_norm_ref(const Vec& x, const Vec& w, int64_t rows, int64_t D, double eps) {
  RmsRef r{Vec(x.size()), Vec(static_cast<size_t>(rows))};
  for (int64_t i = 0; i < rows; ++i) {
    double ss = 0;
    for (int64_t j = 0; j < D; ++j) ss += x[i * D + j] * x[i * D + j];
    const double inv = 1 / std::sqrt(ss / static_cast<double>(D) + eps);
    r.rstd[i] = inv;
    for (int64_t j = 0; j < D; ++j) r.y[i * D + j] = x[i * D + j] * inv * w[j];
  }
  return r;
}

template <class T>
void check_rms_norm_fwd() {
  uint32_t seed = 1;
  for (int64_t rows : {1, 7, 33}) {
    for (int64_t D : {40, 96, 100}) {
      const auto x = random_vec<T>(static_cast<size_t>(rows * D), seed++, -2, 2);
      const auto w = random_vec<T>(static_cast<size_t>(D), seed++, 0.5, 1.5);
      expect_nontrivial(x, "x");
      std::vector<T> y(x.size(), kNaN<T>), rstd(static_cast<size_t>(rows), kNaN<T>);
      g::rms_norm_fwd(y.data(), rstd.data(), x.data(), w.data(), rows, D, 1e-6);
      const RmsRef ref = rms_norm_ref(to_double(x), to_double(w), rows, D, 1e-6);
      for (int64_t r = 0; r < rows; ++r) {
        // rstd rounded once; y rounds it and two products.
        ASSERT_NEAR(rstd[r], ref.rstd[r], unit<T>() * ref.rstd[r]) << "row " << r;
        for (int64_t j = 0; j < D; ++j) {
          const size_t i = static_cast<size_t>(r * D + j);
          ASSERT_NEAR(y[i], ref.y[i], 4 * unit<T>() * std::fabs(ref.y[i]))
              << type_name<T>() << " rows=" << rows << " D=" << D << " at " << r << "," << j;
        }
      }
    }
  }
}

TEST(GradRmsNorm, ForwardMatchesDoubleReference) {
  check_rms_norm_fwd<float>();
  check_rms_norm_fwd<double>();
}

TEST(GradRmsNorm, BackwardMatchesFiniteDifferences) {
  const int64_t rows = 3, D = 5;
  const double eps = 1e-6;
  Vec x = random_vec<double>(rows * D, 11, -2, 2), w = random_vec<double>(D, 12, 0.5, 1.5);
  const Vec dy = random_vec<double>(rows * D, 13);  // L = sum(dy * y)
  const auto loss = [&] {
    Vec y(x.size()), rstd(rows);
    g::rms_norm_fwd(y.data(), rstd.data(), x.data(), w.data(), rows, D, eps);
    return dot(dy, y);
  };
  Vec y(x.size()), rstd(rows), dx(x.size(), kNaN<double>), dw(w.size(), kNaN<double>);
  g::rms_norm_fwd(y.data(), rstd.data(), x.data(), w.data(), rows, D, eps);
  g::rms_norm_bwd(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), rows, D);
  expect_grad_near(dx, numeric_grad(loss, x), "dx");
  expect_grad_near(dw, numeric_grad(loss, w), "dw");

  Vec dx_alone(x.size(), kNaN<double>);  // dw = null: dx alone, the same
  g::rms_norm_bwd(dx_alone.data(), static_cast<double*>(nullptr), dy.data(), x.data(), w.data(),
                  rstd.data(), rows, D);
  EXPECT_EQ(dx_alone, dx);

  // A residual gradient dres: L + sum(dres * x) has gradient dx + dres, written over dres too.
  Vec dres = random_vec<double>(rows * D, 14), dx_res(x.size(), kNaN<double>);
  g::rms_norm_bwd(dx_res.data(), static_cast<double*>(nullptr), dy.data(), x.data(), w.data(),
                  rstd.data(), rows, D, dres.data());
  const auto loss_res = [&] { return loss() + dot(dres, x); };
  expect_grad_near(dx_res, numeric_grad(loss_res, x), "dx with dres");
  g::rms_norm_bwd(dres.data(), static_cast<double*>(nullptr), dy.data(), x.data(), w.data(),
                  rstd.data(), rows, D, dres.data());
  EXPECT_EQ(dres, dx_res);
}

TEST(GradRmsNorm, FloatBackwardMatchesDouble) {
  uint32_t seed = 20;
  for (int64_t rows : {1, 7, 33}) {
    for (int64_t D : {40, 100, 1000}) {
      const size_t n = static_cast<size_t>(rows * D);
      const auto x = random_vec<float>(n, seed++, -2, 2), dy = random_vec<float>(n, seed++);
      const auto w = random_vec<float>(static_cast<size_t>(D), seed++, 0.5, 1.5);
      std::vector<float> y(n), rstd(static_cast<size_t>(rows));
      std::vector<float> dx(n, kNaN<float>), dw(static_cast<size_t>(D), kNaN<float>);
      g::rms_norm_fwd(y.data(), rstd.data(), x.data(), w.data(), rows, D, 1e-6);
      g::rms_norm_bwd(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), rows, D);
      const Vec xd = to_double(x), wd = to_double(w), dyd = to_double(dy);
      Vec yd(n), rstdd(static_cast<size_t>(rows)), dxd(n), dwd(static_cast<size_t>(D));
      g::rms_norm_fwd(yd.data(), rstdd.data(), xd.data(), wd.data(), rows, D, 1e-6);
      g::rms_norm_bwd(dxd.data(), dwd.data(), dyd.data(), xd.data(), wd.data(), rstdd.data(), rows,
                      D);
      const double u = unit<float>();
      Vec dw_scale(static_cast<size_t>(D), 0.0);
      for (int64_t r = 0; r < rows; ++r) {
        double mean = 0;
        for (int64_t j = 0; j < D; ++j) mean += dyd[r * D + j] * wd[j] * xd[r * D + j] * rstdd[r];
        mean /= static_cast<double>(D);
        for (int64_t j = 0; j < D; ++j) {
          const size_t i = static_cast<size_t>(r * D + j);
          const double xhat = xd[i] * rstdd[r];
          // A handful of roundings, each relative to the terms of rstd * (g - xhat * mean).
          const double scale = rstdd[r] * (std::fabs(dyd[i] * wd[j]) + std::fabs(xhat * mean));
          ASSERT_NEAR(dx[i], dxd[i], 12 * u * scale) << "rows=" << rows << " D=" << D << " " << i;
          dw_scale[static_cast<size_t>(j)] += std::fabs(dyd[i] * xhat);
        }
      }
      for (int64_t j = 0; j < D; ++j) {
        // Exact products of the float inputs summed in double; rstd and the result rounded.
        ASSERT_NEAR(dw[j], dwd[j], 3 * u * dw_scale[j]) << "rows=" << rows << " D=" << D;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// gated activations

template <class T>
void check_gated_fwd() {
  uint32_t seed = 30;
  for (g::Act act : kActs) {
    for (int64_t n : {1, 7, 33, 40000}) {  // 40000: several tasks of the pool
      const auto gate = random_vec<T>(static_cast<size_t>(n), seed++, -6, 6);
      const auto up = random_vec<T>(static_cast<size_t>(n), seed++, -2, 2);
      std::vector<T> out(static_cast<size_t>(n), kNaN<T>);
      g::gated_fwd(out.data(), gate.data(), up.data(), n, act);
      for (size_t i = 0; i < out.size(); ++i) {
        const double a = act_ref(gate[i], act);
        ASSERT_NEAR(out[i], a * up[i],
                    (act_tol<T>(gate[i]) + unit<T>() * std::fabs(a)) * std::fabs(up[i]))
            << type_name<T>() << " " << act_name(act) << " n=" << n << " gate=" << gate[i];
      }
    }
  }
}

TEST(GradGated, ForwardMatchesDoubleReference) {
  check_gated_fwd<float>();
  check_gated_fwd<double>();
}

TEST(GradGated, BackwardMatchesFiniteDifferences) {
  for (g::Act act : kActs) {
    const int64_t n = 9;
    Vec gate = random_vec<double>(n, 40, -4, 4), up = random_vec<double>(n, 41, -2, 2);
    gate[0] = 0;  // the activations' derivatives at 0 too
    const Vec dout = random_vec<double>(n, 42);
    const auto loss = [&] {
      Vec out(static_cast<size_t>(n));
      g::gated_fwd(out.data(), gate.data(), up.data(), n, act);
      return dot(dout, out);
    };
    Vec dgate(n, kNaN<double>), dup(n, kNaN<double>);
    g::gated_bwd(dgate.data(), dup.data(), dout.data(), gate.data(), up.data(), n, act);
    expect_grad_near(dgate, numeric_grad(loss, gate), std::string("dgate ") + act_name(act));
    expect_grad_near(dup, numeric_grad(loss, up), std::string("dup ") + act_name(act));
  }
}

TEST(GradGated, FloatBackwardMatchesDouble) {
  uint32_t seed = 50;
  for (g::Act act : kActs) {
    const int64_t n = 40000;
    const auto gate = random_vec<float>(n, seed++, -6, 6), up = random_vec<float>(n, seed++, -2, 2);
    const auto dout = random_vec<float>(n, seed++);
    std::vector<float> dgate(n, kNaN<float>), dup(n, kNaN<float>);
    g::gated_bwd(dgate.data(), dup.data(), dout.data(), gate.data(), up.data(), n, act);
    const Vec gd = to_double(gate), ud = to_double(up), dd = to_double(dout);
    Vec dgd(n), dud(n);
    g::gated_bwd(dgd.data(), dud.data(), dd.data(), gd.data(), ud.data(), n, act);
    const double u = unit<float>();
    for (int64_t i = 0; i < n; ++i) {
      const double x = gd[i], s = std::fabs(dd[i]);
      // act' has the error of act scaled by the inner derivative (up to ~1 + x^2 for gelu).
      ASSERT_NEAR(dgate[i], dgd[i], 32 * u * (1 + x * x) * s * std::fabs(ud[i]) + 1e-30)
          << act_name(act) << " gate=" << x;
      ASSERT_NEAR(dup[i], dud[i], act_tol<float>(x) * s + 2 * u * std::fabs(dud[i]) + 1e-30)
          << act_name(act) << " gate=" << x;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// RoPE

TEST(GradRope, TableMatchesDoubleReference) {
  const std::vector<int64_t> all_pos = {
      0, 1,  7,  511, 4097, 32768, 99999, 100000, -3, 3,  12345, 65535, 2,  1000000, 5,  6, 8,
      9, 10, 11, 12,  13,   14,    15,    16,     17, 18, 19,    20,    21, 22,      23, 24};
  struct Case {
    int rot;
    double theta, freq_scale;
    bool factors;
  };
  const Case cases[] = {{40, 1e4, 1, false},
                        {96, 5e5, 1, true},
                        {100, 1e6, 0.25, false},
                        {64, 1e4, 0.5, true},
                        {2, 1e4, 1, false}};
  for (int64_t rows : {1, 7, 33}) {
    for (const Case& c : cases) {
      const int64_t half = c.rot / 2;
      const std::vector<double> ff = random_vec<double>(static_cast<size_t>(half), 60, 1, 8);
      const std::vector<int64_t> pos(all_pos.begin(), all_pos.begin() + rows);
      const auto check = [&]<class T>(T) {
        std::vector<T> cs(static_cast<size_t>(rows * half), kNaN<T>), sn = cs;
        g::rope_table(cs.data(), sn.data(), pos.data(), rows, c.rot, c.theta, c.freq_scale,
                      c.factors ? ff.data() : nullptr);
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t i = 0; i < half; ++i) {
            const double angle = static_cast<double>(pos[r]) * c.freq_scale *
                                 std::pow(c.theta, -2.0 * static_cast<double>(i) / c.rot) /
                                 (c.factors ? ff[static_cast<size_t>(i)] : 1.0);
            // Rounded once from double; the angle itself may differ from this one's in its
            // last bits (up to ~1e-10 of cos at positions near 1e6).
            const size_t k = static_cast<size_t>(r * half + i);
            ASSERT_NEAR(cs[k], std::cos(angle), 2 * unit<T>() + 1e-9)
                << type_name<T>() << " pos=" << pos[r] << " i=" << i << " rot=" << c.rot;
            ASSERT_NEAR(sn[k], std::sin(angle), 2 * unit<T>() + 1e-9)
                << type_name<T>() << " pos=" << pos[r] << " i=" << i << " rot=" << c.rot;
          }
        }
      };
      check(0.0f);
      check(0.0);
      if (HasFatalFailure()) return;
    }
  }
}

// Element strides of [B, S, H, D] over a buffer, and the buffer's size.
struct Layout {
  int64_t st[4];
  int64_t size;
};

enum class Storage {
  Contiguous,   // [B, S, H, D]
  HeadsFirst,   // [B, H, S, D], as attention keeps q and k
  EveryOtherD,  // [B, S, H, D, 2] read at [..., 0]: D's stride is 2
  PaddedHeads,  // [B, S, H, D + 3]
};

Layout make_layout(Storage s, int64_t B, int64_t S, int64_t H, int64_t D) {
  switch (s) {
    case Storage::Contiguous:
      return {{S * H * D, H * D, D, 1}, B * S * H * D};
    case Storage::HeadsFirst:
      return {{H * S * D, D, S * D, 1}, B * S * H * D};
    case Storage::EveryOtherD:
      return {{2 * S * H * D, 2 * H * D, 2 * D, 2}, 2 * B * S * H * D};
    case Storage::PaddedHeads:
      return {{S * H * (D + 3), H * (D + 3), D + 3, 1}, B * S * H * (D + 3)};
  }
  return {};
}

int64_t offset(const Layout& l, int64_t b, int64_t s, int64_t h, int64_t d) {
  return b * l.st[0] + s * l.st[1] + h * l.st[2] + d * l.st[3];
}

// Which elements of a buffer a layout's view covers.
std::vector<bool> in_view(const Layout& l, int64_t B, int64_t S, int64_t H, int64_t D) {
  std::vector<bool> m(static_cast<size_t>(l.size), false);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d) m[static_cast<size_t>(offset(l, b, s, h, d))] = true;
  return m;
}

// A RoPE problem: x in its layout (elements outside the view NaN), cos/sin of random angles
// rounded to T, per batch ([B, S, half], rows cs_s = half + 2 apart) or shared ([S, half]).
template <class T>
struct RopeProblem {
  g::RopeShape shape;
  Layout xl, yl;
  std::vector<T> x, cos, sin;

  RopeProblem(int64_t B, int64_t S, int64_t H, int64_t D, int rot, bool half_split, Storage xs,
              Storage ys, bool shared_table, uint32_t seed)
      : xl(make_layout(xs, B, S, H, D)), yl(make_layout(ys, B, S, H, D)) {
    shape.B = B;
    shape.S = S;
    shape.H = H;
    shape.D = D;
    for (int k = 0; k < 4; ++k) {
      shape.x_st[k] = xl.st[k];
      shape.y_st[k] = yl.st[k];
    }
    const int64_t half = rot / 2;
    shape.cs_s = half + 2;
    shape.cs_b = shared_table ? 0 : S * shape.cs_s;
    shape.rot_dim = rot;
    shape.half_split = half_split;
    x = random_vec<T>(static_cast<size_t>(xl.size), seed, -2, 2);
    const std::vector<bool> m = in_view(xl, B, S, H, D);
    for (size_t i = 0; i < x.size(); ++i)
      if (!m[i]) x[i] = kNaN<T>;
    const Vec angle = random_vec<double>(
        static_cast<size_t>((shared_table ? 1 : B) * S * shape.cs_s), seed + 1, -20, 20);
    for (double a : angle) {
      cos.push_back(static_cast<T>(std::cos(a)));
      sin.push_back(static_cast<T>(std::sin(a)));
    }
  }

  std::vector<T> run(bool inverse) const {
    std::vector<T> y(static_cast<size_t>(yl.size), kNaN<T>);
    g::rope_rotate(y.data(), x.data(), cos.data(), sin.data(), shape, inverse);
    return y;
  }
};

// Checks y = rope(x) (or its inverse) element by element against a double computation on the
// same inputs and tables; elements of y's buffer outside its view must still be NaN.
template <class T>
void check_rope(const RopeProblem<T>& p, const std::vector<T>& y, bool inverse,
                const std::string& what) {
  const g::RopeShape& s = p.shape;
  const int64_t half = s.rot_dim / 2;
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t q = 0; q < s.S; ++q)
      for (int64_t h = 0; h < s.H; ++h) {
        const auto xat = [&](int64_t d) {
          return static_cast<double>(p.x[offset(p.xl, b, q, h, d)]);
        };
        const auto yat = [&](int64_t d) {
          return static_cast<double>(y[offset(p.yl, b, q, h, d)]);
        };
        for (int64_t i = 0; i < half; ++i) {
          const int64_t d0 = s.half_split ? i : 2 * i, d1 = s.half_split ? i + half : 2 * i + 1;
          const double c = p.cos[b * s.cs_b + q * s.cs_s + i];
          const double sn = (inverse ? -1.0 : 1.0) * p.sin[b * s.cs_b + q * s.cs_s + i];
          const double a = xat(d0), bb = xat(d1);
          // Two products and a sum in T: 2u + u^2 of the terms.
          const double tol0 = 3 * unit<T>() * (std::fabs(a * c) + std::fabs(bb * sn)) + 1e-300;
          const double tol1 = 3 * unit<T>() * (std::fabs(a * sn) + std::fabs(bb * c)) + 1e-300;
          ASSERT_NEAR(yat(d0), a * c - bb * sn, tol0)
              << what << " b=" << b << " s=" << q << " h=" << h << " d=" << d0;
          ASSERT_NEAR(yat(d1), a * sn + bb * c, tol1)
              << what << " b=" << b << " s=" << q << " h=" << h << " d=" << d1;
        }
        for (int64_t d = s.rot_dim; d < s.D; ++d) {
          ASSERT_EQ(yat(d), xat(d)) << what << ": dims past rot_dim must be copied, d=" << d;
        }
      }
  const std::vector<bool> m = in_view(p.yl, s.B, s.S, s.H, s.D);
  for (size_t i = 0; i < y.size(); ++i) {
    if (!m[i]) {
      ASSERT_TRUE(std::isnan(y[i])) << what << ": wrote outside the view at " << i;
    }
  }
}

struct RopeCase {
  int64_t D;
  int rot;
};
constexpr RopeCase kRopeCases[] = {{40, 40}, {40, 24}, {96, 96}, {96, 64}, {100, 100}, {100, 60}};
constexpr Storage kLayoutPairs[][2] = {
    {Storage::Contiguous, Storage::Contiguous},
    {Storage::HeadsFirst, Storage::Contiguous},
    {Storage::EveryOtherD, Storage::PaddedHeads},
    {Storage::Contiguous, Storage::HeadsFirst},
};

template <class T>
void check_rope_all() {
  uint32_t seed = 70;
  for (int64_t S : {1, 7, 33}) {
    for (const RopeCase& c : kRopeCases) {
      for (bool half_split : {true, false}) {
        for (const auto& lp : kLayoutPairs) {
          for (bool shared : {true, false}) {
            const RopeProblem<T> p(2, S, 3, c.D, c.rot, half_split, lp[0], lp[1], shared, seed++);
            expect_nontrivial(p.cos, "cos");
            for (bool inverse : {false, true}) {
              const std::string what =
                  std::string(type_name<T>()) + " S=" + std::to_string(S) +
                  " D=" + std::to_string(c.D) + " rot=" + std::to_string(c.rot) +
                  " half_split=" + std::to_string(half_split) +
                  " layouts=" + std::to_string(static_cast<int>(lp[0])) + "," +
                  std::to_string(static_cast<int>(lp[1])) + " shared=" + std::to_string(shared) +
                  " inverse=" + std::to_string(inverse);
              check_rope(p, p.run(inverse), inverse, what);
              if (::testing::Test::HasFatalFailure()) return;
            }
          }
        }
      }
    }
  }
}

TEST(GradRope, RotateMatchesDoubleReference) {
  check_rope_all<float>();
  check_rope_all<double>();
}

// y = x itself (same strides): the result of the out-of-place call, bit for bit, and the
// elements of the buffer outside the view untouched.
template <class T>
void check_rope_in_place() {
  uint32_t seed = 80;
  for (const RopeCase& c : kRopeCases) {
    for (bool half_split : {true, false}) {
      for (Storage st : {Storage::HeadsFirst, Storage::EveryOtherD}) {
        RopeProblem<T> p(2, 7, 3, c.D, c.rot, half_split, st, st, false, seed++);
        for (bool inverse : {false, true}) {
          const std::vector<T> want = p.run(inverse);
          std::vector<T> buf = p.x;
          g::rope_rotate(buf.data(), buf.data(), p.cos.data(), p.sin.data(), p.shape, inverse);
          const std::vector<bool> m = in_view(p.xl, 2, 7, 3, c.D);
          for (size_t i = 0; i < buf.size(); ++i) {
            if (m[i]) {
              ASSERT_EQ(buf[i], want[i]) << type_name<T>() << " D=" << c.D << " at " << i;
            } else {
              ASSERT_TRUE(std::isnan(buf[i])) << "wrote outside the view at " << i;
            }
          }
        }
      }
    }
  }
}

TEST(GradRope, InPlaceMatchesOutOfPlace) {
  check_rope_in_place<float>();
  check_rope_in_place<double>();
}

// inverse(rope(x)) = x up to rounding (cos^2 + sin^2 = 1 to within the tables' rounding).
template <class T>
void check_rope_round_trip() {
  uint32_t seed = 90;
  for (const RopeCase& c : kRopeCases) {
    for (bool half_split : {true, false}) {
      RopeProblem<T> p(2, 7, 3, c.D, c.rot, half_split, Storage::HeadsFirst, Storage::HeadsFirst,
                       true, seed++);
      const std::vector<T> x0 = p.x;
      p.x = p.run(false);
      const std::vector<T> back = p.run(true);
      const int64_t half = c.rot / 2;
      for (int64_t b = 0; b < 2; ++b)
        for (int64_t q = 0; q < 7; ++q)
          for (int64_t h = 0; h < 3; ++h)
            for (int64_t d = 0; d < c.D; ++d) {
              const int64_t partner = d >= c.rot   ? d
                                      : half_split ? (d < half ? d + half : d - half)
                                                   : (d ^ 1);
              const size_t i = static_cast<size_t>(offset(p.xl, b, q, h, d));
              const size_t k = static_cast<size_t>(offset(p.xl, b, q, h, partner));
              ASSERT_NEAR(back[i], x0[i], 12 * unit<T>() * (std::fabs(x0[i]) + std::fabs(x0[k])))
                  << type_name<T>() << " D=" << c.D << " rot=" << c.rot << " d=" << d;
            }
    }
  }
}

TEST(GradRope, InverseUndoesRotate) {
  check_rope_round_trip<float>();
  check_rope_round_trip<double>();
}

// The backward of y = rope(x) is dx = rope_inverse(dy): checked against finite differences of
// L = sum(dy * rope(x)), with tables from rope_table.
TEST(GradRope, InverseIsTheBackward) {
  const int64_t B = 2, S = 3, H = 2, D = 10;
  const int rot = 8, half = rot / 2;
  const std::vector<int64_t> pos = {0, 5, 17};
  Vec cs(S * half), sn(S * half);
  g::rope_table(cs.data(), sn.data(), pos.data(), S, rot, 1e4, 1.0, nullptr);
  for (bool half_split : {true, false}) {
    g::RopeShape s;
    s.B = B;
    s.S = S;
    s.H = H;
    s.D = D;
    const int64_t st[4] = {S * H * D, H * D, D, 1};
    for (int k = 0; k < 4; ++k) s.x_st[k] = s.y_st[k] = st[k];
    s.cs_b = 0;
    s.cs_s = half;
    s.rot_dim = rot;
    s.half_split = half_split;
    Vec x = random_vec<double>(B * S * H * D, 100, -2, 2);
    const Vec dy = random_vec<double>(x.size(), 101);
    const auto loss = [&] {
      Vec y(x.size());
      g::rope_rotate(y.data(), x.data(), cs.data(), sn.data(), s, false);
      return dot(dy, y);
    };
    Vec dx(x.size(), kNaN<double>);
    g::rope_rotate(dx.data(), dy.data(), cs.data(), sn.data(), s, true);
    expect_grad_near(dx, numeric_grad(loss, x), half_split ? "rope dx (half_split)" : "rope dx");
  }
}

// ---------------------------------------------------------------------------------------------
// gemm

// A gemm problem with padded leading dimensions; C's padding is NaN and must stay so.
template <class T>
struct GemmProblem {
  int64_t M, N, K, lda, ldb, ldc;
  bool ta, tb;
  T alpha, beta;
  std::vector<T> A, B, C;

  GemmProblem(int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b, double al, double be,
              uint32_t seed)
      : M(m),
        N(n),
        K(k),
        ta(trans_a),
        tb(trans_b),
        alpha(static_cast<T>(al)),
        beta(static_cast<T>(be)) {
    lda = (ta ? M : K) + 3;
    ldb = (tb ? K : N) + 5;
    ldc = N + 4;
    A = random_vec<T>(static_cast<size_t>((ta ? K : M) * lda), seed);
    B = random_vec<T>(static_cast<size_t>((tb ? N : K) * ldb), seed + 1);
    C = random_vec<T>(static_cast<size_t>(M * ldc), seed + 2, -2, 2);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < ldc; ++j)
        if (j >= N || beta == T(0)) C[static_cast<size_t>(i * ldc + j)] = kNaN<T>;
  }
  double a(int64_t i, int64_t k) const { return ta ? A[k * lda + i] : A[i * lda + k]; }
  double b(int64_t k, int64_t j) const { return tb ? B[j * ldb + k] : B[k * ldb + j]; }

  std::vector<T> run() const {
    std::vector<T> c = C;
    g::gemm(c.data(), ldc, A.data(), lda, ta, B.data(), ldb, tb, M, N, K, alpha, beta);
    return c;
  }

  std::string name() const {
    return std::string(type_name<T>()) + " M=" + std::to_string(M) + " N=" + std::to_string(N) +
           " K=" + std::to_string(K) + " trans_a=" + std::to_string(ta) +
           " trans_b=" + std::to_string(tb) + " alpha=" + std::to_string(alpha) +
           " beta=" + std::to_string(beta);
  }

  // Each element within (K + 3) u of |alpha| sum |a b| + |beta c| (recursive summation in T,
  // then the scaling); the padding still NaN.
  void check(const std::vector<T>& c) const {
    for (int64_t i = 0; i < M; ++i) {
      for (int64_t j = 0; j < ldc; ++j) {
        const size_t at = static_cast<size_t>(i * ldc + j);
        if (j >= N) {
          ASSERT_TRUE(std::isnan(c[at])) << name() << ": wrote C's padding";
          continue;
        }
        double sum = 0, mag = 0;
        for (int64_t k = 0; k < K; ++k) {
          sum += a(i, k) * b(k, j);
          mag += std::fabs(a(i, k) * b(k, j));
        }
        double want = static_cast<double>(alpha) * sum, bound = std::fabs(alpha) * mag;
        if (beta != T(0)) {
          want += static_cast<double>(beta) * C[at];
          bound += std::fabs(beta * C[at]);
        }
        ASSERT_NEAR(c[at], want, static_cast<double>(K + 3) * unit<T>() * bound + 1e-300)
            << name() << " at " << i << "," << j;
      }
    }
  }
};

template <class T>
void check_gemm_all() {
  uint32_t seed = 200;
  const double scalars[][2] = {{1, 0}, {-0.75, 0}, {0.5, 2}, {1, 1}};
  for (int64_t M : {1, 17, 70})
    for (int64_t N : {1, 17, 70})
      for (int64_t K : {1, 17, 70})
        for (bool ta : {false, true})
          for (bool tb : {false, true})
            for (const auto& ab : scalars) {
              const GemmProblem<T> p(M, N, K, ta, tb, ab[0], ab[1], seed += 3);
              p.check(p.run());
              if (::testing::Test::HasFatalFailure()) return;
            }
  // Past one tile in every dimension (32 x 256 x 256), with partial tiles.
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const GemmProblem<T> p(70, 300, 600, ta, tb, 0.5, 1.5, seed += 3);
      expect_nontrivial(p.A, "A");
      p.check(p.run());
      if (::testing::Test::HasFatalFailure()) return;
    }
}

TEST(GradGemm, AllTransposesMatchDoubleReference) {
  check_gemm_all<float>();
  check_gemm_all<double>();
}

TEST(GradGemm, ZeroAlphaOrZeroKScalesC) {
  for (int64_t K : {0, 5}) {
    for (double beta : {0.0, -1.5}) {
      GemmProblem<double> p(7, 9, K, false, true, K == 0 ? 1.0 : 0.0, beta, 300);
      // alpha = 0 must not read A or B: NaN there would show.
      if (K > 0) {
        p.A.assign(p.A.size(), kNaN<double>);
        p.B.assign(p.B.size(), kNaN<double>);
      }
      const std::vector<double> c = p.run();
      for (int64_t i = 0; i < p.M; ++i)
        for (int64_t j = 0; j < p.N; ++j) {
          const size_t at = static_cast<size_t>(i * p.ldc + j);
          ASSERT_EQ(c[at], beta == 0 ? 0.0 : beta * p.C[at]) << "K=" << K << " beta=" << beta;
        }
    }
  }
}

TEST(GradGemm, FloatMatchesDoubleOn512Cube) {
  const int64_t n = 512;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const GemmProblem<float> pf(n, n, n, ta, tb, 1, 0, 400);
      const auto t0 = std::chrono::steady_clock::now();
      const std::vector<float> cf = pf.run();
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      std::printf("gemm %lld^3 float trans_a=%d trans_b=%d: %.1f ms on %d threads\n",
                  static_cast<long long>(n), ta, tb, ms, cpu_pool().num_threads());
      GemmProblem<double> pd(n, n, n, ta, tb, 1, 0, 400);
      pd.A = Vec(pf.A.begin(), pf.A.end());  // the same (float) inputs
      pd.B = Vec(pf.B.begin(), pf.B.end());
      const Vec cd = pd.run();
      double err2 = 0, ref2 = 0;
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          const size_t at = static_cast<size_t>(i * pd.ldc + j);
          double mag = 0;
          for (int64_t k = 0; k < n; ++k) mag += std::fabs(pd.a(i, k) * pd.b(k, j));
          ASSERT_NEAR(cf[at], cd[at], static_cast<double>(n) * unit<float>() * mag)
              << pf.name() << " at " << i << "," << j;
          err2 += (cf[at] - cd[at]) * (cf[at] - cd[at]);
          ref2 += cd[at] * cd[at];
        }
      }
      // Typical rounding of a 512-term float sum is ~sqrt(512) u relative, well under 1e-5.
      EXPECT_LT(std::sqrt(err2 / ref2), 1e-5) << pf.name();
    }
  }
}

// ---------------------------------------------------------------------------------------------
// bias + activation

template <class T>
void check_bias_act_fwd() {
  uint32_t seed = 500;
  for (g::Act act : kActs) {
    for (int64_t rows : {1, 7, 33}) {
      for (int64_t N : {40, 96, 100}) {
        for (bool with_bias : {true, false}) {
          const size_t n = static_cast<size_t>(rows * N);
          const auto z0 = random_vec<T>(n, seed++, -5, 5);
          const auto bias = random_vec<T>(static_cast<size_t>(N), seed++);
          const T* bp = with_bias ? bias.data() : nullptr;
          std::vector<T> z = z0, y(n, kNaN<T>);
          g::bias_act_fwd(y.data(), z.data(), bp, rows, N, act);
          for (size_t i = 0; i < n; ++i) {
            const T want_z = with_bias ? z0[i] + bias[i % static_cast<size_t>(N)] : z0[i];
            ASSERT_EQ(z[i], want_z) << "z must become z + bias";
            const double a = act_ref(z[i], act);
            ASSERT_NEAR(y[i], a, act_tol<T>(z[i]) + unit<T>() * std::fabs(a))
                << type_name<T>() << " " << act_name(act) << " rows=" << rows << " N=" << N
                << " z=" << z[i];
          }
          std::vector<T> zy = z0;  // y = z itself
          g::bias_act_fwd(zy.data(), zy.data(), bp, rows, N, act);
          ASSERT_EQ(zy, y) << act_name(act);
        }
      }
    }
  }
}

TEST(GradBiasAct, ForwardMatchesDoubleReference) {
  check_bias_act_fwd<float>();
  check_bias_act_fwd<double>();
}

TEST(GradBiasAct, BackwardMatchesFiniteDifferences) {
  const int64_t rows = 3, N = 4;
  for (g::Act act : kActs) {
    Vec z0 = random_vec<double>(rows * N, 600, -3, 3), bias = random_vec<double>(N, 601);
    const Vec dy = random_vec<double>(z0.size(), 602);
    const auto loss = [&] {
      Vec z = z0, y(z0.size());
      g::bias_act_fwd(y.data(), z.data(), bias.data(), rows, N, act);
      return dot(dy, y);
    };
    Vec z = z0, y(z0.size()), dz(z0.size(), kNaN<double>), db(N, kNaN<double>);
    g::bias_act_fwd(y.data(), z.data(), bias.data(), rows, N, act);
    g::bias_act_bwd(dz.data(), db.data(), dy.data(), z.data(), rows, N, act);
    expect_grad_near(dz, numeric_grad(loss, z0), std::string("dz ") + act_name(act));
    expect_grad_near(db, numeric_grad(loss, bias), std::string("db ") + act_name(act));

    Vec inplace = dy, db2(N, kNaN<double>);  // dz = dy itself, and db = null
    g::bias_act_bwd(inplace.data(), static_cast<double*>(nullptr), inplace.data(), z.data(), rows,
                    N, act);
    EXPECT_EQ(inplace, dz) << act_name(act);
    g::bias_act_bwd(inplace.data(), db2.data(), dy.data(), z.data(), rows, N, act);
    EXPECT_EQ(db2, db) << act_name(act);
  }
}

TEST(GradBiasAct, FloatBackwardMatchesDouble) {
  uint32_t seed = 700;
  for (g::Act act : kActs) {
    for (int64_t rows : {1, 33, 300}) {
      for (int64_t N : {40, 100, 700}) {
        const size_t n = static_cast<size_t>(rows * N);
        const auto z = random_vec<float>(n, seed++, -6, 6), dy = random_vec<float>(n, seed++);
        std::vector<float> dz(n, kNaN<float>), db(static_cast<size_t>(N), kNaN<float>);
        g::bias_act_bwd(dz.data(), db.data(), dy.data(), z.data(), rows, N, act);
        const Vec zd = to_double(z), dyd = to_double(dy);
        Vec dzd(n), dbd(static_cast<size_t>(N));
        g::bias_act_bwd(dzd.data(), dbd.data(), dyd.data(), zd.data(), rows, N, act);
        const double u = unit<float>();
        Vec db_tol(static_cast<size_t>(N), 0.0);
        for (size_t i = 0; i < n; ++i) {
          const double x = zd[i];
          const double tol = 32 * u * (1 + x * x) * std::fabs(dyd[i]) + 1e-30;
          ASSERT_NEAR(dz[i], dzd[i], tol) << act_name(act) << " z=" << x;
          db_tol[i % static_cast<size_t>(N)] += tol;
        }
        for (int64_t j = 0; j < N; ++j) {
          ASSERT_NEAR(db[j], dbd[j], db_tol[j] + u * std::fabs(dbd[j])) << act_name(act);
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------

// Sums are in a fixed order: the same bits for any number of threads.
TEST(GradDeterminism, ResultsDoNotDependOnThreadCount) {
  const int64_t rows = 300, N = 700;
  const auto x = random_vec<float>(rows * N, 800), dy = random_vec<float>(rows * N, 801);
  const auto w = random_vec<float>(N, 802, 0.5, 1.5);
  struct Out {
    std::vector<float> dx, dw, dz, db, c;
  };
  const auto run_all = [&] {
    Out o{std::vector<float>(x.size()),
          std::vector<float>(N),
          std::vector<float>(x.size()),
          std::vector<float>(N),
          {}};
    std::vector<float> y(x.size()), rstd(rows);
    g::rms_norm_fwd(y.data(), rstd.data(), x.data(), w.data(), rows, N, 1e-6);
    g::rms_norm_bwd(o.dx.data(), o.dw.data(), dy.data(), x.data(), w.data(), rstd.data(), rows, N);
    g::bias_act_bwd(o.dz.data(), o.db.data(), dy.data(), x.data(), rows, N, g::Act::GeluTanh);
    o.c = GemmProblem<float>(100, 300, 600, true, false, 1, 0, 803).run();
    return o;
  };
  set_num_threads(1);
  const Out one = run_all();
  set_num_threads(5);
  const Out five = run_all();
  set_num_threads(0);
  EXPECT_EQ(one.dx, five.dx);
  EXPECT_EQ(one.dw, five.dw);
  EXPECT_EQ(one.dz, five.dz);
  EXPECT_EQ(one.db, five.db);
  // NaN padding compares unequal: compare the bits.
  ASSERT_EQ(one.c.size(), five.c.size());
  EXPECT_EQ(0, std::memcmp(one.c.data(), five.c.data(), one.c.size() * sizeof(float)));
}

}  // namespace
}  // namespace llmk
