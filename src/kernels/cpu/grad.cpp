// Forward and backward of llmk.ops on the CPU: rows spread over the thread pool; the math in the
// element type, sums in double (except gemm's, which are in the element type, as in BLAS).
#include "kernels/cpu/grad.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <vector>

#include "kernels/cpu/vec_math.h"

namespace llmk::cpu::grad {

namespace {

// act(x) and act'(x).
template <class T>
struct GateValue {
  T f, df;
};

template <class T>
GateValue<T> gate_value(T x, Act act) {
  switch (act) {
    case Act::SiLU: {
      const T s = T(1) / (T(1) + std::exp(-x));
      return {x * s, s * (T(1) + x * (T(1) - s))};
    }
    case Act::GeluTanh: {
      const T c = static_cast<T>(std::sqrt(2.0 / std::numbers::pi));
      const T k = static_cast<T>(0.044715);
      const T t = std::tanh(c * (x + k * x * x * x));
      return {T(0.5) * x * (T(1) + t),
              T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * c * (T(1) + T(3) * k * x * x)};
    }
    case Act::GeluErf: {
      const T inv_sqrt2 = static_cast<T>(1.0 / std::numbers::sqrt2);
      const T inv_sqrt_2pi = static_cast<T>(1.0 / std::sqrt(2.0 * std::numbers::pi));
      const T cdf = T(0.5) * (T(1) + std::erf(x * inv_sqrt2));
      return {x * cdf, cdf + x * inv_sqrt_2pi * std::exp(T(-0.5) * x * x)};
    }
    case Act::None:
      return {x, T(1)};
  }
  return {T(0), T(0)};
}

// Runs f(i) for i in [0, n), over the pool when n items of about `work_per_item` steps each are
// worth waking it for.
template <class F>
void parallel_each(int64_t n, int64_t work_per_item, F f) {
  detail::parallel_rows(n, work_per_item, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) f(i);
  });
}

// out[j] = sum over r < rows of term(r, j) (a double) for j < N: columns in blocks over the
// pool, each column summing its rows in order, so the result does not depend on the threads.
template <class T, class F>
void column_sums(T* out, int64_t rows, int64_t N, F term) {
  constexpr int64_t kCols = 256;
  parallel_each((N + kCols - 1) / kCols, rows * kCols, [&](int64_t b) {
    const int64_t lo = b * kCols, hi = std::min(N, lo + kCols);
    double acc[kCols] = {};
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = lo; j < hi; ++j) acc[j - lo] += term(r, j);
    }
    for (int64_t j = lo; j < hi; ++j) out[j] = static_cast<T>(acc[j - lo]);
  });
}

// gemm's tiling: a task computes a kTileM x kTileN tile of C, whose accumulators (32 KiB in
// float) stay in L1/L2 while B goes by in kTileK x kTileN blocks (256 KiB in float, L2).
constexpr int64_t kTileM = 32, kTileN = 256, kTileK = 256;

// c_r[j] += a_r * b[j] for four rows r: each b[j] loaded once for the four.
template <class T>
void axpy4(T* __restrict c0, T* __restrict c1, T* __restrict c2, T* __restrict c3,
           const T* __restrict b, T a0, T a1, T a2, T a3, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    const T bj = b[j];
    c0[j] += a0 * bj;
    c1[j] += a1 * bj;
    c2[j] += a2 * bj;
    c3[j] += a3 * bj;
  }
}

template <class T>
void axpy1(T* __restrict c, const T* __restrict b, T a, int64_t n) {
  for (int64_t j = 0; j < n; ++j) c[j] += a * b[j];
}

}  // namespace

template <class T>
void rms_norm_fwd(T* y, T* rstd, const T* x, const T* w, int64_t rows, int64_t D, double eps) {
  parallel_each(rows, 3 * D, [&](int64_t r) {
    const T* xr = x + r * D;
    double ss = 0;
    for (int64_t j = 0; j < D; ++j) ss += static_cast<double>(xr[j]) * xr[j];
    const T inv = static_cast<T>(1.0 / std::sqrt(ss / static_cast<double>(D) + eps));
    rstd[r] = inv;
    T* yr = y + r * D;
    for (int64_t j = 0; j < D; ++j) yr[j] = xr[j] * inv * w[j];
  });
}

template <class T>
void rms_norm_bwd(T* dx, T* dw, const T* dy, const T* x, const T* w, const T* rstd, int64_t rows,
                  int64_t D, const T* dres) {
  parallel_each(rows, 6 * D, [&](int64_t r) {
    const T *xr = x + r * D, *dyr = dy + r * D;
    const T inv = rstd[r];
    double dot = 0;  // sum of g * xhat
    for (int64_t j = 0; j < D; ++j) dot += static_cast<double>(dyr[j]) * w[j] * xr[j] * inv;
    const T mean = static_cast<T>(dot / static_cast<double>(D));
    T* dxr = dx + r * D;
    const T* rr = dres != nullptr ? dres + r * D : nullptr;
    for (int64_t j = 0; j < D; ++j) {
      dxr[j] = inv * (dyr[j] * w[j] - xr[j] * inv * mean) + (rr != nullptr ? rr[j] : T(0));
    }
  });
  if (dw == nullptr) return;
  column_sums(dw, rows, D, [&](int64_t r, int64_t j) {
    return static_cast<double>(dy[r * D + j]) * x[r * D + j] * static_cast<double>(rstd[r]);
  });
}

