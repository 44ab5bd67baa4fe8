// The training ops' CUDA kernels (kernels/cuda/grad.h) against their CPU reference in double
// (kernels/cpu/grad.h): add, gated_fwd / gated_bwd, rms_norm_fwd (with and without the residual)
// / rms_norm_bwd (with and without dw), rope_rotate (forward and inverse), for bf16, fp16 and
// f32 storage. Inputs are random and never zero, rounded to the element type once; the
// reference reads those same values as doubles, so the comparison measures the kernel, not the
// input rounding. Outputs are poisoned (NaN) first: an element left unwritten fails, and so does
// one written outside the output. Element offsets of one (2 or 4 bytes off 16-byte alignment),
// sizes not a multiple of the vector width, a D stride of 2 and misaligned tables reach the
// element-by-element kernels; the rest the vector kernels.
//
// Tolerances, element by element: |got - ref| <= u |ref| + tiny + e_fp32, where
// - u is the unit roundoff of the output type (one rounding to nearest: bf16 keeps 8
//   significant bits, u = 2^-8; fp16 11, u = 2^-11; f32 24, u = 2^-24), and tiny the
//   absolute error of rounding into fp16's subnormal range (half its spacing, 2^-25; 0 for bf16
//   and f32, whose exponent range covers these values);
// - e_fp32 bounds the fp32 arithmetic before that rounding (against the exact math of the
//   double reference), worked out per op below from the sizes of the terms that are summed;
//   where an error term is relative to the inputs rather than the result (cancellation, and
//   outputs near 0 such as GELU of a negative input) it is scaled by those inputs.
// The kernel's fp32 result can differ from the exact value by e_fp32 and then round across a
// midpoint, which still lands within u |ref| + e_fp32 (up to a factor 1 + u). Ops whose fp32
// math is exact up to its one rounding (add, the residual sum, RoPE's copied dims) must match
// bit for bit.
#include "kernels/cpu/grad.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numbers>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "core/cuda/device.h"
#include "core/cuda/stream.h"
#include "core/half.h"
#include "kernels/cuda/grad.h"
#include "ops_gpu_util.h"

namespace llmk::gpu_test {
namespace {

namespace cg = cuda::grad;
namespace rg = cpu::grad;
using bf16 = __nv_bfloat16;
using Act = rg::Act;
using RopeShape = rg::RopeShape;

// ---------------------------------------------------------------------------------------------
// Element types on the host: f32 as float, bf16 and fp16 as their 16-bit patterns.

template <class T>
using Bits = std::conditional_t<std::is_same_v<T, float>, float, uint16_t>;

template <class T>
struct Elem;
template <>
struct Elem<float> {
  static constexpr DType kType = DType::F32;
  static constexpr double kU = 0x1p-24, kTiny = 0;
  static constexpr const char* kName = "f32";
};
template <>
struct Elem<bf16> {
  static constexpr DType kType = DType::BF16;
  static constexpr double kU = 0x1p-8, kTiny = 0;
  static constexpr const char* kName = "bf16";
};
template <>
struct Elem<__half> {
  static constexpr DType kType = DType::F16;
  static constexpr double kU = 0x1p-11, kTiny = 0x1p-25;
  static constexpr const char* kName = "f16";
};

// Rounds f to T (to nearest even, as the kernels' __float2bfloat16_rn / __float2half_rn).
template <class T>
Bits<T> encode(float f) {
  if constexpr (std::is_same_v<T, float>) {
    return f;
  } else if constexpr (std::is_same_v<T, bf16>) {
    return float_to_bf16(f);
  } else {
    return float_to_fp16(f);
  }
}

template <class T>
float decode(Bits<T> b) {
  if constexpr (std::is_same_v<T, float>) {
    return b;
  } else if constexpr (std::is_same_v<T, bf16>) {
    return bf16_to_float(b);
  } else {
    return fp16_to_float(b);
  }
}

// The bits poisoned_cuda's 0xFF bytes leave (NaN in every type).
template <class T>
bool is_poison(Bits<T> b) {
  if constexpr (std::is_same_v<T, float>) {
    uint32_t u;
    std::memcpy(&u, &b, 4);
    return u == 0xFFFFFFFFu;
  } else {
    return b == 0xFFFFu;
  }
}

template <class T>
bool same_bits(Bits<T> a, Bits<T> b) {
  return std::memcmp(&a, &b, sizeof a) == 0;
}

// n values in T, uniform in magnitude over [lo, hi) (lo > 0) with a random sign: never zero.
template <class T>
struct HostArray {
  std::vector<Bits<T>> bits;
  std::vector<double> val;  // the same values, widened
};

template <class T>
HostArray<T> random_array(int64_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> mag(lo, hi);
  HostArray<T> a;
  a.bits.resize(static_cast<size_t>(n));
  a.val.resize(static_cast<size_t>(n));
  for (size_t i = 0; i < a.bits.size(); ++i) {
    const float v = (rng() & 1) ? mag(rng) : -mag(rng);
    a.bits[i] = encode<T>(v);
    a.val[i] = decode<T>(a.bits[i]);
  }
  return a;
}

// A device array of n elements of T, poisoned; data is uploaded at an element offset.
template <class T>
class DevArray {
 public:
  explicit DevArray(int64_t n)
      : n_(std::max<int64_t>(n, 1)), t_(poisoned_cuda({n_}, Elem<T>::kType)) {}
  T* at(int64_t offset = 0) const { return static_cast<T*>(t_.data()) + offset; }
  void upload(const std::vector<Bits<T>>& h, int64_t offset = 0) {
    ASSERT_LE(offset + static_cast<int64_t>(h.size()), n_);
    cuda::memcpy_sync(at(offset), h.data(), h.size() * sizeof(Bits<T>), cudaMemcpyHostToDevice);
  }
  std::vector<Bits<T>> download() const {
    std::vector<Bits<T>> h(static_cast<size_t>(n_));
    cuda::memcpy_sync(h.data(), at(), h.size() * sizeof(Bits<T>), cudaMemcpyDeviceToHost);
    return h;
  }

