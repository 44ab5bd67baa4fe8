// Causal grouped-query attention on the GPU: bf16 q, KV caches and output, fp32 accumulation.
//
// Two kernels share one argument struct:
//   prefill: flash-attention (tensor-core mma.sync, online softmax, O(T) memory) for T > 8;
//   decode:  T <= 8 queries, each KV group's query heads sharing one pass over the cache, the
//            keys split over a thread-block cluster and combined through distributed shared
//            memory (no global workspace).
// Both launch on cuda::current_stream(), never allocate and never wait on the host. Positions
// are read on the device and the grid depends only on T, the head counts and the cache capacity
// L, so one captured launch replays at every position; blocks skip the keys past the position.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace llmk::cuda {

struct AttentionArgs {
  // Strides in elements; the last dimension (D) is contiguous. Pointers and strides must allow
  // 16-byte loads: pointers 16-byte aligned, row and head strides multiples of 8.
  __nv_bfloat16* out = nullptr;  // [T, Hq, D]
  int64_t out_t = 0, out_h = 0;
  const __nv_bfloat16* q = nullptr;  // [T, Hq, D]
  int64_t q_t = 0, q_h = 0;
  const __nv_bfloat16* k = nullptr;  // [L, Hkv, D]
  int64_t k_t = 0, k_h = 0;
  const __nv_bfloat16* v = nullptr;  // [L, Hkv, D]
  int64_t v_t = 0, v_h = 0;
  const int32_t* positions = nullptr;  // [T] on the device, consecutive
  int T = 0, Hq = 0, Hkv = 0, D = 0;
  int64_t L = 0;         // cache capacity (rows of k and v)
  float scale = 0.0f;    // multiplies q.k (resolved: no 0 = default here)
  int window = 0;        // > 0: query at p sees keys (p - window, p]
  float softcap = 0.0f;  // > 0: logits = softcap * tanh(logits / softcap)
};

// Head dims the kernels are built for.
bool attention_head_dim_supported(int D);

// Any T >= 1; meant for T > 8. Throws llmk::Error for an unsupported head dim.
void attention_prefill(const AttentionArgs& a);

// T in [1, kDecodeMaxQueries]. Throws llmk::Error for an unsupported head dim, or when the
// query heads of one KV group do not fit in shared memory.
constexpr int kDecodeMaxQueries = 8;
void attention_decode(const AttentionArgs& a);

}  // namespace llmk::cuda
