// Flash attention forward and backward on the CPU: one query row (or, in the dk/dv pass, one key
// row) at a time against the rows it pairs with, scores and sums in double, tasks spread over
// the thread pool. Each output row is computed by one task in a fixed order, so results do not
// depend on the number of threads.
#include "kernels/cpu/attention_grad.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"

namespace llmk::cpu::grad {

namespace {

// Rows of one sequence handled by one task: local indices [begin, end) of sequence b.
struct RowBlock {
  int64_t b, begin, end;
};

// Queries per task in the forward and dq passes, keys per task in the dk/dv pass: small enough
// to balance causal work, large enough that a task outweighs its scheduling.
constexpr int64_t kBlockRows = 16;

std::vector<RowBlock> row_blocks(const int32_t* cu, int64_t batch) {
  std::vector<RowBlock> blocks;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t n = cu[b + 1] - cu[b];
    for (int64_t i = 0; i < n; i += kBlockRows)
      blocks.push_back({b, i, std::min(n, i + kBlockRows)});
  }
  return blocks;
}

// Half-open range of local indices.
struct Span {
  int64_t begin, end;
  bool empty() const { return end <= begin; }
};

// The mask of one sequence. Query i sees key j iff i + off - left <= j <= i + off + right with
// off = sk - sq; a negative left or right is unbounded on that side.
struct Mask {
  int64_t sq, sk, left, right;

  Mask(const FlashShape& s, int64_t b) {
    sq = s.cu_q[b + 1] - s.cu_q[b];
    sk = s.cu_k[b + 1] - s.cu_k[b];
    // Windows wider than sq + sk mask nothing; clamping them keeps the index sums below in range.
    const int64_t wide = sq + sk;
    left = s.window_left < 0 ? -1 : std::min(s.window_left, wide);
    right = s.causal ? 0 : s.window_right < 0 ? -1 : std::min(s.window_right, wide);
  }

  Span keys_seen_by(int64_t i) const {
    const int64_t diag = i + sk - sq;
    return {left < 0 ? 0 : std::max<int64_t>(0, diag - left),
            right < 0 ? sk : std::min(sk, diag + right + 1)};
  }
  Span queries_seeing(int64_t j) const {
    const int64_t diag = j - (sk - sq);
    return {right < 0 ? 0 : std::max<int64_t>(0, diag - right),
            left < 0 ? sq : std::min(sq, diag + left + 1)};
  }
};

template <class T>
double dot(const T* a, const T* b, int64_t n) {
  // Four partial sums: independent chains the compiler can keep in vector lanes.
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += static_cast<double>(a[i]) * b[i];
    s1 += static_cast<double>(a[i + 1]) * b[i + 1];
    s2 += static_cast<double>(a[i + 2]) * b[i + 2];
    s3 += static_cast<double>(a[i + 3]) * b[i + 3];
  }
  for (; i < n; ++i) s0 += static_cast<double>(a[i]) * b[i];
  return (s0 + s1) + (s2 + s3);
}

// acc += c * x
template <class T>
void axpy(double* acc, double c, const T* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) acc[i] += c * static_cast<double>(x[i]);
}

template <class T>
void store(T* y, const double* acc, double c, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<T>(c * acc[i]);
}

// A score s and its derivative by the raw score r = scale * q.k.
struct Score {
  double s, ds_dr;
};

template <class T>
Score score(const T* q, const T* k, const FlashShape& sh) {
  const double r = sh.scale * dot(q, k, sh.D);
  if (sh.softcap <= 0) return {r, 1.0};
  const double t = std::tanh(r / sh.softcap);
  return {sh.softcap * t, 1.0 - t * t};
}

// Row strides of the [rows, heads, D] tensors, and the head stride of the [heads, rows] lse (the
// total of query rows).
struct Strides {
  int64_t q, kv, lse;
  explicit Strides(const FlashShape& s)
      : q(s.Hq * s.D), kv(s.Hkv * s.D), lse(s.batch > 0 ? s.cu_q[s.batch] : 0) {}
};

