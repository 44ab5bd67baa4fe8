// Forward and backward of the ops that PyTorch code trains through (llmk.ops, python/llmk/ops.py):
// RMSNorm, the gated activations, RoPE, flash attention, the linear with its activation and the
// losses (diversity, distillation, attention transfer). The forward ops keep what their backward
// reads (rstd, lse, the pre-activation).
//
// Tensors are contiguous unless said otherwise, all on one device. CPU: f32 or f64 (every tensor
// of a call the same, except the i32/i64 index tensors); the kernels sum in double. CUDA: bf16 or
// f16 (f32 too where said), fp32 accumulation, on cuda::current_stream(); rope_table has no
// CUDA kernel (CUDA tensors throw).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/cpu/distill.h"

namespace llmk::ops {

// y = x / sqrt(mean(x^2) + eps) * w per row. x, y: [rows, D]; w: [D]; rstd: [rows] (f32 on CUDA),
// written for the backward. With residual (not null): sum = x + residual is written and normalised
// instead (the pre-norm residual step: the new residual stream and its norm in one op).
void rms_norm_forward(Tensor& y, Tensor& rstd, const Tensor& x, const Tensor& w, double eps,
                      const Tensor* residual = nullptr, Tensor* sum = nullptr);
// dx from dy through the norm of x (the sum, when the forward had a residual), rstd from the
// forward; dw (optional) summed over rows, deterministically. dres (optional, like dx) is added to
// dx: the gradient reaching the norm's input by another path (the residual stream). dx may alias
// dres exactly and nothing else. CUDA: dw needs rms_norm_backward_workspace(x) bytes of CUDA
// memory from the caller.
void rms_norm_backward(Tensor& dx, Tensor* dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                       const Tensor& rstd, Tensor* workspace = nullptr,
                       const Tensor* dres = nullptr);
size_t rms_norm_backward_workspace(const Tensor& x);

enum class Act : uint8_t {
  None,      // identity (linear_act only)
  SiLU,      // x sigmoid(x)
  GeluTanh,  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
  GeluErf,   // 0.5 x (1 + erf(x / sqrt(2)))
};
std::string_view act_name(Act a);

// out = act(gate) * up, element-wise over same-shaped tensors (act not None).
void gated_forward(Tensor& out, const Tensor& gate, const Tensor& up, Act act);
void gated_backward(Tensor& dgate, Tensor& dup, const Tensor& dout, const Tensor& gate,
                    const Tensor& up, Act act);

// cos, sin: [rows, rot_dim / 2] for positions [rows] (i64): angle = pos * freq_scale *
// theta^(-2i / rot_dim) / factors[i] (factors: optional [rot_dim / 2] f64), in double.
void rope_table(Tensor& cos, Tensor& sin, const Tensor& positions, double theta,
                double freq_scale = 1.0, const Tensor* factors = nullptr);
// y = x rotated (inverse: by the negative angle, the backward). x, y: [B, S, H, D], any strides
// (y may be x exactly); cos, sin: [B or 1, S, R] with R = rot_dim / 2 <= D / 2, the last dim
// contiguous, of x's dtype (or f32 on CUDA). half_split: pairs (i, i + R) (NeoX, Hugging Face),
// else (2i, 2i + 1).
void rope_rotate(Tensor& y, const Tensor& x, const Tensor& cos, const Tensor& sin, bool half_split,
                 bool inverse);

struct FlashParams {
  double scale = 0;  // multiplies q.k; 0: 1/sqrt(D)
  bool causal = false;
  // Query i of a sequence with sq queries and sk keys sees key j iff i + sk - sq - left <= j <=
  // i + sk - sq + right; -1: unbounded on that side. causal makes right 0.
  int64_t window_left = -1, window_right = -1;
  double softcap = 0;  // > 0: scores = softcap * tanh(scores / softcap)
  // The most keys of any sequence: CUDA needs it (the offsets stay on the device); the CPU reads
  // it from cu_k.
  int64_t max_seqlen_k = -1;
  // The backward's dq summed in a fixed order on CUDA (the CPU's always is).
  bool deterministic = false;
};
// Variable-length batches in flash-attn's layout: q, out: [total_q, Hq, D]; k, v: [total_k, Hkv,
// D]; cu_q, cu_k: [batch + 1] i32 (0, then running totals), on q's device; lse: [Hq, total_q]
// (natural log; -inf where a query sees no key, its output 0; f32 on CUDA). CUDA: head dims with
// a tensor-core prefill kernel run it, other multiples of 8 up to 256 the generic kernel (counted
// as a fallback); windows need the causal mask there.
void flash_attention_forward(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k,
                             const Tensor& v, const Tensor& cu_q, const Tensor& cu_k,
                             const FlashParams& p);
// dq, dk, dv from dout (and dlse, optional) given the forward's out and lse; dk and dv summed
// over each group of query heads. CPU: deterministic. CUDA: dk and dv deterministic, dq's parts
// added in fp32 in no fixed order; workspace: flash_attention_backward_workspace(q, sequences)
// bytes of CUDA memory from the caller (stream-ordered with the call), sequences = cu_q's
// length - 1.
void flash_attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout,
                              const Tensor* dlse, const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& out, const Tensor& lse, const Tensor& cu_q,
                              const Tensor& cu_k, const FlashParams& p,
                              Tensor* workspace = nullptr);
size_t flash_attention_backward_workspace(const Tensor& q, int64_t sequences);

