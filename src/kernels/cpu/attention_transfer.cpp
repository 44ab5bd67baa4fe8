// Attention transfer (attention_transfer.h): one query row (forward, dq) or one key row (dk) per
// step of the thread pool's loops, scores in double. The forward keeps a row's scores (2 S
// doubles per thread); the backward recomputes each score where it is used and keeps none. Every
// output element is written by one thread, so the results do not depend on the thread count.
#include "kernels/cpu/attention_transfer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/thread_pool.h"

namespace llmk::cpu::grad {

namespace {

template <class T>
double dot(const T* a, const T* b, int64_t n) {
  double s = 0.0;
  for (int64_t k = 0; k < n; ++k) s += static_cast<double>(a[k]) * static_cast<double>(b[k]);
  return s;
}

// Rows of a relation head: row i of (b, r) starts at base + (b S + i) R d + r d.
template <class P>  // const T* or T*
struct Rows {
  P base;
  int64_t S, R, d;
  P at(int64_t b, int64_t r, int64_t i) const { return base + ((b * S + i) * R + r) * d; }
};

// Rows per chunk of the pool's loops: about 64k multiply-adds of scores each.
int64_t grain(const AttentionTransferParams& p) {
  return std::max<int64_t>(1, 65536 / std::max<int64_t>(1, p.S * (p.dt + p.ds)));
}

// The (b, r, i) of row `row` of [B, R, S].
struct RowIndex {
  int64_t b, r, i;
};
RowIndex row_index(int64_t row, const AttentionTransferParams& p) {
  return {row / (p.R * p.S), (row / p.S) % p.R, row % p.S};
}

}  // namespace

template <class T>
void attention_transfer_fwd(T* kl, T* lse_t, T* lse_s, const T* tq, const T* tk, const T* sq,
                            const T* sk, const AttentionTransferParams& p) {
  const Rows<const T*> Qt{tq, p.S, p.R, p.dt}, Kt{tk, p.S, p.R, p.dt};
  const Rows<const T*> Qs{sq, p.S, p.R, p.ds}, Ks{sk, p.S, p.R, p.ds};
  const double st = p.scale_t(), ss = p.scale_s();
  cpu_pool().parallel_for(p.rows(), grain(p), [&](int64_t r0, int64_t r1) {
    std::vector<double> a_t(static_cast<size_t>(p.S)), a_s(static_cast<size_t>(p.S));
    for (int64_t row = r0; row < r1; ++row) {
      const auto [b, r, i] = row_index(row, p);
      const T *qt = Qt.at(b, r, i), *qs = Qs.at(b, r, i);
      const int64_t n = p.causal ? i + 1 : p.S;
      double m_t = -std::numeric_limits<double>::infinity(), m_s = m_t;
      for (int64_t j = 0; j < n; ++j) {
        const size_t u = static_cast<size_t>(j);
        a_t[u] = dot(qt, Kt.at(b, r, j), p.dt) * st;
        a_s[u] = dot(qs, Ks.at(b, r, j), p.ds) * ss;
        m_t = std::max(m_t, a_t[u]);
        m_s = std::max(m_s, a_s[u]);
      }
      double z_t = 0.0, z_s = 0.0, w = 0.0;
      for (int64_t j = 0; j < n; ++j) {
        const size_t u = static_cast<size_t>(j);
        const double e = std::exp(a_t[u] - m_t);
        z_t += e;
        if (e > 0.0) w += e * (a_t[u] - a_s[u]);
        z_s += std::exp(a_s[u] - m_s);
      }
      const double lt = m_t + std::log(z_t), ls = m_s + std::log(z_s);
      kl[row] = static_cast<T>(w / z_t - lt + ls);
      lse_t[row] = static_cast<T>(lt);
      lse_s[row] = static_cast<T>(ls);
    }
  });
}

template <class T>
void attention_transfer_bwd(T* dq, T* dk, const T* tq, const T* tk, const T* sq, const T* sk,
                            const T* lse_t, const T* lse_s, double grad,
                            const AttentionTransferParams& p) {
  const Rows<const T*> Qt{tq, p.S, p.R, p.dt}, Kt{tk, p.S, p.R, p.dt};
  const Rows<const T*> Qs{sq, p.S, p.R, p.ds}, Ks{sk, p.S, p.R, p.ds};
  const double st = p.scale_t(), ss = p.scale_s(), g = grad * ss;
  // dS_ij / (g scale_s) of query i and key j of (b, r): p_s,ij - p_t,ij.
  auto dscore = [&](int64_t b, int64_t r, int64_t i, int64_t j) {
    const int64_t row = (b * p.R + r) * p.S + i;
    const double a_t = dot(Qt.at(b, r, i), Kt.at(b, r, j), p.dt) * st;
    const double a_s = dot(Qs.at(b, r, i), Ks.at(b, r, j), p.ds) * ss;
    return std::exp(a_s - static_cast<double>(lse_s[row])) -
           std::exp(a_t - static_cast<double>(lse_t[row]));
  };
  // Row x of (b, r) of out = g sum over the rows y that x pairs with under the mask of
  // dscore(x, y) (query rows: dq) or dscore(y, x) (key rows: dk) times row y of other.
  auto run = [&](T* out, const Rows<const T*>& other, bool key_rows) {
    const Rows<T*> Out{out, p.S, p.R, p.ds};
    cpu_pool().parallel_for(p.rows(), grain(p), [&](int64_t r0, int64_t r1) {
      std::vector<double> acc(static_cast<size_t>(p.ds));
      for (int64_t row = r0; row < r1; ++row) {
        const auto [b, r, x] = row_index(row, p);
        std::fill(acc.begin(), acc.end(), 0.0);
        // Query rows see keys 0..x (causal); key rows are seen by queries x..S-1.
        const int64_t y0 = p.causal && key_rows ? x : 0;
        const int64_t y1 = p.causal && !key_rows ? x + 1 : p.S;
        for (int64_t y = y0; y < y1; ++y) {
          const double d = key_rows ? dscore(b, r, y, x) : dscore(b, r, x, y);
          const T* o = other.at(b, r, y);
          for (int64_t c = 0; c < p.ds; ++c) acc[static_cast<size_t>(c)] += d * o[c];
        }
        T* dst = Out.at(b, r, x);
        for (int64_t c = 0; c < p.ds; ++c) dst[c] = static_cast<T>(g * acc[static_cast<size_t>(c)]);
      }
    });
  };
  if (dq) run(dq, Ks, false);
  if (dk) run(dk, Qs, true);
}

template void attention_transfer_fwd<float>(float*, float*, float*, const float*, const float*,
                                            const float*, const float*,
                                            const AttentionTransferParams&);
template void attention_transfer_fwd<double>(double*, double*, double*, const double*,
                                             const double*, const double*, const double*,
                                             const AttentionTransferParams&);
template void attention_transfer_bwd<float>(float*, float*, const float*, const float*,
                                            const float*, const float*, const float*, const float*,
                                            double, const AttentionTransferParams&);
template void attention_transfer_bwd<double>(double*, double*, const double*, const double*,
                                             const double*, const double*, const double*,
                                             const double*, double, const AttentionTransferParams&);

}  // namespace llmk::cpu::grad