void check_shape(const FlashShape& s) {
  LLMK_CHECK(s.batch >= 0 && s.D >= 0 && s.Hkv > 0 && s.Hq >= s.Hkv && s.Hq % s.Hkv == 0,
             "flash attention: bad shape batch={} Hq={} Hkv={} D={}", s.batch, s.Hq, s.Hkv, s.D);
  for (int64_t b = 0; b < s.batch; ++b) {
    LLMK_CHECK(s.cu_q[b] >= 0 && s.cu_q[b] <= s.cu_q[b + 1] && s.cu_k[b] >= 0 &&
                   s.cu_k[b] <= s.cu_k[b + 1],
               "flash attention: sequence offsets decrease at sequence {}", b);
  }
}

}  // namespace

template <class T>
void flash_fwd(T* out, T* lse, const T* q, const T* k, const T* v, const FlashShape& s) {
  check_shape(s);
  const int64_t D = s.D, group = s.Hq / s.Hkv;
  const Strides st(s);
  const std::vector<RowBlock> blocks = row_blocks(s.cu_q, s.batch);
  const int64_t tasks = static_cast<int64_t>(blocks.size()) * s.Hq;
  cpu_pool().parallel_for(tasks, 1, [&](int64_t t0, int64_t t1) {
    std::vector<double> p, acc(static_cast<size_t>(D));
    for (int64_t t = t0; t < t1; ++t) {
      const RowBlock& blk = blocks[static_cast<size_t>(t / s.Hq)];
      const int64_t h = t % s.Hq, hk = h / group;
      const Mask mask(s, blk.b);
      const int64_t q0 = s.cu_q[blk.b];
      const T* kh = k + s.cu_k[blk.b] * st.kv + hk * D;  // key 0 of the sequence, head hk
      const T* vh = v + s.cu_k[blk.b] * st.kv + hk * D;
      for (int64_t i = blk.begin; i < blk.end; ++i) {
        const T* qi = q + (q0 + i) * st.q + h * D;
        T* oi = out + (q0 + i) * st.q + h * D;
        T& li = lse[h * st.lse + q0 + i];
        const Span keys = mask.keys_seen_by(i);
        if (keys.empty()) {
          std::fill(oi, oi + D, T(0));
          li = -std::numeric_limits<T>::infinity();
          continue;
        }
        p.resize(static_cast<size_t>(keys.end - keys.begin));
        double max = -std::numeric_limits<double>::infinity();
        for (int64_t j = keys.begin; j < keys.end; ++j) {
          const double sij = score(qi, kh + j * st.kv, s).s;
          p[static_cast<size_t>(j - keys.begin)] = sij;
          max = std::max(max, sij);
        }
        std::fill(acc.begin(), acc.end(), 0.0);
        double sum = 0;
        for (int64_t j = keys.begin; j < keys.end; ++j) {
          const double e = std::exp(p[static_cast<size_t>(j - keys.begin)] - max);
          sum += e;
          axpy(acc.data(), e, vh + j * st.kv, D);
        }
        store(oi, acc.data(), 1.0 / sum, D);
        li = static_cast<T>(max + std::log(sum));
      }
    }
  });
}

