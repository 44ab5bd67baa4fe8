// Linear layer on the GPU through cuBLASLt: out = x @ w^T (+ bias), bf16 operands (or fp16, or
// f32: in_dtype), fp32 accumulation, bf16, fp16 or f32 output. A single row (M = 1) runs llmk's own
// kernel instead (gemv.h, set_linear_gemv below): one launch, no split-K reduce, the bias fused.
//
// Bias: cuBLASLt's bias epilogue takes a bias of the output's dtype only (a bf16 bias for a bf16
// out, f32 for f32; the other pairing is rejected by its heuristic). Such a bias is fused. A bias
// of the other dtype is added by a small kernel after the GEMM (bias.h): one more launch, and the
// output read and written once more; for a bf16 out the sum is then rounded twice. Keep biases
// in the dtype of the outputs they feed (bf16 for Q/K/V) to stay on the fused path.
//
// Row-major in, row-major out: a row-major [R, C] matrix is the column-major [C, R] one, so the
// product is computed as out^T [N, M] = w [N, K] @ x^T [K, M] in column-major terms ("TN": w
// transposed, x not), which is also cuBLASLt's fastest layout for these operands.
//
// One process-wide cuBLASLt handle and a 32 MiB workspace per stream (from the caching
// allocator, at the stream's first call). Each distinct problem (shapes, leading dimensions,
// dtypes, bias, pointer alignments) gets a plan on first sight: descriptors, layouts and an
// algorithm, the fastest of the heuristic's first 8 for 64 rows or more (set_linear_tuning below;
// LLMK_LOG_TUNING=1 prints each tuning's candidates and times), else the heuristic's first; later
// calls reuse it, so a steady-state call does no search, no allocation and no host synchronisation,
// and can be captured in a CUDA graph. Make a stream's first call outside graph capture (its
// workspace is allocated then); a later first sight of a new problem inside a capture is fine (no
// timing there: its plan takes its bucket's choice, or the heuristic's first).
//
// Calls on different streams at once each use their stream's workspace (PyTorch callers run on
// torch's current stream); the plans are shared under a lock.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "kernels/cuda/activation.h"
#include "kernels/cuda/gemm/gemv.h"
#include "kernels/cuda/gemm/qlinear.h"

