// Causal grouped-query attention of T new queries over a KV cache, fp32 throughout.
#pragma once

#include <cstdint>

namespace llmk::cpu {

struct AttentionArgs {
  // Tensors are [rows, heads, D] with the given row and head strides (elements); D contiguous.
  float* out = nullptr;  // [T, Hq, D]
  int64_t out_t = 0, out_h = 0;
  const float* q = nullptr;  // [T, Hq, D]
  int64_t q_t = 0, q_h = 0;
  const float* k = nullptr;  // [L, Hkv, D], positions 0..L-1
  int64_t k_t = 0, k_h = 0;
  const float* v = nullptr;  // [L, Hkv, D]
  int64_t v_t = 0, v_h = 0;
  int64_t T = 0, Hq = 0, Hkv = 0, D = 0;
  int64_t pos0 = 0;      // query t is at position pos0 + t; needs L >= pos0 + T
  float scale = 0.0f;    // multiplies q.k (already resolved: no 0 = default here)
  int64_t window = 0;    // > 0: query at p sees keys (p - window, p]
  float softcap = 0.0f;  // > 0: logits = softcap * tanh(logits / softcap)
};

// Query head h reads KV head h / (Hq / Hkv). Softmax in fp32 with the row maximum subtracted.
// Work is spread over (query, head) pairs.
void attention(const AttentionArgs& a);

}  // namespace llmk::cpu