template <class T>
void flash_bwd(T* dq, T* dk, T* dv, const T* dout, const T* dlse, const T* q, const T* k,
               const T* v, const T* out, const T* lse, const FlashShape& s) {
  check_shape(s);
  const int64_t D = s.D, group = s.Hq / s.Hkv;
  const Strides st(s);
  const int64_t total_q = s.batch > 0 ? s.cu_q[s.batch] : 0;
  // delta_i = dout_i . out_i - dlse_i per (query row, head), written by the dq pass for rows
  // that see a key and read by the dk/dv pass.
  std::vector<double> delta(static_cast<size_t>(total_q * s.Hq), 0.0);

  // Pass 1: dq_i = scale sum_j dr_ij k_j, one (query block, query head) per task.
  const std::vector<RowBlock> qblocks = row_blocks(s.cu_q, s.batch);
  cpu_pool().parallel_for(
      static_cast<int64_t>(qblocks.size()) * s.Hq, 1, [&](int64_t t0, int64_t t1) {
        std::vector<double> acc(static_cast<size_t>(D));
        for (int64_t t = t0; t < t1; ++t) {
          const RowBlock& blk = qblocks[static_cast<size_t>(t / s.Hq)];
          const int64_t h = t % s.Hq, hk = h / group;
          const Mask mask(s, blk.b);
          const int64_t q0 = s.cu_q[blk.b];
          const T* kh = k + s.cu_k[blk.b] * st.kv + hk * D;
          const T* vh = v + s.cu_k[blk.b] * st.kv + hk * D;
          for (int64_t i = blk.begin; i < blk.end; ++i) {
            const int64_t row = q0 + i;
            const T* qi = q + row * st.q + h * D;
            const T* doi = dout + row * st.q + h * D;
            T* dqi = dq + row * st.q + h * D;
            const double li = static_cast<double>(lse[h * st.lse + row]);
            const Span keys = mask.keys_seen_by(i);
            if (keys.empty() || std::isinf(li)) {
              std::fill(dqi, dqi + D, T(0));
              continue;
            }
            const double di = dot(doi, out + row * st.q + h * D, D) -
                              (dlse != nullptr ? static_cast<double>(dlse[h * st.lse + row]) : 0.0);
            delta[static_cast<size_t>(row * s.Hq + h)] = di;
            std::fill(acc.begin(), acc.end(), 0.0);
            for (int64_t j = keys.begin; j < keys.end; ++j) {
              const Score sc = score(qi, kh + j * st.kv, s);
              const double pij = std::exp(sc.s - li);
              const double dr = pij * (dot(doi, vh + j * st.kv, D) - di) * sc.ds_dr;
              axpy(acc.data(), dr, kh + j * st.kv, D);
            }
            store(dqi, acc.data(), s.scale, D);
          }
        }
      });

  // Pass 2: dv_j = sum_i p_ij dout_i and dk_j = scale sum_i dr_ij q_i over the query heads of
  // kv head hk, one (key block, kv head) per task.
  const std::vector<RowBlock> kblocks = row_blocks(s.cu_k, s.batch);
  cpu_pool().parallel_for(
      static_cast<int64_t>(kblocks.size()) * s.Hkv, 1, [&](int64_t t0, int64_t t1) {
        std::vector<double> acc_k(static_cast<size_t>(D)), acc_v(static_cast<size_t>(D));
        for (int64_t t = t0; t < t1; ++t) {
          const RowBlock& blk = kblocks[static_cast<size_t>(t / s.Hkv)];
          const int64_t hk = t % s.Hkv;
          const Mask mask(s, blk.b);
          const int64_t q0 = s.cu_q[blk.b];
          for (int64_t j = blk.begin; j < blk.end; ++j) {
            const int64_t row = s.cu_k[blk.b] + j;
            const T* kj = k + row * st.kv + hk * D;
            const T* vj = v + row * st.kv + hk * D;
            std::fill(acc_k.begin(), acc_k.end(), 0.0);
            std::fill(acc_v.begin(), acc_v.end(), 0.0);
            const Span queries = mask.queries_seeing(j);
            for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
              for (int64_t i = queries.begin; i < queries.end; ++i) {
                const int64_t qrow = q0 + i;
                const double li = static_cast<double>(lse[h * st.lse + qrow]);
                if (std::isinf(li)) continue;
                const T* qi = q + qrow * st.q + h * D;
                const T* doi = dout + qrow * st.q + h * D;
                const Score sc = score(qi, kj, s);
                const double pij = std::exp(sc.s - li);
                const double di = delta[static_cast<size_t>(qrow * s.Hq + h)];
                const double dr = pij * (dot(doi, vj, D) - di) * sc.ds_dr;
                axpy(acc_v.data(), pij, doi, D);
                axpy(acc_k.data(), dr, qi, D);
              }
            }
            store(dk + row * st.kv + hk * D, acc_k.data(), s.scale, D);
            store(dv + row * st.kv + hk * D, acc_v.data(), 1.0, D);
          }
        }
      });
}

#define LLMK_ATTENTION_GRAD_INSTANTIATE(T)                                                 \
  template void flash_fwd<T>(T*, T*, const T*, const T*, const T*, const FlashShape&);     \
  template void flash_bwd<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*, \
                             const T*, const T*, const FlashShape&);
LLMK_ATTENTION_GRAD_INSTANTIATE(float)
LLMK_ATTENTION_GRAD_INSTANTIATE(double)
#undef LLMK_ATTENTION_GRAD_INSTANTIATE

}  // namespace llmk::cpu::grad
