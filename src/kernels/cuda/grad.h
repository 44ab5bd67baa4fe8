// The GPU side of llmk.ops (python/llmk/ops.py): forward and backward of the ops PyTorch code
// trains through, the same functions as cpu::grad (kernels/cpu/grad.h), which is their reference.
//
// T is the storage type of every tensor: __nv_bfloat16, __half or float; the math is fp32 and
// each output is rounded to T once. Tensors are contiguous and row-major unless a declaration
// gives strides; sizes and strides in elements. Every launch goes on cuda::current_stream();
// nothing waits on the host and nothing allocates (rms_norm_bwd's scratch comes from the caller).
// 16-byte aligned pointers (and strides) take the vector kernels; any other alignment or size
// takes element-by-element kernels, which are correct but slower.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/grad.h"

namespace llmk::cuda::grad {

using cpu::grad::Act;        // SiLU, GeluTanh, GeluErf, None
using cpu::grad::RopeShape;  // [B, S, H, D] strides of x and y, cos/sin strides

// out = a + b over n elements, fp32 sum rounded once (out may alias a or b exactly).
template <class T>
void add(T* out, const T* a, const T* b, int64_t n);

// Per row of D: y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps), fp32 sum of squares.
// x, y: [rows, D]; w: [D]; rstd: [rows] fp32, written (the backward reads it).
// residual != null: sum = x + residual (fp32, rounded to T) is written to `sum` ([rows, D]) and
// normalised in place of x: the norm reads the sum as stored. sum may alias x or residual
// exactly; y may alias x when residual is null; no other overlap.
template <class T>
void rms_norm_fwd(T* y, float* rstd, const T* x, const T* residual, T* sum, const T* w,
                  int64_t rows, int64_t D, float eps);

// Bytes of fp32 scratch rms_norm_bwd needs to compute dw for [rows, D] (0 when rows or D is 0):
// at most min(rows, 4 * SMs) rows of D floats.
size_t rms_norm_bwd_workspace(int64_t rows, int64_t D);

// With xhat = x * rstd and g = dy * w: dx = rstd * (g - xhat * mean(g * xhat)) per row, and,
// when dw is not null, dw[j] = sum over rows of dy[r][j] * xhat[r][j]. x is what the forward
// normalised (the stored sum when it had a residual); rstd is the forward's.
// dres (optional, [rows, D]) is added to dx: the gradient that reaches the norm's input by
// another path (a residual stream), summed here instead of by a separate add.
// dy, x, dx: [rows, D]; w, dw: [D]; rstd: [rows]. dx may alias dy or dres exactly.
// dw is deterministic (the same bits on every run on one device): blocks write fp32 partial
// sums over fixed sets of rows into `workspace` (rms_norm_bwd_workspace(rows, D) bytes, 16-byte
// aligned; may be null when dw is), and a second kernel adds them up in a fixed order.
template <class T>
void rms_norm_bwd(T* dx, T* dw, void* workspace, const T* dy, const T* x, const T* w,
                  const float* rstd, int64_t rows, int64_t D, const T* dres = nullptr);

// out = act(gate) * up over n elements (Act::None: gate * up). out may alias gate or up.
template <class T>
void gated_fwd(T* out, const T* gate, const T* up, int64_t n, Act act);

// dgate = dout * up * act'(gate), dup = dout * act(gate) over n elements. Each output may alias
// one input exactly; dgate and dup must not overlap.
template <class T>
void gated_bwd(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int64_t n, Act act);

// y = act(z) and dz = dy * act'(z) over n elements (the activation of linear_act, after the GEMM
// that made z and before the backward's GEMMs). y may alias z, dz dy.
template <class T>
void act_fwd(T* y, const T* z, int64_t n, Act act);
template <class T>
void act_bwd(T* dz, const T* dy, const T* z, int64_t n, Act act);

// out[j] = sum over rows of x[r][j] (x: [rows, N] contiguous), fp32 sums over the rows in order,
// rounded once: a bias's gradient, deterministic.
template <class T>
void col_sum(T* out, const T* x, int64_t rows, int64_t N);

// RoPE by given tables, as cpu::grad::rope_rotate: each pair (a, b) of x, (i, i + rot_dim/2)
// when s.half_split else (2i, 2i+1), becomes (a cos - b sin, a sin + b cos) in y, with cos/sin
// [b, s, i] at b * s.cs_b + s * s.cs_s + i (i < rot_dim/2; cs_b = 0 shares one table over the
// batch). inverse rotates by the negative angle: the backward (dx from dy). Dims past rot_dim
// are copied, unless y == x (in place, same strides). x, y: [B, S, H, D] through s.x_st / s.y_st
// (any strides; the vector kernel needs D's stride 1). TC, the tables' type: float or T.
template <class T, class TC>
void rope_rotate(T* y, const T* x, const TC* cos, const TC* sin, const RopeShape& s, bool inverse);

}  // namespace llmk::cuda::grad
