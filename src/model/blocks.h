// Building blocks shared by the architectures.
#pragma once

#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/weights.h"
#include "ops/ops.h"

namespace llmk {

// A linear layer whose output columns are several projections side by side (Q|K|V, gate|up).
// Loaded as one stacked matrix when the parts can share a dtype (always on CUDA), so one GEMM
// computes them all; otherwise the parts stay separate and write their column ranges of the
// output. Biases, when present, follow the same layout. A single part is a tensor the file
// already stores fused (Phi-3's qkv_proj, gate_up_proj): loaded as any matrix.
struct Projection {
  Tensor w, b;                 // stacked [rows, cols] and [rows], or undefined
  std::vector<Tensor> ws, bs;  // the parts, when not stacked
  int64_t rows = 0;

  // weight_names/shapes: the parts in output order; bias_names: empty or one per part (all
  // absent is allowed: no bias).
  void load(WeightLoader& loader, const std::vector<std::string>& weight_names,
            const std::vector<Shape>& shapes, const std::vector<std::string>& bias_names = {});
  // The stacked bias, or null (none, or parts kept separate).
  const Tensor* bias() const { return b.defined() ? &b : nullptr; }
  // out: [T, rows] (row stride free); x: [T, cols].
  void apply(Tensor& out, const Tensor& x) const;
  // A gate|up projection's gated activation: out [T, rows / 2] = act(gate) * up, through
  // scratch [T, rows] (which a stacked projection may leave alone: ops::linear_gated).
  void apply_gated(Tensor& out, const Tensor& x, ops::Activation act, Tensor& scratch) const;
};

}  // namespace llmk