 private:
  int64_t n_;
  Tensor t_;
};

// Elements of h outside [begin, end) that are no longer poison.
template <class T>
int64_t written_outside(const std::vector<Bits<T>>& h, int64_t begin, int64_t end) {
  int64_t n = 0;
  for (int64_t i = 0; i < static_cast<int64_t>(h.size()); ++i) {
    if ((i < begin || i >= end) && !is_poison<T>(h[static_cast<size_t>(i)])) ++n;
  }
  return n;
}

// Fails where |got - ref| > bound for some element (the first few listed), where an output is
// not finite (left unwritten), or where every reference value is zero (a vacuous pass).
void expect_near(const std::string& what, const std::vector<double>& got,
                 const std::vector<double>& ref, const std::vector<double>& bound) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  ASSERT_EQ(bound.size(), ref.size()) << what;
  int64_t bad = 0, nonfinite = 0, first_nonfinite = -1;
  double max_ref = 0;
  std::ostringstream first;
  first.precision(9);
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) {
      if (nonfinite++ == 0) first_nonfinite = static_cast<int64_t>(i);
      continue;
    }
    max_ref = std::max(max_ref, std::abs(ref[i]));
    if (std::abs(got[i] - ref[i]) > bound[i]) {
      if (bad++ < 4) {
        first << " [" << i << "] got " << got[i] << " want " << ref[i] << " (bound " << bound[i]
              << ");";
      }
    }
  }
  EXPECT_EQ(nonfinite, 0) << what << ": not written (or not finite), the first at "
                          << first_nonfinite;
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.size()
                    << " out of bounds:" << first.str();
  EXPECT_GT(max_ref, 0.0) << what << ": the reference is all zeros";
}

template <class T>
std::vector<double> decoded(const std::vector<Bits<T>>& h, int64_t offset, int64_t n) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = decode<T>(h[offset + i]);
  return v;
}

// u |ref| + tiny: the output rounding.
template <class T>
double rounding(double ref) {
  return Elem<T>::kU * std::abs(ref) + Elem<T>::kTiny;
}

template <class T>
std::string name(const char* op) {
  return std::string(op) + " " + Elem<T>::kName;
}

using CudaGrad = CudaOpTest;

// ---------------------------------------------------------------------------------------------
// add: the fp32 sum of two T values rounded once, as the host computes it: bit for bit.

template <class T>
void check_add(int64_t n, int64_t off_out, int64_t off_a, int64_t off_b, bool in_place,
               uint32_t seed) {
  const std::string what = name<T>("add") + " n=" + std::to_string(n) +
                           " offsets=" + std::to_string(off_out) + std::to_string(off_a) +
                           std::to_string(off_b) + (in_place ? " in place" : "");
  const HostArray<T> a = random_array<T>(n, seed, 0.01f, 4.0f);
  const HostArray<T> b = random_array<T>(n, seed + 1, 0.01f, 4.0f);
  DevArray<T> da(n + 9), db(n + 9), dout(n + 9);
  da.upload(a.bits, off_a);
  db.upload(b.bits, off_b);
  T* out = in_place ? da.at(off_a) : dout.at(off_out);
  cg::add(out, da.at(off_a), db.at(off_b), n);
  const std::vector<Bits<T>> got = in_place ? da.download() : dout.download();
  const int64_t off = in_place ? off_a : off_out;
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float sum = decode<T>(a.bits[i]) + decode<T>(b.bits[i]);
    bad += !same_bits<T>(got[off + i], encode<T>(sum));
  }
  EXPECT_EQ(bad, 0) << what << ": elements that differ from the rounded fp32 sum";
  if (!in_place) {
    EXPECT_EQ(written_outside<T>(got, off, off + n), 0) << what;
  }
}

template <class T>
void add_cases() {
  uint32_t seed = 100;
  for (const int64_t n : {int64_t{1}, int64_t{7}, int64_t{8}, (int64_t{1} << 20) + 3}) {
    check_add<T>(n, 0, 0, 0, false, seed += 2);
    check_add<T>(n, 1, 1, 1, false, seed += 2);  // all unaligned: element by element
    check_add<T>(n, 0, 1, 0, false, seed += 2);  // one input unaligned
    check_add<T>(n, 0, 0, 0, true, seed += 2);   // out = a
  }
}

TEST_F(CudaGrad, AddIsTheRoundedFp32Sum) {
  add_cases<float>();
  add_cases<bf16>();
  add_cases<__half>();
}

// ---------------------------------------------------------------------------------------------
// gated_fwd / gated_bwd. fp32 error of act(g) and act'(g) (g the gate, |g| < 6): SiLU's
// sigmoid and GELU-erf's normcdff are within a few ulps relative; GELU-tanh forms 1 + t and
// (1 - t)(1 + t) from tanhf's t, whose error of a few 2^-24 is absolute, then scales them by
// up to 0.5 |g| (1 + 3 * 0.044715 g^2) sqrt(2/pi) < (1 + |g|)^2 / 2. Hence, with 2^-18 for
// "a few ulps" (64 of them):
//   out   = act(g) up:          2^-18 (|ref| + (1 + |g|) |up|)
//   dup   = dout act(g):        2^-18 (|ref| + (1 + |g|) |dout|)
//   dgate = dout up act'(g):    2^-18 (|ref| + (1 + |g|)^2 |dout up|)

