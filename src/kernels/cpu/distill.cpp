// Distillation losses per row in double (distill.h). Rows run in parallel, each on one thread in
// a fixed order, so the results do not depend on the thread count.
#include "kernels/cpu/distill.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"

namespace llmk::cpu::grad {

namespace {

// log sum exp of x[i] * scale over a row, in double.
template <class T>
double log_sum_exp(const T* x, int64_t V, double scale) {
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < V; ++i) m = std::max(m, static_cast<double>(x[i]) * scale);
  if (!std::isfinite(m)) return m;
  double z = 0.0;
  for (int64_t i = 0; i < V; ++i) z += std::exp(static_cast<double>(x[i]) * scale - m);
  return m + std::log(z);
}

// p log p with 0 log 0 = 0 (log p given; p = exp(log p)).
double plogp(double logp) {
  return logp == -std::numeric_limits<double>::infinity() ? 0.0 : std::exp(logp) * logp;
}

}  // namespace

template <class T>
void distill_rows(T* loss, T* grad, const T* student, const T* teacher, const int64_t* labels,
                  int64_t rows, int64_t V, const DistillParams& p, double grad_scale) {
  const Divergence kind = effective_divergence(p);
  const double inv_t = 1.0 / p.temperature, t2 = p.temperature * p.temperature;
  const double beta = p.beta, soft = 1.0 - p.alpha, hard = p.alpha;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t label = labels ? labels[r] : 0;
    LLMK_CHECK(!labels || label == p.ignore_index || (label >= 0 && label < V),
               "distill_loss: label {} of row {} is outside [0, {}) and is not ignore_index {}",
               label, r, V, p.ignore_index);
  }
  constexpr double kNegInf = -std::numeric_limits<double>::infinity();
  cpu_pool().parallel_for(rows, 1, [&](int64_t r0, int64_t r1) {
    std::vector<double> g(static_cast<size_t>(V));
    for (int64_t r = r0; r < r1; ++r) {
      const T* s = student + r * V;
      const T* t = teacher + r * V;
      T* gr = grad ? grad + r * V : nullptr;
      if (labels && labels[r] == p.ignore_index) {
        loss[r] = T(0);
        if (gr) std::fill(gr, gr + V, T(0));
        continue;
      }
      const double lse_a = log_sum_exp(s, V, inv_t), lse_b = log_sum_exp(t, V, inv_t);
      auto logq = [&](int64_t i) { return static_cast<double>(s[i]) * inv_t - lse_a; };
      auto logp = [&](int64_t i) { return static_cast<double>(t[i]) * inv_t - lse_b; };
      // D and dD/da_i (a = student / T) into g.
      double D = 0.0;
      if (kind == Divergence::KL) {
        for (int64_t i = 0; i < V; ++i) {
          const double lp = logp(i), lq = logq(i);
          if (lp != kNegInf) D += std::exp(lp) * (lp - lq);
          g[static_cast<size_t>(i)] = std::exp(lq) - std::exp(lp);
        }
      } else if (kind == Divergence::ReverseKL) {
        for (int64_t i = 0; i < V; ++i) {
          const double lq = logq(i);
          if (lq != kNegInf) D += std::exp(lq) * (lq - logp(i));
        }
        for (int64_t i = 0; i < V; ++i) {
          const double lq = logq(i);
          g[static_cast<size_t>(i)] = lq == kNegInf ? 0.0 : std::exp(lq) * (lq - logp(i) - D);
        }
      } else {
        double qg = 0.0;  // sum_i q_i g_i, g_i = (1 - beta) (log q_i - log m_i)
        for (int64_t i = 0; i < V; ++i) {
          const double lp = logp(i), lq = logq(i), q = std::exp(lq);
          const double m = beta * std::exp(lp) + (1.0 - beta) * q;
          const double lm = m > 0.0 ? std::log(m) : kNegInf;
          D += beta * plogp(lp) + (1.0 - beta) * plogp(lq) - (m > 0.0 ? m * lm : 0.0);
          const double gi = q > 0.0 ? (1.0 - beta) * (lq - lm) : 0.0;
          g[static_cast<size_t>(i)] = gi;
          qg += q * gi;
        }
        for (int64_t i = 0; i < V; ++i) {
          g[static_cast<size_t>(i)] = std::exp(logq(i)) * (g[static_cast<size_t>(i)] - qg);
        }
      }
      double row = soft * t2 * D;
      double lse1 = 0.0;
      if (hard != 0.0) {
        lse1 = p.temperature == 1.0 ? lse_a : log_sum_exp(s, V, 1.0);
        row += hard * (lse1 - static_cast<double>(s[labels[r]]));
      }
      loss[r] = static_cast<T>(row);
      if (!gr) continue;
      // d/d student_i: the soft term's (1 - alpha) T^2 dD/da_i / T, the hard term's
      // alpha (softmax_i - [i == label]).
      for (int64_t i = 0; i < V; ++i) {
        double d = soft * p.temperature * g[static_cast<size_t>(i)];
        if (hard != 0.0) {
          d += hard * (std::exp(static_cast<double>(s[i]) - lse1) - (i == labels[r] ? 1.0 : 0.0));
        }
        gr[i] = static_cast<T>(d * grad_scale);
      }
    }
  });
}

template void distill_rows<float>(float*, float*, const float*, const float*, const int64_t*,
                                  int64_t, int64_t, const DistillParams&, double);
template void distill_rows<double>(double*, double*, const double*, const double*, const int64_t*,
                                   int64_t, int64_t, const DistillParams&, double);

}  // namespace llmk::cpu::grad
