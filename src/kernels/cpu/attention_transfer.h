// MiniLM-style attention transfer (llmk.ops.attention_transfer_loss) on the CPU, in float or
// double with sums in double: the reference for the CUDA kernels (kernels/cuda/
// attention_transfer.h) and the path for CPU tensors.
//
// Each side's heads are concatenated and split into R relation heads: relation r of token s is
// the slice [r d, (r + 1) d) of that token's row of R d values (teacher d = dt, student d = ds).
// Per batch b, relation r and query row i, with a_t = q_t,i . k_t,j scale_t and a_s likewise
// (scale = 1 / (sqrt(d) T), T the temperature), over the keys j the row sees (j <= i when
// causal, else all S):
//   lse = log sum_j e^a,   kl_i = sum_j p_t,j (a_t,j - a_s,j) - lse_t + lse_s = KL(p_t || p_s),
// terms where p_t is exactly 0 adding 0. The loss is the mean of kl over B R S rows; its
// gradient reaches the student only: with g = d loss / d kl_i (dout / (B R S) for the mean),
//   dS_ij = g scale_s (p_s,ij - p_t,ij),   dq_s,i = sum_j dS_ij k_s,j,   dk_s,j = sum_i dS_ij
//   q_s,i.
// No S x S matrix is formed: a row holds its S scores at most.
#pragma once

#include <cmath>
#include <cstdint>

namespace llmk::cpu::grad {

struct AttentionTransferParams {
  int64_t B = 0, S = 0;
  int64_t R = 1;             // relation heads
  int64_t dt = 0, ds = 0;    // relation head dims: teacher rows are R dt wide, student R ds
  double temperature = 1.0;  // > 0
  bool causal = true;

  double scale_t() const { return 1.0 / (std::sqrt(static_cast<double>(dt)) * temperature); }
  double scale_s() const { return 1.0 / (std::sqrt(static_cast<double>(ds)) * temperature); }
  int64_t rows() const { return B * R * S; }  // the rows the loss averages over
};

// tq, tk: [B, S, R dt]; sq, sk: [B, S, R ds] (contiguous). kl, lse_t, lse_s: [B, R, S], each
// row's KL and the two log-sum-exps (the backward reads them).
template <class T>
void attention_transfer_fwd(T* kl, T* lse_t, T* lse_s, const T* tq, const T* tk, const T* sq,
                            const T* sk, const AttentionTransferParams& p);

// dq, dk: [B, S, R ds] (each optional: null skips it), the gradients of the student's q and k
// for d loss / d kl_i = grad on every row, from the forward's lse_t and lse_s.
template <class T>
void attention_transfer_bwd(T* dq, T* dk, const T* tq, const T* tk, const T* sq, const T* sk,
                            const T* lse_t, const T* lse_s, double grad,
                            const AttentionTransferParams& p);

}  // namespace llmk::cpu::grad