const char* act_name(Act act) {
  switch (act) {
    case Act::SiLU:
      return "silu";
    case Act::GeluTanh:
      return "gelu_tanh";
    case Act::GeluErf:
      return "gelu_erf";
    case Act::None:
      return "none";
  }
  return "?";
}

template <class T>
void check_gated(Act act, int64_t n, int64_t off, bool in_place, uint32_t seed) {
  const std::string what = name<T>("gated") + " " + act_name(act) + " n=" + std::to_string(n) +
                           " offset=" + std::to_string(off) + (in_place ? " in place" : "");
  const HostArray<T> gate = random_array<T>(n, seed, 0.05f, 6.0f);
  const HostArray<T> up = random_array<T>(n, seed + 1, 0.1f, 2.0f);
  const HostArray<T> dout = random_array<T>(n, seed + 2, 0.1f, 2.0f);
  DevArray<T> dgate_in(n + 9), dup_in(n + 9), ddout(n + 9), dfwd(n + 9), ddg(n + 9), ddu(n + 9);
  dgate_in.upload(gate.bits, off);
  dup_in.upload(up.bits, off);
  ddout.upload(dout.bits, off);
  std::vector<double> out_ref(static_cast<size_t>(n)), dg_ref(out_ref.size()),
      du_ref(out_ref.size());
  rg::gated_fwd<double>(out_ref.data(), gate.val.data(), up.val.data(), n, act);
  rg::gated_bwd<double>(dg_ref.data(), du_ref.data(), dout.val.data(), gate.val.data(),
                        up.val.data(), n, act);
  std::vector<double> b_out(out_ref.size()), b_dg(out_ref.size()), b_du(out_ref.size());
  for (size_t i = 0; i < out_ref.size(); ++i) {
    const double g1 = 1 + std::abs(gate.val[i]), u = std::abs(up.val[i]), d = std::abs(dout.val[i]);
    b_out[i] = rounding<T>(out_ref[i]) + 0x1p-18 * (std::abs(out_ref[i]) + g1 * u);
    b_du[i] = rounding<T>(du_ref[i]) + 0x1p-18 * (std::abs(du_ref[i]) + g1 * d);
    b_dg[i] = rounding<T>(dg_ref[i]) + 0x1p-18 * (std::abs(dg_ref[i]) + g1 * g1 * d * u);
  }
  if (!in_place) {
    cg::gated_fwd(dfwd.at(off), dgate_in.at(off), dup_in.at(off), n, act);
    cg::gated_bwd(ddg.at(off), ddu.at(off), ddout.at(off), dgate_in.at(off), dup_in.at(off), n,
                  act);
    const auto fwd = dfwd.download(), dg = ddg.download(), du = ddu.download();
    expect_near(what + " out", decoded<T>(fwd, off, n), out_ref, b_out);
    expect_near(what + " dgate", decoded<T>(dg, off, n), dg_ref, b_dg);
    expect_near(what + " dup", decoded<T>(du, off, n), du_ref, b_du);
    EXPECT_EQ(written_outside<T>(fwd, off, off + n), 0) << what << " out";
    EXPECT_EQ(written_outside<T>(dg, off, off + n), 0) << what << " dgate";
    EXPECT_EQ(written_outside<T>(du, off, off + n), 0) << what << " dup";
    return;
  }
  // The backward over its inputs (dgate over gate, dup over up), then the forward over dout.
  cg::gated_bwd(dgate_in.at(off), dup_in.at(off), ddout.at(off), dgate_in.at(off), dup_in.at(off),
                n, act);
  expect_near(what + " dgate", decoded<T>(dgate_in.download(), off, n), dg_ref, b_dg);
  expect_near(what + " dup", decoded<T>(dup_in.download(), off, n), du_ref, b_du);
  dgate_in.upload(gate.bits, off);
  dup_in.upload(up.bits, off);
  cg::gated_fwd(dgate_in.at(off), dgate_in.at(off), dup_in.at(off), n, act);
  expect_near(what + " out", decoded<T>(dgate_in.download(), off, n), out_ref, b_out);
}

template <class T>
void gated_cases() {
  uint32_t seed = 200;
  for (const Act act : {Act::SiLU, Act::GeluTanh, Act::GeluErf, Act::None}) {
    for (const int64_t n : {int64_t{1}, int64_t{7}, (int64_t{1} << 20) + 3}) {
      for (const int64_t off : {0, 1}) check_gated<T>(act, n, off, false, seed += 3);
    }
    check_gated<T>(act, 4099, 0, true, seed += 3);
  }
}

TEST_F(CudaGrad, GatedMatchesCpu) {
  gated_cases<float>();
  gated_cases<bf16>();
  gated_cases<__half>();
}

// ---------------------------------------------------------------------------------------------
// rms_norm_fwd. The fp32 sum of squares of a row passes each term through at most ~64
// additions (a thread's own elements, then a tree over the team), so it is within 64 * 2^-24
// relative; rsqrtf adds 2 ulps and the products x * rstd * w two roundings. y and rstd are
// therefore within 2^-17 relative of the exact values (a factor of 2 to spare). The residual
// sum is the fp32 sum rounded once: bit for bit.