// y = act(z), z = x w^T + bias. x: [M, K]; w: [N, K]; bias: optional [N]; y and z (optional:
// kept for the backward) [M, N]. CUDA: bf16 through cuBLASLt with the bias in its epilogue;
// GeluTanh in its epilogue too (z as its aux output), other activations (cuBLASLt has no erf GELU
// nor SiLU epilogue) in a pass of their own after the GEMM.
void linear_act_forward(Tensor& y, Tensor* z, const Tensor& x, const Tensor& w, const Tensor* bias,
                        Act act);
// With dz = dy * act'(z): dx = dz w, dw = dz^T x, db = the column sums of dz (each optional).
// dy is not modified. CUDA (bf16, cuBLASLt): dz goes to dz_buffer, [M, N] bf16 from the caller.
void linear_act_backward(Tensor* dx, Tensor* dw, Tensor* db, const Tensor& dy, const Tensor& x,
                         const Tensor& w, const Tensor& z, Act act, Tensor* dz_buffer = nullptr);

// Pairwise cosine diversity of x [N, d] (kernels/cpu/diversity.h defines it): out [1] (rows
// false: the mean over ordered pairs i != j of 1 - cos) or [N] (rows: each row's mean over the
// others); the backward gives dx from dout of out's shape. CPU: f32 or f64, out and dout in x's
// dtype; CUDA: bf16, f16 or f32 x, f32 out and dout, rows of at most
// cuda::grad::cosine_diversity_max_dim() values, and cosine_diversity_workspace(x) bytes of CUDA
// memory from the caller.
void cosine_diversity_forward(Tensor& out, const Tensor& x, bool rows, Tensor* workspace = nullptr);
void cosine_diversity_backward(Tensor& dx, const Tensor& dout, const Tensor& x, bool rows,
                               Tensor* workspace = nullptr);
size_t cosine_diversity_workspace(const Tensor& x);

// Distillation losses from logits (kernels/cpu/distill.h defines them): per row of student and
// teacher [rows, V] (same float dtype, contiguous), loss [rows] (f32 for 16-bit logits, else
// their dtype) and, when grad is not null, grad [rows, V] (the logits' dtype) = d loss[r] /
// d student[r] times grad_scale, one value on the logits' device (null: 1; f32 on CUDA, the
// logits' dtype on the CPU), so that a reduction's 1/n stays on the device. labels: [rows] int64
// or null (alpha must be 0 then). grad may be student itself: the gradient replaces the logits
// (and teacher may be student too: the hard label alone, with alpha 1).
using DistillParams = cpu::grad::DistillParams;
using Divergence = cpu::grad::Divergence;
void distill_forward(Tensor& loss, Tensor* grad, const Tensor& student, const Tensor& teacher,
                     const Tensor* labels, const DistillParams& p,
                     const Tensor* grad_scale = nullptr);
// x [rows, cols] *= s per row (s: [rows] or [1] on x's device; f32 on CUDA, x's dtype on the
// CPU), in place. CUDA: rows whose factor is exactly 1 are left untouched without being read.
void scale_rows(Tensor& x, const Tensor& s);

// MiniLM-style attention transfer (kernels/cpu/attention_transfer.h defines it). tq, tk:
// [B, S, R dt] and sq, sk: [B, S, R ds], each side's heads concatenated (one dtype, contiguous);
// R = relation_heads relation heads, which must divide both widths. kl, lse_t, lse_s: [B, R, S]
// (f32 on CUDA, the inputs' dtype on the CPU): each row's KL(teacher || student) and the two
// log-sum-exps the backward reads. CPU: f32 or f64; CUDA: bf16 or f16 where
// attention_transfer_unsupported says "".
struct AttentionTransferOptions {
  int64_t relation_heads = 1;
  double temperature = 1.0;  // > 0
  bool causal = true;
};
void attention_transfer_forward(Tensor& kl, Tensor& lse_t, Tensor& lse_s, const Tensor& tq,
                                const Tensor& tk, const Tensor& sq, const Tensor& sk,
                                const AttentionTransferOptions& o);
// dq, dk (each optional; sq's shape and dtype): the gradients of sq and sk for the mean of kl
// over its B R S rows, times dout (one value on the inputs' device: f32 on CUDA, the inputs'
// dtype on the CPU; on CUDA it stays there, so nothing waits on the host). lse_t, lse_s: the
// forward's.
void attention_transfer_backward(Tensor* dq, Tensor* dk, const Tensor& dout, const Tensor& tq,
                                 const Tensor& tk, const Tensor& sq, const Tensor& sk,
                                 const Tensor& lse_t, const Tensor& lse_s,
                                 const AttentionTransferOptions& o);
// "" where llmk's kernels take these inputs (shaped as above), else why not in one line: the CPU
// kernel takes f32 and f64; the CUDA kernels (in CUDA builds) bf16 and f16, relation head dims
// that are multiples of 8 up to 256 and 16-byte aligned data. llmk.ops runs torch code then.
std::string attention_transfer_unsupported(const Tensor& tq, const Tensor& tk, const Tensor& sq,
                                           const Tensor& sk, int64_t relation_heads);

// Which kernel ran how often for these ops since the last reset (process-wide): one entry per
// (op, kernel), with the reason when the kernel is a fallback.
struct KernelCount {
  std::string op, kernel, reason;
  uint64_t calls = 0;
};
std::vector<KernelCount> train_op_stats();
void reset_train_op_stats();

}  // namespace llmk::ops
