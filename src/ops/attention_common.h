// What ops::attention, ops::attention_paged and ops::attention_varlen share: the resolved
// scale, the CUDA kernels' alignment rule, and the tensor part of the CUDA kernels' arguments.
// Internal to src/ops.
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <cstdint>
#include <string_view>

#include "core/error.h"
#include "core/tensor.h"
#include "ops/ops.h"

#ifdef LLMK_HAS_CUDA
#include <cuda_bf16.h>

#include "kernels/cuda/attention/attention.h"
#endif

namespace llmk::ops::detail {

// Counts one call on `path` in the process-wide AttentionStats (defined in attention.cpp).
enum class AttentionPath { kPrefill, kDecode, kChunked, kFallback, kCpu };
void count_attention(AttentionPath path);

// AttentionParams::scale, with 0 meaning 1/sqrt(D).
inline float resolved_scale(const AttentionParams& p, int64_t D) {
  return p.scale != 0.0f ? p.scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
}

// The CUDA kernels load 16 bytes at a time: `t` ([rows, heads, D]) must start 16-byte aligned
// with row and head strides that are multiples of 8 elements.
inline void require_16_byte_rows(std::string_view op, std::string_view name, const Tensor& t) {
  const bool ok = reinterpret_cast<uintptr_t>(t.data()) % 16 == 0 &&
                  (t.dim(0) <= 1 || t.stride(0) % 8 == 0) &&
                  (t.dim(1) <= 1 || t.stride(1) % 8 == 0);
  LLMK_CHECK(ok,
             "ops::{}: {} ({}, strides [{}]) must be 16-byte aligned, with row and head strides "
             "that are multiples of 8 elements, for the CUDA kernels",
             op, name, t.str(), fmt::join(t.strides(), ", "));
}

#ifdef LLMK_HAS_CUDA
// The kernels' arguments for out, q: [T, Hq, D] and k, v: [rows, Hkv, D] (any 16-byte rows; bf16
// or f16 data behind the bf16-typed pointers), with p's scale, window and softcap. The caller
// adds what its layout needs (positions, batches, pages, LSE).
inline cuda::AttentionArgs cuda_attention_args(Tensor& out, const Tensor& q, const Tensor& k,
                                               const Tensor& v, const AttentionParams& p) {
  cuda::AttentionArgs a;
  a.out = static_cast<__nv_bfloat16*>(out.data());
  a.out_t = out.stride(0);
  a.out_h = out.stride(1);
  a.q = static_cast<const __nv_bfloat16*>(q.data());
  a.q_t = q.stride(0);
  a.q_h = q.stride(1);
  a.k = static_cast<const __nv_bfloat16*>(k.data());
  a.k_t = k.stride(0);
  a.k_h = k.stride(1);
  a.v = static_cast<const __nv_bfloat16*>(v.data());
  a.v_t = v.stride(0);
  a.v_h = v.stride(1);
  a.T = static_cast<int>(q.dim(0));
  a.Hq = static_cast<int>(q.dim(1));
  a.Hkv = static_cast<int>(k.dim(1));
  a.D = static_cast<int>(q.dim(2));
  a.L = k.dim(0);
  a.scale = resolved_scale(p, q.dim(2));
  a.window = p.window;
  a.softcap = p.softcap;
  a.decode_early_reads = p.early_reads;
  a.fp16 = q.dtype() == DType::F16;
  a.fp32 = q.dtype() == DType::F32;
  if (batch_invariant()) a.decode_split = 1;  // one block reads all of a sequence's keys
  return a;
}
#endif

}  // namespace llmk::ops::detail