constexpr float kEps = 1e-5f;

template <class T>
void check_rms_norm_fwd(int64_t rows, int64_t D, bool residual, int64_t off, uint32_t seed) {
  const std::string what = name<T>("rms_norm_fwd") + " rows=" + std::to_string(rows) +
                           " D=" + std::to_string(D) + " offset=" + std::to_string(off) +
                           (residual ? " residual" : "");
  const int64_t n = rows * D;
  const HostArray<T> x = random_array<T>(n, seed, 0.1f, 2.0f);
  const HostArray<T> r = residual ? random_array<T>(n, seed + 1, 0.1f, 2.0f) : HostArray<T>{};
  const HostArray<T> w = random_array<T>(D, seed + 2, 0.5f, 1.5f);
  DevArray<T> dx(n + 9), dr(n + 9), dsum(n + 9), dy(n + 9), dw(D + 9);
  DevArray<float> drstd(rows + 8);
  dx.upload(x.bits, off);
  if (residual) dr.upload(r.bits, off);
  dw.upload(w.bits, off);
  cg::rms_norm_fwd(dy.at(off), drstd.at(), dx.at(off), residual ? dr.at(off) : nullptr,
                   residual ? dsum.at(off) : nullptr, dw.at(off), rows, D, kEps);
  // What is normalised: x, or the sum as the kernel must store it.
  std::vector<Bits<T>> sum_bits;
  std::vector<double> v = x.val;
  if (residual) {
    sum_bits.resize(static_cast<size_t>(n));
    for (size_t i = 0; i < sum_bits.size(); ++i) {
      sum_bits[i] = encode<T>(decode<T>(x.bits[i]) + decode<T>(r.bits[i]));
      v[i] = decode<T>(sum_bits[i]);
    }
    const auto got_sum = dsum.download();
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) bad += !same_bits<T>(got_sum[off + i], sum_bits[i]);
    EXPECT_EQ(bad, 0) << what << ": sum elements that differ from the rounded fp32 sum";
    EXPECT_EQ(written_outside<T>(got_sum, off, off + n), 0) << what << " sum";
  }
  std::vector<double> y_ref(static_cast<size_t>(n)), rstd_ref(static_cast<size_t>(rows));
  rg::rms_norm_fwd<double>(y_ref.data(), rstd_ref.data(), v.data(), w.val.data(), rows, D, kEps);
  std::vector<double> b_y(y_ref.size()), b_rstd(rstd_ref.size());
  for (size_t i = 0; i < y_ref.size(); ++i) {
    b_y[i] = rounding<T>(y_ref[i]) + 0x1p-17 * std::abs(y_ref[i]);
  }
  for (size_t i = 0; i < rstd_ref.size(); ++i) b_rstd[i] = 0x1p-17 * rstd_ref[i];
  const auto got_y = dy.download();
  expect_near(what + " y", decoded<T>(got_y, off, n), y_ref, b_y);
  EXPECT_EQ(written_outside<T>(got_y, off, off + n), 0) << what << " y";
  const auto got_rstd = drstd.download();
  expect_near(what + " rstd", decoded<float>(got_rstd, 0, rows), rstd_ref, b_rstd);
  EXPECT_EQ(written_outside<float>(got_rstd, 0, rows), 0) << what << " rstd";
}

// Widths: 1; 40, 96 and 4096 whole vectors (small teams sharing blocks, a block per row);
// 100 (not a multiple of 8: element by element for 16-bit types); 8200 (the widest teams for
// 16-bit types, element by element for f32). Rows: one, a few, and enough that resident
// blocks loop over several rows each.
constexpr int64_t kNormRows[] = {1, 7, 33, 1000};
constexpr int64_t kNormWidths[] = {1, 40, 96, 100, 4096, 8200};

// The (rows, D) pairs the norm tests run: every row count with every width (but 1000 rows of
// 8200), and 40000 rows of 40 (small teams, many rows per resident block).
std::vector<std::pair<int64_t, int64_t>> norm_shapes() {
  std::vector<std::pair<int64_t, int64_t>> s;
  for (const int64_t rows : kNormRows) {
    for (const int64_t D : kNormWidths) {
      if (rows * D <= 4'200'000) s.emplace_back(rows, D);
    }
  }
  s.emplace_back(40000, 40);
  return s;
}

template <class T>
void rms_norm_fwd_cases() {
  uint32_t seed = 300;
  for (const auto& [rows, D] : norm_shapes()) {
    for (const bool residual : {false, true}) {
      for (const int64_t off : {0, 1}) check_rms_norm_fwd<T>(rows, D, residual, off, seed += 3);
    }
  }
}

TEST_F(CudaGrad, RmsNormForwardMatchesCpu) {
  rms_norm_fwd_cases<float>();
  rms_norm_fwd_cases<bf16>();
  rms_norm_fwd_cases<__half>();
}

