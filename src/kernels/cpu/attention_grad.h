// Flash attention on the CPU with gradients: the reference and the CPU fallback behind the op
// llmk.ops.flash_attn, with flash-attn's semantics (variable-length batches through cumulative
// sequence offsets, grouped-query heads, bottom-right aligned causal mask, sliding window,
// softcap; no dropout, no bias). Float or double tensors, every sum in double. All tensors
// contiguous, row-major.
#pragma once

#include <cstdint>

namespace llmk::cpu::grad {

struct FlashShape {
  int64_t batch = 0;  // sequences
  // [batch + 1]: sequence b's queries are rows cu_q[b] .. cu_q[b+1]-1 of q.
  const int32_t* cu_q = nullptr;
  // [batch + 1]: its keys and values are rows cu_k[b] .. cu_k[b+1]-1 of k and v.
  const int32_t* cu_k = nullptr;
  // Query heads, key/value heads (Hq % Hkv == 0), head dim (of q, k and v).
  int64_t Hq = 0, Hkv = 0, D = 0;
  double scale = 0;  // multiplies q.k
  bool causal = false;
  // Visible keys: with sq, sk the sequence's query and key counts, query i (0-based in its
  // sequence) sees key j iff  i + sk - sq - left <= j <= i + sk - sq + right, where left/right
  // of -1 mean unbounded on that side; causal sets right = 0 (flash-attn's bottom-right
  // alignment when sq != sk). Not causal and both -1: every key.
  int64_t window_left = -1, window_right = -1;
  double softcap = 0;  // > 0: s = softcap * tanh(scale * q.k / softcap)
};

// q: [total_q, Hq, D]; k, v: [total_k, Hkv, D]; out: [total_q, Hq, D]; lse: [Hq, total_q]
// (flash-attn's varlen layout).
// Query head h uses kv head h / (Hq / Hkv). out[i][h] = sum_j p_ij v_j with
// p_ij = exp(s_ij - lse[h][i]) and lse[h][i] = log(sum_j exp(s_ij)) over the visible keys, in
// natural log. A query that sees no key gets out = 0 and lse = -infinity. Rows of out and lse
// outside every sequence are not written.
// Work is spread over (block of a sequence's queries, query head) pairs.
// Throws llmk::Error when Hq is not a multiple of Hkv or the offsets decrease.
template <class T>
void flash_fwd(T* out, T* lse, const T* q, const T* k, const T* v, const FlashShape& s);

// Gradients of the loss through out (dout: [total_q, Hq, D]) and, optionally, through lse
// (dlse: [Hq, total_q]; null means zero) to dq ([total_q, Hq, D]), dk and dv ([total_k, Hkv,
// D]), from the forward's out and lse. All three are written, not accumulated; dk and dv sum
// over the query heads of a group and over queries. With p_ij = exp(s_ij - lse_i),
// delta_i = dout_i . out_i - dlse_i and ds_ij = p_ij (dout_i . v_j - delta_i):
//   dv_j = sum_i p_ij dout_i,  dq_i = scale sum_j dr_ij k_j,  dk_j = scale sum_i dr_ij q_i,
// where dr = ds, or ds (1 - (s/softcap)^2) with a softcap. Rows whose lse is infinite (-inf: they
// saw no key; flash-attn's CUDA kernels mark such rows +inf) contribute nothing and get dq = 0;
// keys no query sees get dk = dv = 0.
// Two passes, each task owning the rows it writes, so the result does not depend on the number
// of threads: dq over (block of queries, query head), then dk and dv over (block of keys, kv
// head). The scores are computed in both.
template <class T>
void flash_bwd(T* dq, T* dk, T* dv, const T* dout, const T* dlse, const T* q, const T* k,
               const T* v, const T* out, const T* lse, const FlashShape& s);

}  // namespace llmk::cpu::grad