template <class T>
void gated_fwd(T* out, const T* gate, const T* up, int64_t n, Act act) {
  parallel_each(n, 1, [&](int64_t i) { out[i] = gate_value(gate[i], act).f * up[i]; });
}

template <class T>
void add(T* out, const T* a, const T* b, int64_t n) {
  parallel_each(n, 1, [&](int64_t i) { out[i] = a[i] + b[i]; });
}

template <class T>
void gated_bwd(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int64_t n, Act act) {
  parallel_each(n, 1, [&](int64_t i) {
    const GateValue<T> g = gate_value(gate[i], act);
    const T d = dout[i];
    dgate[i] = d * up[i] * g.df;
    dup[i] = d * g.f;
  });
}

template <class T>
void rope_table(T* cos, T* sin, const int64_t* positions, int64_t rows, int rot_dim, double theta,
                double freq_scale, const double* factors) {
  const int64_t half = rot_dim / 2;
  if (rows <= 0 || half <= 0) return;
  std::vector<double> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    double f = freq_scale * std::pow(theta, -2.0 * static_cast<double>(i) / rot_dim);
    if (factors != nullptr) f /= factors[i];
    inv_freq[static_cast<size_t>(i)] = f;
  }
  parallel_each(rows, 40 * half, [&](int64_t r) {
    const double pos = static_cast<double>(positions[r]);
    for (int64_t i = 0; i < half; ++i) {
      const double angle = pos * inv_freq[static_cast<size_t>(i)];
      cos[r * half + i] = static_cast<T>(std::cos(angle));
      sin[r * half + i] = static_cast<T>(std::sin(angle));
    }
  });
}

template <class T>
void rope_rotate(T* y, const T* x, const T* cos, const T* sin, const RopeShape& s, bool inverse) {
  const int64_t half = s.rot_dim / 2;
  if (s.B <= 0 || s.S <= 0 || s.H <= 0 || s.D <= 0) return;
  // Pair i is (i * step, i * step + other).
  const int64_t step = s.half_split ? 1 : 2, other = s.half_split ? half : 1;
  const int64_t xd = s.x_st[3], yd = s.y_st[3];
  const bool in_place = y == x;
  parallel_each(s.B * s.S, 4 * s.H * s.D, [&](int64_t bs) {
    const int64_t b = bs / s.S, q = bs % s.S;
    const T* c = cos + b * s.cs_b + q * s.cs_s;
    const T* sn = sin + b * s.cs_b + q * s.cs_s;
    for (int64_t h = 0; h < s.H; ++h) {
      const T* xv = x + b * s.x_st[0] + q * s.x_st[1] + h * s.x_st[2];
      T* yv = y + b * s.y_st[0] + q * s.y_st[1] + h * s.y_st[2];
      for (int64_t i = 0; i < half; ++i) {
        const int64_t d0 = i * step, d1 = d0 + other;
        // The inverse is the rotation by (cos, -sin); negating sin is exact.
        const T ci = c[i], si = inverse ? -sn[i] : sn[i];
        const T a = xv[d0 * xd], bb = xv[d1 * xd];
        yv[d0 * yd] = a * ci - bb * si;
        yv[d1 * yd] = a * si + bb * ci;
      }
      if (!in_place) {
        for (int64_t d = 2 * half; d < s.D; ++d) yv[d * yd] = xv[d * xd];
      }
    }
  });
}