TEST_F(CudaGrad, RmsNormForwardInPlace) {
  // The sum over x (x += residual, as a training layer keeps its residual stream), y elsewhere;
  // the vector kernel (D = 4096) and the element-by-element one (D = 100).
  for (const int64_t D : {4096, 100}) {
    const std::string what = "rms_norm_fwd sum over x D=" + std::to_string(D);
    const int64_t rows = 9, n = rows * D;
    const HostArray<bf16> x = random_array<bf16>(n, 11, 0.1f, 2.0f);
    const HostArray<bf16> r = random_array<bf16>(n, 12, 0.1f, 2.0f);
    const HostArray<bf16> w = random_array<bf16>(D, 13, 0.5f, 1.5f);
    DevArray<bf16> dx(n), dr(n), dw(D), dy(n);
    DevArray<float> drstd(rows);
    dx.upload(x.bits);
    dr.upload(r.bits);
    dw.upload(w.bits);
    cg::rms_norm_fwd(dy.at(), drstd.at(), dx.at(), dr.at(), dx.at(), dw.at(), rows, D, kEps);
    std::vector<uint16_t> sum(static_cast<size_t>(n));
    std::vector<double> v(sum.size());
    for (size_t i = 0; i < v.size(); ++i) {
      sum[i] = encode<bf16>(decode<bf16>(x.bits[i]) + decode<bf16>(r.bits[i]));
      v[i] = decode<bf16>(sum[i]);
    }
    EXPECT_EQ(dx.download(), sum) << what << ": x does not hold the rounded fp32 sum";
    std::vector<double> y_ref(v.size()), rstd_ref(static_cast<size_t>(rows)), b(v.size());
    rg::rms_norm_fwd<double>(y_ref.data(), rstd_ref.data(), v.data(), w.val.data(), rows, D, kEps);
    for (size_t i = 0; i < b.size(); ++i) {
      b[i] = rounding<bf16>(y_ref[i]) + 0x1p-17 * std::abs(y_ref[i]);
    }
    expect_near(what + " y", decoded<bf16>(dy.download(), 0, n), y_ref, b);
  }
}

// ---------------------------------------------------------------------------------------------
// rms_norm_bwd, with rstd the float the forward would store (the reference reads the same
// float). dx = rstd dy w - c x with c = rstd^3 sum(dy w x) / D: the fp32 dot product is within
// 64 * 2^-24 of sum |dy w x| (as the forward's sum of squares), which c carries times
// |x| rstd^3 / D, and each of the two terms has a few roundings of its own, so
//   |dx - ref| <= u |ref| + tiny + 2^-16 (rstd |dy w| + |x| rstd^3 M),  M = sum |dy w x| / D.
// dw[j] sums dy x rstd over the rows in fp32: each term passes through at most L additions,
// L = (rows a resident block takes: at most ceil(rows / min(rows, SMs))) + 256 (the teams of a
// block) + (partials / 32: at most 4 * SMs / 32) + 32, and two roundings of its own, so
//   |dw - ref| <= u |ref| + tiny + (L + 2) 2^-24 sum |dy x rstd|.

// Where the backward writes dx: its own buffer, over dy, or (with a residual gradient dres added)
// its own buffer or over dres.
enum class NormDx { Own, OverDy, Dres, OverDres };

