// The CPU side of llmk.ops (python/llmk/ops.py): forward and backward of the ops PyTorch code
// trains through, in float or double: the reference for their CUDA kernels and the path for CPU
// tensors. Tensors contiguous and row-major unless a
// declaration gives strides; sizes and strides in elements.
#pragma once

#include <cstdint>

namespace llmk::cpu::grad {

// y = x * rstd * w per row of D, rstd[r] = 1 / sqrt(mean(x[r]^2) + eps) (the sum in double).
// x, y: [rows, D]; w: [D]; rstd: [rows], written (the backward reads it).
template <class T>
void rms_norm_fwd(T* y, T* rstd, const T* x, const T* w, int64_t rows, int64_t D, double eps);

// With xhat = x * rstd and g = dy * w: dx = rstd * (g - xhat * mean(g * xhat)) per row, and
// dw[j] = sum over rows of dy[r][j] * xhat[r][j] (dw may be null). Sums in double. dres
// (optional, [rows, D]) is added to dx; dx may alias it exactly.
template <class T>
void rms_norm_bwd(T* dx, T* dw, const T* dy, const T* x, const T* w, const T* rstd, int64_t rows,
                  int64_t D, const T* dres = nullptr);

// The activations of the gated and the linear ops.
enum class Act {
  SiLU,      // x sigmoid(x)
  GeluTanh,  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
  GeluErf,   // 0.5 x (1 + erf(x / sqrt(2)))
  None,      // x
};

// out = act(gate) * up over n elements (Act::None: the bilinear gate * up).
template <class T>
void gated_fwd(T* out, const T* gate, const T* up, int64_t n, Act act);

// dgate = dout * up * act'(gate), dup = dout * act(gate) over n elements.
template <class T>
void gated_bwd(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int64_t n, Act act);

// out = a + b over n elements (out may alias a or b).
template <class T>
void add(T* out, const T* a, const T* b, int64_t n);

// cos/sin tables for RoPE: for row r and pair i < rot_dim / 2,
//   angle = positions[r] * freq_scale * theta^(-2i / rot_dim) / (factors ? factors[i] : 1),
// computed in double and rounded to T once. cos, sin: [rows, rot_dim / 2]; positions: [rows];
// factors: [rot_dim / 2] or null (double: scalings such as Llama 3's are not exact in float).
// rot_dim even and > 0.
template <class T>
void rope_table(T* cos, T* sin, const int64_t* positions, int64_t rows, int rot_dim, double theta,
                double freq_scale, const double* factors);

// The layout rope_rotate works over: x and y indexed [B, S, H, D] through their own strides
// (x_st, y_st: of B, S, H and D in that order; D's need not be 1, so a [B, H, S, D] tensor or a
// slice of a fused qkv is read in place), cos and sin [b, s, i] at b * cs_b + s * cs_s + i
// (cs_b = 0 when the batch shares one table). rot_dim even, 0 < rot_dim <= D.
struct RopeShape {
  int64_t B = 0, S = 0, H = 0, D = 0;
  int64_t x_st[4] = {}, y_st[4] = {};
  int64_t cs_b = 0, cs_s = 0;
  int rot_dim = 0;
  bool half_split = true;  // pairs (i, i + rot_dim/2) ("neox", Hugging Face Llama), else (2i, 2i+1)
};

// Rotates each pair (a, b) of x into y: (a cos - b sin, a sin + b cos), in T; dims >= rot_dim
// are copied unchanged. inverse = true rotates by the negative angle, (a cos + b sin,
// b cos - a sin): the transpose of the rotation, so it is also the backward (dx from dy).
// y may be x itself (with the same strides); no other overlap.
template <class T>
void rope_rotate(T* y, const T* x, const T* cos, const T* sin, const RopeShape& s, bool inverse);

// C = alpha * op(A) op(B) + beta * C, row-major, leading dimensions in elements.
// C: [M, N] (ldc); op(A) = A: [M, K] (lda), or A^T with A: [K, M] when trans_a;
// op(B) = B: [K, N] (ldb), or B^T with B: [N, K] when trans_b.
// C must not overlap A or B. beta = 0 never reads C (it may hold NaN); alpha = 0 never reads A
// or B. Each element sums its K products in T, in order of k (the result does not depend on the
// thread count), then C = alpha * sum + beta * C. Tiles of C are spread over the thread pool.
template <class T>
void gemm(T* C, int64_t ldc, const T* A, int64_t lda, bool trans_a, const T* B, int64_t ldb,
          bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, T beta);

// The epilogue of linear_act (y = act(x W^T + bias)) after the product z = x W^T:
// z[r][j] += bias[j] in place (bias: [N] or null), then y[r][j] = act(z[r][j]).
// y, z: [rows, N]; y may be z itself (z then holds act(z): keep it only for Act::None).
template <class T>
void bias_act_fwd(T* y, T* z, const T* bias, int64_t rows, int64_t N, Act act);

// dz = dy * act'(z) (dz may be dy itself), and, when db is not null, db[j] = sum over rows of
// dz[r][j] (summed in double, in order of rows: deterministic). dz, dy, z: [rows, N]; db: [N].
template <class T>
void bias_act_bwd(T* dz, T* db, const T* dy, const T* z, int64_t rows, int64_t N, Act act);

}  // namespace llmk::cpu::grad
