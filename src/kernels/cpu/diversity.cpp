// Pairwise cosine diversity in O(N d) (diversity.h). Every sum over rows runs over fixed blocks
// of kBlock rows in a fixed order, so the results do not depend on the thread count.
#include "kernels/cpu/diversity.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/thread_pool.h"

namespace llmk::cpu::grad {

namespace {

constexpr int64_t kBlock = 64;

// sum over rows i of add(i, p) (each call adds row i's d terms into p), into a vector of d
// doubles: rows in blocks of kBlock, each block summed on one thread, the blocks in order.
template <class F>
std::vector<double> row_sum(int64_t N, int64_t d, F&& add) {
  const int64_t blocks = (N + kBlock - 1) / kBlock;
  std::vector<double> part(static_cast<size_t>(blocks * d), 0.0), sum(static_cast<size_t>(d), 0.0);
  cpu_pool().parallel_for(blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b)
      for (int64_t i = b * kBlock; i < std::min(N, (b + 1) * kBlock); ++i)
        add(i, part.data() + b * d);
  });
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t j = 0; j < d; ++j)
      sum[static_cast<size_t>(j)] += part[static_cast<size_t>(b * d + j)];
  return sum;
}

// 1 / |x_i| per row (0 for a zero row) and S = sum_i x_i / |x_i|, in double.
template <class T>
void normalised_sum(std::vector<double>& inv, std::vector<double>& S, const T* x, int64_t N,
                    int64_t d) {
  inv.assign(static_cast<size_t>(N), 0.0);
  S = row_sum(N, d, [&](int64_t i, double* p) {
    const T* r = x + i * d;
    double ss = 0.0;
    for (int64_t j = 0; j < d; ++j) ss += static_cast<double>(r[j]) * r[j];
    const double s = ss > 0.0 ? 1.0 / std::sqrt(ss) : 0.0;
    inv[static_cast<size_t>(i)] = s;
    for (int64_t j = 0; j < d; ++j) p[j] += r[j] * s;
  });
}

// u_i . v for a row of x and a vector v of d doubles.
template <class T>
double dot_u(const T* r, double inv, const std::vector<double>& v, int64_t d) {
  double acc = 0.0;
  for (int64_t j = 0; j < d; ++j) acc += r[j] * v[static_cast<size_t>(j)];
  return acc * inv;
}

}  // namespace

template <class T>
void cosine_diversity_fwd(T* out, const T* x, int64_t N, int64_t d, bool rows) {
  if (N < 2) {
    if (rows) {
      for (int64_t i = 0; i < N; ++i) out[i] = T(0);
    } else {
      out[0] = T(0);
    }
    return;
  }
  std::vector<double> inv, S;
  normalised_sum(inv, S, x, N, d);
  if (rows) {
    const double others = static_cast<double>(N - 1);
    cpu_pool().parallel_for(N, kBlock, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const double s = inv[static_cast<size_t>(i)];
        const double self = s > 0.0 ? 1.0 : 0.0;  // |u_i|^2
        out[i] = static_cast<T>(1.0 - (dot_u(x + i * d, s, S, d) - self) / others);
      }
    });
    return;
  }
  double ss = 0.0, self = 0.0;
  for (int64_t j = 0; j < d; ++j) ss += S[static_cast<size_t>(j)] * S[static_cast<size_t>(j)];
  for (int64_t i = 0; i < N; ++i) self += inv[static_cast<size_t>(i)] > 0.0 ? 1.0 : 0.0;
  out[0] = static_cast<T>(1.0 - (ss - self) / (static_cast<double>(N) * (N - 1)));
}

// The gradient through u_k = x_k / |x_k|: dx_k = (du_k - (du_k . u_k) u_k) / |x_k|, where
//   mean: du_k = -2 g (S - u_k) / (N (N - 1));
//   rows: du_k = -(g_k S + G - 2 g_k u_k) / (N - 1), G = sum_i g_i u_i.
template <class T>
void cosine_diversity_bwd(T* dx, const T* dout, const T* x, int64_t N, int64_t d, bool rows) {
  if (N < 2) {
    std::fill(dx, dx + N * d, T(0));
    return;
  }
  std::vector<double> inv, S;
  normalised_sum(inv, S, x, N, d);
  // rows: G = sum_i g_i u_i.
  const std::vector<double> G =
      rows ? row_sum(N, d,
                     [&](int64_t i, double* p) {
                       const double c = static_cast<double>(dout[i]) * inv[static_cast<size_t>(i)];
                       for (int64_t j = 0; j < d; ++j) p[j] += c * x[i * d + j];
                     })
           : std::vector<double>(static_cast<size_t>(d), 0.0);
  const double pairs = static_cast<double>(N) * (N - 1), others = static_cast<double>(N - 1);
  cpu_pool().parallel_for(N, kBlock, [&](int64_t k0, int64_t k1) {
    std::vector<double> du(static_cast<size_t>(d));
    for (int64_t k = k0; k < k1; ++k) {
      const T* r = x + k * d;
      T* o = dx + k * d;
      const double s = inv[static_cast<size_t>(k)];
      if (s == 0.0) {
        std::fill(o, o + d, T(0));
        continue;
      }
      const double g = rows ? static_cast<double>(dout[k]) : static_cast<double>(dout[0]);
      double proj = 0.0;  // du_k . u_k
      for (int64_t j = 0; j < d; ++j) {
        const double u = r[j] * s, sj = S[static_cast<size_t>(j)];
        const double v = rows ? -(g * sj + G[static_cast<size_t>(j)] - 2.0 * g * u) / others
                              : -2.0 * g * (sj - u) / pairs;
        du[static_cast<size_t>(j)] = v;
        proj += v * u;
      }
      for (int64_t j = 0; j < d; ++j)
        o[j] = static_cast<T>((du[static_cast<size_t>(j)] - proj * r[j] * s) * s);
    }
  });
}

template void cosine_diversity_fwd<float>(float*, const float*, int64_t, int64_t, bool);
template void cosine_diversity_fwd<double>(double*, const double*, int64_t, int64_t, bool);
template void cosine_diversity_bwd<float>(float*, const float*, const float*, int64_t, int64_t,
                                          bool);
template void cosine_diversity_bwd<double>(double*, const double*, const double*, int64_t, int64_t,
                                           bool);

}  // namespace llmk::cpu::grad