template <class T>
void check_rms_norm_bwd(int64_t rows, int64_t D, bool with_dw, int64_t off, uint32_t seed,
                        NormDx mode = NormDx::Own) {
  static constexpr const char* kModes[] = {"", " dx over dy", " dres", " dx over dres"};
  const std::string what = name<T>("rms_norm_bwd") + " rows=" + std::to_string(rows) +
                           " D=" + std::to_string(D) + " offset=" + std::to_string(off) +
                           (with_dw ? " dw" : "") + kModes[static_cast<int>(mode)];
  const bool with_dres = mode == NormDx::Dres || mode == NormDx::OverDres;
  const int64_t n = rows * D;
  const HostArray<T> dy = random_array<T>(n, seed, 0.1f, 2.0f);
  const HostArray<T> x = random_array<T>(n, seed + 1, 0.1f, 2.0f);
  const HostArray<T> w = random_array<T>(D, seed + 2, 0.5f, 1.5f);
  const HostArray<T> dres = random_array<T>(n, seed + 3, -2.0f, 2.0f);
  std::vector<float> rstd(static_cast<size_t>(rows));
  std::vector<double> rstd_d(rstd.size());
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t j = 0; j < D; ++j) ss += x.val[r * D + j] * x.val[r * D + j];
    rstd[r] = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(D) + kEps));
    rstd_d[r] = rstd[r];
  }
  DevArray<T> ddy(n + 9), dx_in(n + 9), dw_in(D + 9), ddx(n + 9), ddw(D + 9), ddres(n + 9);
  DevArray<float> drstd(rows);
  const size_t ws_bytes = cg::rms_norm_bwd_workspace(rows, D);
  DevArray<float> ws(static_cast<int64_t>(ws_bytes / sizeof(float)));
  ddy.upload(dy.bits, off);
  dx_in.upload(x.bits, off);
  dw_in.upload(w.bits, off);
  ddres.upload(dres.bits, off);
  cuda::memcpy_sync(drstd.at(), rstd.data(), rstd.size() * sizeof(float), cudaMemcpyHostToDevice);
  DevArray<T>& dx_out = mode == NormDx::OverDy ? ddy : mode == NormDx::OverDres ? ddres : ddx;
  const auto run = [&] {
    cg::rms_norm_bwd(dx_out.at(off), with_dw ? ddw.at(off) : nullptr, with_dw ? ws.at() : nullptr,
                     ddy.at(off), dx_in.at(off), dw_in.at(off), drstd.at(), rows, D,
                     with_dres ? ddres.at(off) : nullptr);
  };
  run();
  std::vector<double> dx_ref(static_cast<size_t>(n)), dw_ref(static_cast<size_t>(D));
  rg::rms_norm_bwd<double>(dx_ref.data(), with_dw ? dw_ref.data() : nullptr, dy.val.data(),
                           x.val.data(), w.val.data(), rstd_d.data(), rows, D,
                           with_dres ? dres.val.data() : nullptr);
  std::vector<double> b_dx(dx_ref.size());
  for (int64_t r = 0; r < rows; ++r) {
    const double inv = rstd_d[r];
    double m = 0;
    for (int64_t j = 0; j < D; ++j) m += std::abs(dy.val[r * D + j] * w.val[j] * x.val[r * D + j]);
    m /= static_cast<double>(D);
    for (int64_t j = 0; j < D; ++j) {
      const size_t i = static_cast<size_t>(r * D + j);
      // (dres adds one fp32 rounding: 2^-24 of the sum, inside the 2^-16 allowance's reach.)
      b_dx[i] = rounding<T>(dx_ref[i]) + 0x1p-16 * (inv * std::abs(dy.val[i] * w.val[j]) +
                                                    std::abs(x.val[i]) * inv * inv * inv * m +
                                                    (with_dres ? std::abs(dres.val[i]) : 0.0));
    }
  }
  const auto got_dx = dx_out.download();
  expect_near(what + " dx", decoded<T>(got_dx, off, n), dx_ref, b_dx);
  EXPECT_EQ(written_outside<T>(got_dx, off, off + n), 0) << what << " dx";
  const auto got_dw = ddw.download();
  if (!with_dw) {
    EXPECT_EQ(written_outside<T>(got_dw, 0, 0), 0) << what << ": dw written without being asked";
    return;
  }
  const int64_t sms = cuda::device_info().sm_count;
  const double chain = static_cast<double>((rows + std::min(rows, sms) - 1) / std::min(rows, sms) +
                                           256 + (4 * sms + 31) / 32 + 32 + 2);
  std::vector<double> b_dw(dw_ref.size(), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < D; ++j) {
      b_dw[j] += std::abs(dy.val[r * D + j] * x.val[r * D + j] * rstd_d[r]);
    }
  }
  for (size_t j = 0; j < b_dw.size(); ++j) {
    b_dw[j] = rounding<T>(dw_ref[j]) + chain * 0x1p-24 * b_dw[j];
  }
  expect_near(what + " dw", decoded<T>(got_dw, off, D), dw_ref, b_dw);
  EXPECT_EQ(written_outside<T>(got_dw, off, off + D), 0) << what << " dw";
  if (mode == NormDx::OverDy || mode == NormDx::OverDres) return;  // an input is gone
  // Deterministic: a second run gives the same bits.
  run();
  const auto dx2 = ddx.download(), dw2 = ddw.download();
  EXPECT_EQ(std::memcmp(dx2.data(), got_dx.data(), dx2.size() * sizeof(Bits<T>)), 0)
      << what << ": dx differs between two runs";
  EXPECT_EQ(std::memcmp(dw2.data(), got_dw.data(), dw2.size() * sizeof(Bits<T>)), 0)
      << what << ": dw differs between two runs";
}

template <class T>
void rms_norm_bwd_cases() {
  uint32_t seed = 400;
  for (const auto& [rows, D] : norm_shapes()) {
    for (const bool with_dw : {false, true}) {
      for (const int64_t off : {0, 1}) check_rms_norm_bwd<T>(rows, D, with_dw, off, seed += 3);
    }
  }
}

TEST_F(CudaGrad, RmsNormBackwardMatchesCpu) {
  rms_norm_bwd_cases<float>();
  rms_norm_bwd_cases<bf16>();
  rms_norm_bwd_cases<__half>();
}

TEST_F(CudaGrad, RmsNormBackwardInPlace) {
  // dx over dy: the vector kernels (40: small teams; 4096) and the element-by-element one (100).
  for (const int64_t D : {40, 4096, 100}) {
    check_rms_norm_bwd<bf16>(33, D, true, 0, 900, NormDx::OverDy);
  }
}

TEST_F(CudaGrad, RmsNormBackwardAddsResidualGradient) {
  // dx = the norm's gradient + dres (the residual stream's), into its own buffer and over dres,
  // on the vector kernels (40, 4096) and the element-by-element one (100, offset 1).
  uint32_t seed = 950;
  for (const NormDx mode : {NormDx::Dres, NormDx::OverDres}) {
    for (const int64_t D : {40, 4096, 100}) {
      for (const int64_t off : {0, 1})
        check_rms_norm_bwd<bf16>(33, D, off == 0, off, seed += 5, mode);
    }
    check_rms_norm_bwd<float>(7, 1000, true, 0, seed += 5, mode);
  }
}