template <class T>
void gemm(T* C, int64_t ldc, const T* A, int64_t lda, bool trans_a, const T* B, int64_t ldb,
          bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, T beta) {
  if (M <= 0 || N <= 0) return;
  if (alpha == T(0) || K <= 0) {  // C = beta * C, reading neither A nor B (nor C when beta = 0)
    parallel_each(M, N, [&](int64_t i) {
      T* c = C + i * ldc;
      for (int64_t j = 0; j < N; ++j) c[j] = beta == T(0) ? T(0) : beta * c[j];
    });
    return;
  }
  const int64_t tiles_m = (M + kTileM - 1) / kTileM, tiles_n = (N + kTileN - 1) / kTileN;
  parallel_each(tiles_m * tiles_n, kTileM * std::min(N, kTileN) * K, [&](int64_t t) {
    const int64_t i0 = t / tiles_n * kTileM, j0 = t % tiles_n * kTileN;
    const int64_t mb = std::min(kTileM, M - i0), nb = std::min(kTileN, N - j0);
    thread_local std::vector<T> acc_buf, b_buf;
    acc_buf.assign(static_cast<size_t>(mb * nb), T(0));  // acc: [mb, nb]
    T* acc = acc_buf.data();
    if (trans_b) b_buf.resize(static_cast<size_t>(std::min(kTileK, K) * nb));
    const auto a_at = [&](int64_t i, int64_t k) {
      return trans_a ? A[k * lda + i0 + i] : A[(i0 + i) * lda + k];
    };
    for (int64_t k0 = 0; k0 < K; k0 += kTileK) {
      const int64_t kb = std::min(kTileK, K - k0);
      // Row k of the block of op(B): [nb] contiguous; B^T is packed to make it so.
      const T* bk = b_buf.data();
      int64_t bk_step = nb;
      if (trans_b) {
        T* bp = b_buf.data();  // [kb, nb]
        for (int64_t j = 0; j < nb; ++j) {
          const T* src = B + (j0 + j) * ldb + k0;
          for (int64_t k = 0; k < kb; ++k) bp[k * nb + j] = src[k];
        }
      } else {
        bk = B + k0 * ldb + j0;
        bk_step = ldb;
      }
      int64_t i = 0;
      for (; i + 4 <= mb; i += 4) {
        T* c = acc + i * nb;
        for (int64_t k = 0; k < kb; ++k) {
          axpy4(c, c + nb, c + 2 * nb, c + 3 * nb, bk + k * bk_step, a_at(i, k0 + k),
                a_at(i + 1, k0 + k), a_at(i + 2, k0 + k), a_at(i + 3, k0 + k), nb);
        }
      }
      for (; i < mb; ++i) {
        for (int64_t k = 0; k < kb; ++k) axpy1(acc + i * nb, bk + k * bk_step, a_at(i, k0 + k), nb);
      }
    }
    for (int64_t i = 0; i < mb; ++i) {
      T* c = C + (i0 + i) * ldc + j0;
      const T* sum = acc + i * nb;
      if (beta == T(0)) {
        for (int64_t j = 0; j < nb; ++j) c[j] = alpha * sum[j];
      } else {
        for (int64_t j = 0; j < nb; ++j) c[j] = alpha * sum[j] + beta * c[j];
      }
    }
  });
}

template <class T>
void bias_act_fwd(T* y, T* z, const T* bias, int64_t rows, int64_t N, Act act) {
  parallel_each(rows, 8 * N, [&](int64_t r) {
    T *zr = z + r * N, *yr = y + r * N;
    for (int64_t j = 0; j < N; ++j) {
      const T v = bias != nullptr ? zr[j] + bias[j] : zr[j];
      zr[j] = v;
      yr[j] = gate_value(v, act).f;
    }
  });
}

template <class T>
void bias_act_bwd(T* dz, T* db, const T* dy, const T* z, int64_t rows, int64_t N, Act act) {
  parallel_each(rows, 8 * N, [&](int64_t r) {
    const T *dyr = dy + r * N, *zr = z + r * N;
    T* dzr = dz + r * N;
    for (int64_t j = 0; j < N; ++j) dzr[j] = dyr[j] * gate_value(zr[j], act).df;
  });
  if (db == nullptr) return;
  column_sums(db, rows, N,
              [&](int64_t r, int64_t j) { return static_cast<double>(dz[r * N + j]); });
}

#define LLMK_GRAD_INSTANTIATE(T)                                                                  \
  template void rms_norm_fwd<T>(T*, T*, const T*, const T*, int64_t, int64_t, double);            \
  template void rms_norm_bwd<T>(T*, T*, const T*, const T*, const T*, const T*, int64_t, int64_t, \
                                const T*);                                                        \
  template void gated_fwd<T>(T*, const T*, const T*, int64_t, Act);                               \
  template void gated_bwd<T>(T*, T*, const T*, const T*, const T*, int64_t, Act);                 \
  template void add<T>(T*, const T*, const T*, int64_t);                                          \
  template void rope_table<T>(T*, T*, const int64_t*, int64_t, int, double, double,               \
                              const double*);                                                     \
  template void rope_rotate<T>(T*, const T*, const T*, const T*, const RopeShape&, bool);         \
  template void gemm<T>(T*, int64_t, const T*, int64_t, bool, const T*, int64_t, bool, int64_t,   \
                        int64_t, int64_t, T, T);                                                  \
  template void bias_act_fwd<T>(T*, T*, const T*, int64_t, int64_t, Act);                         \
  template void bias_act_bwd<T>(T*, T*, const T*, const T*, int64_t, int64_t, Act);
LLMK_GRAD_INSTANTIATE(float)
LLMK_GRAD_INSTANTIATE(double)
#undef LLMK_GRAD_INSTANTIATE

}  // namespace llmk::cpu::grad
