// llmk's own GEMM for Hopper (sm_90a), for the products whose epilogue cuBLASLt cannot do:
// y = act(x @ w^T + bias), with the pre-activation z = x @ w^T + bias also written where asked
// (a backward reads it). bf16 operands and outputs, fp32 accumulation; the activation is applied
// to the fp32 sum before it is rounded.
//
// One persistent kernel: a block of three warpgroups per SM, one feeding 128 x 64 tiles of x
// and kBN x 64 tiles of w by TMA into a ring of shared-memory stages, two consuming them with
// wgmma (64 rows each, fp32 accumulators in registers) and storing their 128 x kBN output tile
// with the bias and activation applied. Tiles are handed out in bands of rows so the blocks in
// flight share their operands in L2. kBN = 256 where there are enough tiles for every SM, 128
// for short x (a decode batch: the product then streams w and is bound by memory).
//
// The same kernel is qlinear's qgemm (qlinear.h) for a block-quantised w: two producer
// warpgroups copy the quantised bytes of each 4 K steps of the tile's rows and decode them into
// the stages (the consumers and the epilogue are this kernel's, with out += added where the
// call accumulates).
#pragma once

#include <cstdint>

#include "kernels/cpu/grad.h"

namespace llmk::cuda {

struct GemmActArgs {
  void* y = nullptr;           // [M, N] bf16, contiguous
  void* z = nullptr;           // [M, N] bf16, contiguous: the pre-activation; or null
  const void* x = nullptr;     // [M, K] bf16, contiguous
  const void* w = nullptr;     // [N, K] bf16, contiguous
  const void* bias = nullptr;  // [N] bf16; or null
  int64_t M = 0, N = 0, K = 0;
  cpu::grad::Act act = cpu::grad::Act::None;
};

// Enqueues the product on cuda::current_stream() and returns true; or returns false, with
// nothing enqueued, where the kernel does not take the operands: a device other than sm_90,
// K or N not a multiple of 8, a pointer not 16-byte aligned, M, N or K zero, or sizes past
// int32. The caller then runs cuBLASLt and the activation apart.
bool gemm_act(const GemmActArgs& a);

// Whether gemm_act is the faster choice for these operands where cuBLASLt can apply the
// activation in its epilogue too (tanh GELU): false for tanh GELU past 128 rows. Callers with
// that path route by it; gemm_act itself still takes such operands (tests and gemm_act_bench
// run it there).
bool gemm_act_preferred(const GemmActArgs& a);

// Off: gemm_act returns false always (for tests and benchmarks that compare the paths).
// Process-wide.
void set_gemm_act(bool on);

}  // namespace llmk::cuda