TEST_F(CudaGrad, RmsNormBackwardEdges) {
  // No rows: dw is all zeros, nothing else is touched. No columns: nothing at all.
  DevArray<bf16> dw(16), dx(16);
  cg::rms_norm_bwd<bf16>(dx.at(), dw.at(), nullptr, dx.at(), dx.at(), dw.at(), nullptr, 0, 16);
  for (const uint16_t b : dw.download()) EXPECT_EQ(b, 0u);
  EXPECT_EQ(written_outside<bf16>(dx.download(), 0, 0), 0);
  cg::rms_norm_bwd<bf16>(dx.at(), dw.at(), nullptr, dx.at(), dx.at(), dw.at(), nullptr, 5, 0);
  cg::rms_norm_fwd<bf16>(dx.at(), nullptr, dx.at(), nullptr, nullptr, dw.at(), 0, 16, kEps);
  EXPECT_EQ(written_outside<bf16>(dx.download(), 0, 0), 0);
  EXPECT_EQ(cg::rms_norm_bwd_workspace(0, 16), 0u);
  EXPECT_NE(error_message([&] {
              cg::rms_norm_bwd<bf16>(dx.at(), dw.at(), nullptr, dx.at(), dx.at(), dw.at(), nullptr,
                                     2, 8);
            }).find("workspace"),
            std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// rope_rotate. A rotated element is a c -/+ b s: two fp32 products and a sum, within 3 ulps of
// |a c| + |b s|, hence 2^-21 (|a c| + |b s|); the dims past rot_dim are copied: bit for bit.

struct RopeCase {
  int64_t B, S, H, D;
  int rot;
  bool half_split;
  bool x_bhsd, y_bhsd;  // [B, H, S, D] in memory (else [B, S, H, D])
  int64_t x_dstride;    // x's D stride (y's is 1)
  int64_t off;          // elements x and y start past 16-byte alignment
  bool shared_table;    // cs_b = 0
  int64_t cs_pad;       // cs_s = rot / 2 + cs_pad
  bool in_place;        // y = x (same strides)
};

const RopeCase kRopeCases[] = {
    {2, 33, 4, 128, 128, true, false, false, 1, 0, true, 0, false},  // Llama, vector kernel
    {2, 17, 3, 64, 64, false, true, false, 1, 0, false, 0, false},   // [B, H, S, D] in, adjacent
    {1, 7, 5, 96, 64, true, false, true, 1, 0, true, 32, false},     // partial; HF-width table
    {3, 5, 2, 80, 40, false, true, true, 1, 0, false, 4, false},     // adjacent, partial
    {2, 9, 3, 18, 18, true, false, false, 1, 0, true, 0, false},     // half 9: element-wise
    {2, 5, 3, 64, 64, true, false, false, 1, 1, true, 0, false},     // unaligned: element-wise
    {2, 6, 2, 32, 32, false, true, false, 2, 0, true, 0, false},     // D stride 2: element-wise
    {2, 4, 2, 64, 64, true, false, false, 1, 0, false, 1, false},    // misaligned table rows
    {2, 11, 4, 128, 64, true, true, true, 1, 0, false, 0, true},     // in place: tail untouched
    {3, 8, 2, 64, 64, false, false, false, 1, 0, true, 0, true},     // in place, adjacent
    {1, 1, 1, 2, 2, true, false, false, 1, 0, true, 0, false},       // the smallest
};

struct RopeLayout {
  int64_t st[4];
  int64_t size;  // elements spanned
};

RopeLayout rope_layout(const RopeCase& c, bool bhsd, int64_t dstride) {
  const int64_t row = c.D * dstride;
  RopeLayout l{};
  if (bhsd) {
    l = {{c.H * c.S * row, row, c.S * row, dstride}, 0};
  } else {
    l = {{c.S * c.H * row, c.H * row, row, dstride}, 0};
  }
  l.size = c.B * c.S * c.H * row;
  return l;
}

template <class T, class TC>
void check_rope(const RopeCase& c, bool inverse, uint32_t seed) {
  std::ostringstream label;
  label << "rope " << Elem<T>::kName << " tables " << Elem<TC>::kName << " B=" << c.B
        << " S=" << c.S << " H=" << c.H << " D=" << c.D << " rot=" << c.rot
        << (c.half_split ? " half-split" : " adjacent") << (c.x_bhsd ? " x:BHSD" : "")
        << (c.y_bhsd ? " y:BHSD" : "") << " dstride=" << c.x_dstride << " off=" << c.off
        << (c.shared_table ? " shared" : "") << " cs_pad=" << c.cs_pad
        << (c.in_place ? " in place" : "") << (inverse ? " inverse" : "");
  const std::string what = label.str();
  const int64_t half = c.rot / 2;
  const RopeLayout lx = rope_layout(c, c.x_bhsd, c.x_dstride);
  const RopeLayout ly = c.in_place ? lx : rope_layout(c, c.y_bhsd, 1);
  const int64_t nx = lx.size + c.off + 8, ny = ly.size + c.off + 8;
  // x: the whole buffer random (gaps of a strided view included).
  const HostArray<T> x = random_array<T>(nx, seed, 0.1f, 2.0f);
  // Tables [Bcs, S, cs_s]: cos and sin of random angles, rounded to TC; the padding NaN.
  const int64_t cs_s = half + c.cs_pad, cs_b = c.shared_table ? 0 : c.S * cs_s;
  const int64_t ncs = (c.shared_table ? 1 : c.B) * c.S * cs_s + 8;
  std::vector<Bits<TC>> cos_bits(static_cast<size_t>(ncs), encode<TC>(NAN));
  std::vector<Bits<TC>> sin_bits = cos_bits;
  std::vector<double> cos_v(cos_bits.size(), NAN), sin_v(cos_bits.size(), NAN);
  std::mt19937 rng(seed + 1);
  std::uniform_real_distribution<double> angle(-std::numbers::pi, std::numbers::pi);
  for (int64_t t = 0; t < ncs - 8; ++t) {
    if (t % cs_s >= half) continue;
    const double a = angle(rng);
    cos_bits[t] = encode<TC>(static_cast<float>(std::cos(a)));
    sin_bits[t] = encode<TC>(static_cast<float>(std::sin(a)));
    cos_v[t] = decode<TC>(cos_bits[t]);
    sin_v[t] = decode<TC>(sin_bits[t]);
  }
  DevArray<T> dx(nx), dy(ny);
  DevArray<TC> dcos(ncs), dsin(ncs);
  dx.upload(x.bits);
  dcos.upload(cos_bits);
  dsin.upload(sin_bits);
  RopeShape s;
  s.B = c.B;
  s.S = c.S;
  s.H = c.H;
  s.D = c.D;
  std::copy(lx.st, lx.st + 4, s.x_st);
  std::copy(ly.st, ly.st + 4, s.y_st);
  s.cs_b = cs_b;
  s.cs_s = cs_s;
  s.rot_dim = c.rot;
  s.half_split = c.half_split;
  T* y = c.in_place ? dx.at(c.off) : dy.at(c.off);
  cg::rope_rotate<T, TC>(y, dx.at(c.off), dcos.at(), dsin.at(), s, inverse);
  // The reference over doubles in the same layout.
  std::vector<double> x_ref = x.val;
  std::vector<double> y_ref = c.in_place ? x_ref : std::vector<double>(static_cast<size_t>(ny));
  double* yr = c.in_place ? x_ref.data() + c.off : y_ref.data() + c.off;
  const double* xr = c.in_place ? yr : x.val.data() + c.off;
  rg::rope_rotate<double>(yr, xr, cos_v.data(), sin_v.data(), s, inverse);
  if (c.in_place) y_ref = x_ref;
  const std::vector<Bits<T>> got = c.in_place ? dx.download() : dy.download();
  std::vector<double> g, want, bound;
  std::vector<bool> in_view(got.size(), false);
  for (int64_t b = 0; b < c.B; ++b) {
    for (int64_t q = 0; q < c.S; ++q) {
      for (int64_t h = 0; h < c.H; ++h) {
        const int64_t xrow = c.off + b * lx.st[0] + q * lx.st[1] + h * lx.st[2];
        const int64_t yrow = c.off + b * ly.st[0] + q * ly.st[1] + h * ly.st[2];
        const int64_t t = b * cs_b + q * cs_s;
        for (int64_t d = 0; d < c.D; ++d) {
          const int64_t yi = yrow + d * ly.st[3];
          in_view[yi] = true;
          double bd = 0;  // dims past rot_dim: exact
          if (d < c.rot) {
            const int64_t i = c.half_split ? d % half : d / 2;
            const int64_t d0 = c.half_split ? i : 2 * i, d1 = c.half_split ? i + half : 2 * i + 1;
            const double a0 = x.val[xrow + d0 * lx.st[3]], a1 = x.val[xrow + d1 * lx.st[3]];
            bd = rounding<T>(y_ref[yi]) +
                 0x1p-21 * (std::abs(a0 * cos_v[t + i]) + std::abs(a1 * sin_v[t + i]));
          }
          g.push_back(decode<T>(got[yi]));
          want.push_back(y_ref[yi]);
          bound.push_back(bd);
        }
      }
    }
  }
  expect_near(what, g, want, bound);
  // Outside the view: still poison (out of place), or the input unchanged (in place).
  int64_t touched = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (in_view[i]) continue;
    touched += c.in_place ? !same_bits<T>(got[i], x.bits[i]) : !is_poison<T>(got[i]);
  }
  EXPECT_EQ(touched, 0) << what << ": elements outside the view changed";
}

template <class T, class TC>
void rope_cases() {
  uint32_t seed = 500;
  for (const RopeCase& c : kRopeCases) {
    for (const bool inverse : {false, true}) check_rope<T, TC>(c, inverse, seed += 2);
  }
}

TEST_F(CudaGrad, RopeMatchesCpu) {
  rope_cases<float, float>();
  rope_cases<bf16, float>();
  rope_cases<bf16, bf16>();
  rope_cases<__half, float>();
  rope_cases<__half, __half>();
}

TEST_F(CudaGrad, RopeInverseUndoesForward) {
  // Forward then inverse in f32 returns x to within the two rotations' rounding.
  const RopeCase c{2, 16, 4, 128, 128, true, false, false, 1, 0, true, 0, false};
  const RopeLayout l = rope_layout(c, false, 1);
  const HostArray<float> x = random_array<float>(l.size, 77, 0.1f, 2.0f);
  std::vector<float> cs(static_cast<size_t>(c.S * 64)), sn(cs.size());
  for (size_t i = 0; i < cs.size(); ++i) {
    cs[i] = static_cast<float>(std::cos(0.37 * static_cast<double>(i)));
    sn[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i)));
  }
  DevArray<float> dx(l.size), dy(l.size), dz(l.size), dcos(c.S * 64), dsin(c.S * 64);
  dx.upload(x.bits);
  dcos.upload(cs);
  dsin.upload(sn);
  RopeShape s;
  s.B = c.B;
  s.S = c.S;
  s.H = c.H;
  s.D = c.D;
  std::copy(l.st, l.st + 4, s.x_st);
  std::copy(l.st, l.st + 4, s.y_st);
  s.cs_s = 64;
  s.rot_dim = 128;
  cg::rope_rotate<float, float>(dy.at(), dx.at(), dcos.at(), dsin.at(), s, false);
  cg::rope_rotate<float, float>(dz.at(), dy.at(), dcos.at(), dsin.at(), s, true);
  std::vector<double> b(x.val.size());
  // |x| < 2: each rotation within a few ulps of 4, and cos^2 + sin^2 within 2^-23 of 1.
  for (size_t i = 0; i < b.size(); ++i) b[i] = 0x1p-17;
  expect_near("rope inverse(forward(x))", decoded<float>(dz.download(), 0, l.size), x.val, b);
}

}  // namespace
}  // namespace llmk::gpu_test
