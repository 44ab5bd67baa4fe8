// ops::linear's CUDA argument checks, shared with the ops that fuse work into the one-row linear
// (ops::linear_gated, ops::linear_rope_kv_append), and the activation's CUDA enum. Internal to
// src/ops.
#pragma once

#include "core/tensor.h"
#include "ops/ops.h"

#ifdef LLMK_HAS_CUDA
#include "kernels/cuda/activation.h"
#include "kernels/cuda/gemm/linear.h"

namespace llmk::ops::detail {

// Checks out = x @ w^T (+ bias) on CUDA as ops::linear does (errors name ops::linear) and returns
// the launcher's arguments. gated_out: out holds half of w's rows (act(gate) * up).
cuda::LinearArgs linear_cuda_args(Tensor& out, const Tensor& x, const Tensor& w, const Tensor* bias,
                                  bool gated_out = false);
// The same for a block-quantised w (cuda::qlinear, cuda::qlinear_row).
cuda::QLinearArgs linear_cuda_qargs(Tensor& out, const Tensor& x, const Tensor& w,
                                    const Tensor* bias, bool accumulate, bool gated_out = false);

inline cuda::Activation cuda_activation(Activation act) {
  return act == Activation::SiLU ? cuda::Activation::SiLU : cuda::Activation::GeluTanh;
}

}  // namespace llmk::ops::detail
#endif