namespace llmk::cuda {

inline constexpr size_t kLinearWorkspaceBytes = size_t{32} << 20;

struct LinearArgs {
  void* out = nullptr;  // [M, N] in out_dtype (BF16, F16 or F32), rows ldo elements apart
  DType out_dtype = DType::BF16;
  int64_t ldo = 0;
  // x and w in in_dtype: BF16, F16 or F32 (f32 products in full fp32; the one-row kernel and the
  // fusions on it take bf16 and fp16).
  DType in_dtype = DType::BF16;
  const void* x = nullptr;  // [M, K], rows ldx elements apart (x_trans: stored [K, M])
  int64_t ldx = 0;
  const void* w = nullptr;  // [N, K], rows ldw elements apart (w_trans: stored [K, N])
  int64_t ldw = 0;
  // The operands stored transposed, as the backward of a linear reads them (dx = dy w takes w
  // as stored; dw = dy^T x takes both): x as [K, M] and w as [K, N] row-major, ldx >= M and
  // ldw >= N. The one-row kernel takes neither.
  bool x_trans = false, w_trans = false;
  const void* bias = nullptr;  // [N] in bias_dtype (BF16, F16 or F32), contiguous; or null
  DType bias_dtype = DType::BF16;
  int64_t M = 0, N = 0, K = 0;
  // GELU in cuBLASLt's epilogue (its tanh approximation, torch's approximate="tanh"): out =
  // gelu(x @ w^T + bias); aux, when set, also gets the pre-activation ([M, N] in out_dtype, rows
  // ld_aux apart, ld_aux a multiple of 8, 16-byte aligned). Only through linear_gelu below.
  bool gelu = false;
  void* aux = nullptr;
  int64_t ld_aux = 0;
  // out += x @ w^T (+ bias), in cuBLASLt's epilogue (beta = 1: out is read, then written in
  // place); the sum is rounded once, to out's dtype. Not with gelu; M = 1 then takes cuBLASLt,
  // not the one-row kernel.
  bool accumulate = false;
  // Every output row computed the same way whatever M (the rows beside it): one cuBLASLt
  // algorithm per problem without M, the heuristic's first that sums over K in one pass (no
  // split-K), chosen at 256 rows without timing and used for every M (an M it does not run at
  // throws); never the one-row kernel. Results also repeat from process to process. Not with
  // x_trans.
  bool batch_invariant = false;
};

// out = x @ w^T + bias, enqueued on cuda::current_stream(). Leading dimensions must hold a row
// (ldx, ldw >= K; ldo >= N) unless the matrix has a single row. Throws llmk::Error naming the
// shapes and the cuBLASLt status on failure.
void linear(const LinearArgs& a);

// linear with a.gelu set: one cuBLASLt call with GELU (and the bias, and the pre-activation in
// a.aux when set) in its epilogue. Returns false, with nothing enqueued, where cuBLASLt has no
// such algorithm for the operands (a bias of the other dtype or under-aligned, an under-aligned
// aux, K = 0): the caller then runs linear and the activation apart.
bool linear_gelu(const LinearArgs& a);

// The first half of a gated MLP for one row: a.w is a stacked [gate; up] of a.N = 2F rows and
// a.out gets F values act(x . gate_j) * (x . up_j) (bf16 out, each product rounded to bf16
// before the activation, as linear then gated_act would), in one launch of the one-row kernel.
// Returns false, with nothing enqueued, where that kernel does not take the operands (M > 1, an
// f32 out, the kernel switched off, layouts): the caller then runs linear and gated_act.
bool linear_gated_row(const LinearArgs& a, Activation act);

// A Q|K|V projection for one token with RoPE and the KV append in its epilogue (gemv.h's
// GemvRope): one launch instead of the linear and ops::rope_kv_append. False, with nothing
// enqueued, where the one-row kernel does not take the operands.
bool linear_rope_row(const LinearArgs& a, const GemvRope& rope);

// out = x @ w^T (+ bias) over block-quantised weights on the GPU (qlinear.h): up to
// kQGemvMaxRows rows in qgemv; more in qgemm on sm_90 (w dequantised into shared memory); else
// through bands of w's rows dequantised to bf16 (at most kQLinearBandBytes, a buffer per stream
// allocated at its first such call, outside graph capture) each multiplied by cuBLASLt (linear). x
// bf16; out bf16 or f32; bias bf16 or f32. Throws llmk::Error as linear does.
inline constexpr size_t kQLinearBandBytes = size_t{64} << 20;
void qlinear(const QLinearArgs& a);
// One token's product with an epilogue over quantised weights (QLinearArgs::gated or ::rope, as
// linear_gated_row and linear_rope_row have them over bf16 weights): qgemv with the epilogue.
// False, with nothing enqueued, where qgemv does not take the operands (qgemv_applies).
bool qlinear_row(const QLinearArgs& a);

// Counters since process start, for tests and benchmarks.
struct LinearStats {
  uint64_t calls = 0;          // linear() calls that ran a GEMM (cuBLASLt or the one-row kernel)
  uint64_t plans = 0;          // plans created (one heuristic search each)
  uint64_t tuned = 0;          // plans that timed the heuristic's candidates (set_linear_tuning)
  uint64_t bias_epilogue = 0;  // calls whose bias was added in cuBLASLt's epilogue
  uint64_t bias_kernel = 0;    // calls whose bias was added by a separate kernel (see linear.cpp)
  uint64_t gelu_epilogue = 0;  // linear_gelu calls that ran GELU in the epilogue
  uint64_t gemv = 0;           // calls the one-row kernel ran (gemv.h), bias included
  uint64_t qgemv = 0;          // qlinear calls qgemv ran (a few rows over quantised weights)
  uint64_t qgemm = 0;          // qlinear calls the dequantising GEMM ran (more rows, sm_90)
  uint64_t qbands = 0;         // bands qlinear dequantised for a GEMM (more rows, elsewhere)
};
LinearStats linear_stats();

// One row (M = 1, a batch-1 decode step) runs llmk's own kernel (gemv.h) where its operands
// allow (K a multiple of 8, 16-byte aligned rows), else cuBLASLt. Off: cuBLASLt always.
// Process-wide; for the tests and benchmarks that compare the two.
void set_linear_gemv(bool on);

// Tuning (on by default): the first problem of 64 rows or more in a bucket (the same problem
// with M rounded up to a power of two), met outside graph capture, times up to 8 of the
// heuristic's algorithms on its own operands (a few milliseconds and one host synchronisation)
// and keeps the fastest; the bucket's later problems take that choice where cuBLASLt accepts it
// for their shape, so prompts of many lengths tune a few times, not once each. Off: the
// heuristic's first, which makes results bit-reproducible from one process to the next.
// Process-wide; affects plans made after the call.
void set_linear_tuning(bool on);

}  // namespace llmk::cuda
