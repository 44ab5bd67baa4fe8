// Linear layer on the CPU: y = x @ w^T (+ bias), with w in any dtype that dequant.h handles.
//
// Two paths:
//  - fused (small M: decode steps): each weight block is decoded to small integers once and
//    dotted with every x row straight away (sum(w*x) = scale * sum(q*x) + min * sum(x)), so no
//    float copy of the weights is written. Weight bytes are read once; x stays in f32.
//  - tiled (larger M: prefill): a tile of weight rows is dequantised to f32 into a per-thread
//    buffer and reused for all M rows by a register-blocked micro-kernel, amortising the
//    dequantisation over M.
// Both spread output rows (N) over cpu_pool().
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace llmk::cpu {

struct LinearArgs {
  float* y = nullptr;  // [M, N] f32, rows ldy apart
  int64_t ldy = 0;
  const float* x = nullptr;  // [M, K] f32, rows ldx apart
  int64_t ldx = 0;
  const void* w = nullptr;  // [N, K] in wtype, rows w_row_bytes apart (whole blocks)
  DType wtype = DType::F32;
  int64_t w_row_bytes = 0;
  const float* bias = nullptr;  // [N] f32, or null
  int64_t M = 0, N = 0, K = 0;
  bool accumulate = false;  // y += x @ w^T + bias (y is read), instead of y = ...
};

// Fused: a few x rows, each weight block decoded once for all of them and multiplied in f32;
// Tiled: more rows, over f32 tiles of the weights; Int8: a few rows quantised to 8 bits per 32
// (as Q8_0 quantises weights) and multiplied by integer dot products against the weight blocks
// (linear_int8_supports: every block type), as llama.cpp's CPU path does: less exact than the
// f32 paths.
enum class LinearPath { Auto, Fused, Tiled, Int8 };

// The weight dtypes LinearPath::Int8 takes (the block types; none without AVX2).
bool linear_int8_supports(DType wtype);
// Whether Auto takes Int8 for the few-row products it would give Fused, where the weight dtype
// has it. Process-wide; off by default (the f32 paths are the reference the tests hold to
// transformers' logits).
void set_int8_activations(bool on);
bool int8_activations();

// True for the weight dtypes linear() takes (the same set as can_dequantize()).
bool linear_supports(DType wtype);

// The path Auto picks for these arguments.
LinearPath linear_choose_path(const LinearArgs& a);

// y = x @ w^T + bias (y += with a.accumulate). `path` forces a path (for tests and benchmarks);
// Auto picks by M. Without AVX2 the fused path is not built and every call takes the tiled path.
void linear(const LinearArgs& a, LinearPath path = LinearPath::Auto);

}  // namespace llmk::cpu
