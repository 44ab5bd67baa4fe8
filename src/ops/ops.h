// The single entry point per op. Each checks shapes, dtypes and devices (llmk::Error naming the
// op, the argument and what was expected), then calls the kernel for the tensors' device.
// The CPU computes in fp32: activations, outputs and KV caches are f32 there; weights may be any
// supported dtype where noted.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace llmk::ops {

// out: [T, D] f32; table: [V, D] f32/f16/bf16/any block type; ids: [T] i32 (each in [0, V)).
void embedding(Tensor& out, const Tensor& table, const Tensor& ids);

// out, x: [..., D] f32 (may alias); w: [D] f32.
// y = x / sqrt(mean(x^2) + eps) * w, or * (1 + w) when add_one (Gemma).
void rms_norm(Tensor& out, const Tensor& x, const Tensor& w, float eps, bool add_one = false);

enum class RopeLayout {
  Adjacent,   // rotates pairs (2i, 2i+1): GGUF llama files (the converter permuted Q/K)
  HalfSplit,  // rotates pairs (i, i + rot_dim/2): NeoX, HF Llama/Qwen2/Gemma
};
struct RopeParams {
  int rot_dim = 0;         // rotated dims from the start of each head (even, <= head dim); 0 = all
  float theta = 10000.0f;  // base: inv_freq[i] = theta^(-2i/rot_dim)
  RopeLayout layout = RopeLayout::HalfSplit;
  float freq_scale = 1.0f;              // linear position scaling: angle = pos * freq_scale * inv_freq
  const Tensor* freq_factors = nullptr; // optional [rot_dim/2] f32: inv_freq[i] /= factors[i] (llama3)
};
// x: [T, H, D] f32, rotated in place; positions: [T] i32.
void rope(Tensor& x, const Tensor& positions, const RopeParams& p);

// out: [M, N] f32 = x [M, K] f32 @ w^T + bias, with w: [N, K] in f32/f16/bf16/Q8_0/Q4_0/Q4_1/
// Q5_0/Q4_K/Q6_K (dequantised block by block, spread over threads); bias: optional [N] f32.
void linear(Tensor& out, const Tensor& x, const Tensor& w, const Tensor* bias = nullptr);

struct AttentionParams {
  float scale = 0.0f;    // multiplies q.k; 0 = 1/sqrt(D)
  int window = 0;        // sliding window: query at p sees keys in (p - window, p]; 0 = unlimited
  float softcap = 0.0f;  // logits = softcap * tanh(logits / softcap); 0 = off
};
// Causal grouped-query attention of T new queries over a KV cache.
// q: [T, Hq, D] f32; k, v: [L, Hkv, D] f32 holding positions 0..L-1, with L >= pos0 + T;
// query t sits at position pos0 + t and sees keys j <= pos0 + t (within the window).
// Hq must be a multiple of Hkv; query head h reads KV head h / (Hq / Hkv). out: [T, Hq, D] f32.
void attention(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v, int64_t pos0,
               const AttentionParams& p);

enum class Activation { SiLU, GeluTanh };
// out, gate, up: [T, F] f32 (out may alias either); out = act(gate) * up.
void gated_act(Tensor& out, const Tensor& gate, const Tensor& up, Activation act);

// out, a, b: same shape, f32 (out may alias a or b). out = a + b.
void add(Tensor& out, const Tensor& a, const Tensor& b);
// x *= s, in place, f32.
void scale(Tensor& x, float s);
// Softmax over the last dimension; out, x: [..., N] f32 (may alias).
void softmax(Tensor& out, const Tensor& x);
// dst = src, same shape; either may be strided; converts between f32/f16/bf16.
void copy(Tensor& dst, const Tensor& src);

}  // namespace llmk::ops
