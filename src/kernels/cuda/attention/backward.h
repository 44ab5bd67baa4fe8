// The backward of flash attention on the GPU (llmk.ops.flash_attn): dQ, dK, dV from dO, the
// forward's output and log-sum-exp, bf16 or fp16 with fp32 accumulation.
//
// Three launches on cuda::current_stream(): a row pass (delta = rowsum(dO * O) - dlse, the
// log-sum-exp in the log2 domain, dQ's fp32 accumulator zeroed), the main kernel (FA2's order:
// one block per (key tile, KV head, sequence) keeps its K and V tiles and its dK and dV
// accumulators while it walks the query tiles that see it, for every query head of the KV group
// in turn, so dK and dV need no atomics and are summed over the group in a fixed order; dQ is
// added to the fp32 accumulator: by vector reductions in L2 from the Hopper head-dim-128 kernel
// (two warpgroups on 128 keys), by one bulk reduction per step from the other Hopper kernel, by
// atomics in the mma.sync build), and a pass that rounds dQ to 16 bits. dQ's sums thus run in no
// fixed order (its last bits may differ from run to run) unless `deterministic` is set.
#pragma once

#include <cstddef>
#include <cstdint>

namespace llmk::cuda {

struct AttentionBwdArgs {
  // 16-bit tensors (bf16, or fp16 with fp16 set): [rows, heads, D] with row and head strides in
  // elements, D contiguous; pointers 16-byte aligned, strides multiples of 8.
  const void* q = nullptr;  // [T, Hq, D]
  int64_t q_t = 0, q_h = 0;
  const void* k = nullptr;  // [Tk, Hkv, D]
  int64_t k_t = 0, k_h = 0;
  const void* v = nullptr;  // [Tk, Hkv, D]
  int64_t v_t = 0, v_h = 0;
  const void* out = nullptr;  // [T, Hq, D], the forward's output
  int64_t out_t = 0, out_h = 0;
  const void* dout = nullptr;  // [T, Hq, D]
  int64_t dout_t = 0, dout_h = 0;
  void* dq = nullptr;  // [T, Hq, D], written
  int64_t dq_t = 0, dq_h = 0;
  void* dk = nullptr;  // [Tk, Hkv, D], written (summed over each KV group's query heads)
  int64_t dk_t = 0, dk_h = 0;
  void* dv = nullptr;  // [Tk, Hkv, D], written
  int64_t dv_t = 0, dv_h = 0;
  bool fp16 = false;

  // The forward's log-sum-exp of each query row's scores, natural log, [Hq, T] fp32 (-inf for a
  // row that sees no key); optional dlse, its gradient, [Hq, T] fp32.
  const float* lse = nullptr;
  const float* dlse = nullptr;
  // attention_backward_workspace(T, Hq, D, B) bytes of device memory, 16-byte aligned.
  void* workspace = nullptr;

  int T = 0, Tk = 0, Hq = 0, Hkv = 0, D = 0;
  // B sequences: queries cu_q[b] .. cu_q[b+1]-1 and keys cu_k[b] .. cu_k[b+1]-1 (device arrays
  // of B + 1). max_tk: the most keys of any sequence (host-known; sizes the grid).
  int B = 1;
  const int32_t* cu_q = nullptr;
  const int32_t* cu_k = nullptr;
  int max_tk = 0;

  // Scores: s = scale q.k, or softcap * tanh(scale q.k / softcap). Query i of a sequence with
  // tq queries and tk keys sees key j iff i + tk - tq - left <= j <= i + tk - tq + right (-1:
  // unbounded); causal sets right = 0.
  float scale = 0.0f;
  float softcap = 0.0f;
  bool causal = false;
  int window_left = -1, window_right = -1;

  // dQ's parts added in a fixed order (key tile by key tile, each block waiting its turn on a
  // counter): the same bits on every run, at some cost in speed.
  bool deterministic = false;
};

// Head dims the tensor-core backward is built for: multiples of 16 from 64 to 128.
bool attention_backward_supported(int D);
// Bytes of workspace for T query rows of Hq heads in B sequences.
size_t attention_backward_workspace(int64_t T, int64_t Hq, int64_t D, int64_t B);
// Throws llmk::Error for an unsupported head dim.
void attention_backward(const AttentionBwdArgs& a);

}  // namespace llmk::cuda
