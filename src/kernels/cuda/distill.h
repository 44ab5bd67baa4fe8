// Distillation losses from logits on the GPU (llmk.ops.distill_loss): the CUDA side of
// kernels/cpu/distill.h, which is the reference and defines the losses. T is the logits' storage
// type (__nv_bfloat16, __half or float); sums in fp32. Launches go on cuda::current_stream();
// nothing waits on the host and nothing allocates.
#pragma once

#include <cstdint>

#include "kernels/cpu/distill.h"

namespace llmk::cuda::grad {

using cpu::grad::DistillParams;
using cpu::grad::Divergence;

// Per row of student and teacher [rows, V] (contiguous): loss[r] (fp32) and, when grad is not
// null, grad [rows, V] (T) = d loss[r] / d student[r] times *grad_scale (an fp32 on the device;
// null: 1). labels [rows] int64 on the device or null (alpha must be 0 then). grad may be
// student itself (the gradient replaces the logits: each is read before its place is written). A
// label outside [0, V) other than ignore_index gives that row a NaN loss and gradient. Each row is
// read from memory once where its share of each block's shared memory fits (a cluster of up to 8
// blocks splits a row), else twice (three times for JSD). KL and reverse KL of 16-bit logits on
// sm_90 without a separate hard-label softmax (alpha 0 or T 1) hold each row in registers instead
// (a cluster of up to 16 blocks, rows of up to 262,144 logits). Returns the kernel that ran:
// "cuda-registers" or "cuda".
template <class T>
const char* distill_rows(float* loss, T* grad, const T* student, const T* teacher, const int64_t* labels,
                  int64_t rows, int64_t V, const DistillParams& p, const float* grad_scale);

// x [rows, cols] (contiguous) *= s[r] (fp32 on the device; s_stride 0: one value for all rows).
// Rows whose factor is exactly 1 are not touched (no memory traffic): the backward of a loss
// whose gradient was formed in the forward, where the incoming gradient is usually 1.
template <class T>
void scale_rows(T* x, const float* s, int64_t s_stride, int64_t rows, int64_t cols);

}  // namespace llmk::cuda::grad
