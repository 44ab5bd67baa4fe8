// Linear layers over block-quantised weights kept on the GPU (kernels/quant_layout.h's layout):
// out[M, N] = x[M, K] @ w[N, K]^T (+ bias), w one of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K,
// Q6_K.
//
// A few rows (qgemv: M <= kQGemvMaxRows, a decode step) stream the weights once and decode them
// in registers into bf16 A fragments of mma.sync m16n8k16 (x the B operand, 8 tokens as its 8
// columns, a second product for tokens 9 to 16; fp32 accumulation) that hold each weight's integer
// value exactly; each block's scale (and minimum) is applied in fp32 to its partial sums, so the
// product is over the file's weights, as the CPU's is (one token over Q4_0, Q4_1 and Q8_0:
// qgemv1, the same products with each block's sums in an mma column of their own). More rows:
// qdequant a band of w's rows into bf16 (each weight its fp32 value rounded once: the matrix a
// load-time dequantisation gives) and run cuBLASLt on it (cuda::linear), band after band; or, on
// sm_90, qgemm (below), which decodes the same bf16 weights into shared memory tile by tile
// (cuda::qlinear times the two and keeps the faster for each problem size).
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "kernels/cuda/gemm/gemv.h"

namespace llmk::cuda {

inline constexpr int64_t kQGemvMaxRows = 16;

struct QLinearArgs {
  void* out = nullptr;  // [M, N] of out_dtype (BF16 or F32), rows ldo elements apart
  DType out_dtype = DType::BF16;
  int64_t ldo = 0;
  const void* x = nullptr;  // [M, K] bf16, rows ldx elements apart
  int64_t ldx = 0;
  const void* w = nullptr;  // [N, K] in the GPU layout of wtype
  DType wtype = DType::Q4_K;
  const void* bias = nullptr;  // [N] of bias_dtype (BF16 or F32), or null
  DType bias_dtype = DType::BF16;
  int64_t M = 0, N = 0, K = 0;
  bool accumulate = false;  // out += (the sum, then the bias, added to out's value, rounded once)
  // One token's epilogues, as gemv.h's GemvArgs has them (qgemv with M = 1, out BF16, bias BF16
  // or none, not accumulating): a gated output act(g) * u of a stacked gate|up (N = 2F, out [F]),
  // or RoPE and the KV append of a Q|K|V projection (N = (Hq + 2 Hkv) D).
  bool gated = false;
  Activation act = Activation::SiLU;
  const GemvRope* rope = nullptr;
};

// Whether qgemv takes the operands: a kept type (qlayout::gpu_keeps), K a multiple of its block,
// 1 <= M <= kQGemvMaxRows, x's rows 16-byte aligned (ldx and x), out BF16 or F32, bias BF16 or
// F32, N below 2^31; with an epilogue (gated or rope), as QLinearArgs says.
bool qgemv_applies(const QLinearArgs& a);
// Enqueues the product on cuda::current_stream(); false (nothing enqueued) where it does not apply.
bool qgemv(const QLinearArgs& a);

// More rows on Hopper (sm_90a): one GEMM (gemm_act.cu's kernel) whose producer warpgroups
// dequantise w's tiles into shared memory as qdequant would (each weight's fp32 value rounded
// once to bf16) for the wgmma consumers; x bf16 (ldx a multiple of 8), out bf16 (ldo a multiple
// of 8), bias bf16 or none. qgemm_applies: whether it takes the operands (not on another device,
// with other dtypes, misaligned rows, for Q5_1 and Q5_K, which it is not built for, or after
// set_gemm_act(false)). qgemm enqueues on
// cuda::current_stream() and returns true, or returns false with nothing enqueued where it does
// not apply (or the driver refused a tensor map).
bool qgemm_applies(const QLinearArgs& a);
bool qgemm(const QLinearArgs& a);

// dst rows [0, rows) = w's rows [n0, n0 + rows) dequantised, in dtype (BF16), rows ld elements
// apart (ld >= K, a multiple of 8; dst 16-byte aligned); on cuda::current_stream().
void qdequant(void* dst, DType dtype, int64_t ld, const void* w, DType wtype, int64_t N, int64_t K,
              int64_t n0, int64_t rows);

// out row t (bf16, rows ldo elements apart: ldo a multiple of 8, out 16-byte aligned) = the table's
// row ids[t * ids_stride] dequantised (ids in device memory; zeros for an id outside [0, V)): the
// token embeddings of a quantised table, on cuda::current_stream().
void qembedding(void* out, int64_t ldo, const void* table, DType wtype, int64_t V, int64_t D,
                const int32_t* ids, int64_t ids_stride, int64_t T);

}  // namespace llmk::cuda
