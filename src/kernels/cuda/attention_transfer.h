// MiniLM-style attention transfer on the GPU (llmk.ops.attention_transfer_loss): the CUDA side of
// kernels/cpu/attention_transfer.h, which is the reference and defines the values. T is the
// inputs' storage type (__nv_bfloat16 or __half); scores and sums in fp32 on tensor cores
// (mma.sync m16n8k16, any sm_80+ GPU). No S x S matrix is formed and nothing allocates: the
// forward keeps online statistics per row, the backward recomputes both sides' scores. Launches
// go on cuda::current_stream(); nothing waits on the host.
#pragma once

#include <cstdint>

#include "kernels/cpu/attention_transfer.h"

namespace llmk::cuda::grad {

using cpu::grad::AttentionTransferParams;

// What the kernels take (the callers check; llmk.ops falls back to torch elsewhere): relation
// head dims multiples of 8 (padded with zeros to 16 in shared memory) and at most 256 (the
// teacher's tiles fill shared memory, a thread's part of the student's gradient rows fills its
// registers), every input 16-byte aligned and the gradients 4-byte aligned.
inline constexpr int64_t kAttentionTransferDimMultiple = 8;
inline constexpr int64_t kAttentionTransferMaxDt = 256;
inline constexpr int64_t kAttentionTransferMaxDs = 256;

// tq, tk: [B, S, R dt]; sq, sk: [B, S, R ds] (contiguous). kl, lse_t, lse_s: [B, R, S] fp32.
template <class T>
void attention_transfer_fwd(float* kl, float* lse_t, float* lse_s, const T* tq, const T* tk,
                            const T* sq, const T* sk, const AttentionTransferParams& p);

// dq, dk: [B, S, R ds] (each optional: null skips its launch), for d loss / d kl_i =
// *dout / (B R S) on every row (the mean's gradient; dout one fp32 on the device), from the
// forward's lse_t and lse_s. Deterministic: every gradient row is summed by one warp, in order.
template <class T>
void attention_transfer_bwd(T* dq, T* dk, const T* tq, const T* tk, const T* sq, const T* sk,
                            const float* lse_t, const float* lse_s, const float* dout,
                            const AttentionTransferParams& p);

}  // namespace llmk::cuda::grad
