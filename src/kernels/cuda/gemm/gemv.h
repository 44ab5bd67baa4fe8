// The linear layer of one row (a batch-1 decode step): out[N] = w[N, K] . x[K] (+ bias), bf16
// (or fp16) operands, fp32 accumulation, bf16 or f32 out, any bias dtype fused; or the first half
// of a gated MLP in the same launch (out[j] = act(w[j] . x) * (w[F + j] . x) for a stacked gate|up
// w). Memory-bound: every weight byte is read once, so the kernel is
// built to keep HBM busy (16-byte loads, several in flight per lane) and to need no second
// launch (no split-K reduce, no bias kernel). cuda::linear takes it for M = 1 when
// gemv_applies() (linear.h).
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "kernels/cuda/activation.h"

namespace llmk::cuda {

// RoPE and the KV append in the epilogue of a Q|K|V projection's one-row linear (one token):
// the rows are Hq query heads, then Hkv key heads, then Hkv value heads of D each, rotated as
// cuda::rope rotates (rot_dim = D) and written to out; the key and value heads also go to their
// cache row (as cuda::kv_append: skipped when the row is outside [0, L)).
struct GemvRope {
  const int32_t* position = nullptr;   // the token's position (device memory)
  const int32_t* cache_row = nullptr;  // its KV cache row (device memory)
  void* k_cache = nullptr;             // [L, Hkv, D] of the output's dtype, strides (ld_l, ld_h, 1)
  void* v_cache = nullptr;
  int64_t kc_ld_l = 0, kc_ld_h = 0, vc_ld_l = 0, vc_ld_h = 0, L = 0;
  int D = 0, Hq = 0, Hkv = 0;
  bool half_split = true;
  double theta = 1e4, freq_scale = 1.0;
  const float* freq_factors = nullptr;  // optional [D/2] (device memory)
};

struct GemvArgs {
  void* out = nullptr;  // [N] out_dtype (in_dtype, or F32)
  DType out_dtype = DType::BF16;
  DType in_dtype = DType::BF16;  // x's and w's: BF16 or F16
  const void* x = nullptr;       // [K], 16-byte aligned
  const void* w = nullptr;       // [N, K], rows ldw elements apart, 16-byte aligned rows
  int64_t ldw = 0;
  const void* bias = nullptr;  // [N] bias_dtype (BF16, F16 or F32), or null
  DType bias_dtype = DType::BF16;
  int64_t N = 0, K = 0;
  // Gated output: w is a stacked [gate; up] of N = 2F rows, out gets F values
  // act(g) * u with g and u the two rows' products (+ bias) each rounded to in_dtype first,
  // exactly as the linear's output fed to gated_act would be. out_dtype must be in_dtype.
  bool gated = false;
  Activation act = Activation::SiLU;
  // RoPE epilogue (out of in_dtype, N = (Hq + 2 Hkv) D): not with a gated output.
  const GemvRope* rope = nullptr;
};

// Blocks of the launch.
unsigned gemv_blocks(const GemvArgs& a);

// Whether gemv() takes these operands: K and ldw multiples of 8 (16-byte chunks), x and w
// 16-byte aligned, N below 2^31, in_dtype BF16 or F16 and out_dtype in_dtype or F32; a gated
// output: N even, out of in_dtype; a RoPE epilogue: out of in_dtype, D even, N = (Hq + 2 Hkv) D.
bool gemv_applies(const GemvArgs& a);
// Enqueues the product on cuda::current_stream(). Returns false (nothing enqueued) where
// gemv_applies() is false or for dtypes it lacks; nvcc compiles this file and cannot parse fmt,
// so errors are the caller's to raise.
bool gemv(const GemvArgs& a);

}  // namespace llmk::cuda
