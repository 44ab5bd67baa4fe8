// launch_prefill<128>: the prefill kernel's tiling at head dim 128 (see prefill_kernel.cuh).
// PrefillCfg<kD, warps, m-tiles per warp, keys per tile, Q in registers, K/V stages, min blocks>.
#include "kernels/cuda/attention/launch.h"
#include "kernels/cuda/attention/prefill_kernel.cuh"

namespace llmk::cuda::attn {

namespace {
// bf16 and fp16: 8 warps x 16 rows (each thread holds half the O accumulators of a 4 x 32
// tiling: 128 registers, 2 blocks = 16 warps per SM, no spill), Q re-read from shared memory,
// one K/V stage (FA2 order). H100 (docs/runs/2026-11-21-h100-attention-prefill-tuned.md, column
// fB): 0.81-1.05x SDPA flash; the 4 x 32 two-stage tiling it replaces spilled at 255 registers.
using Cfg = PrefillCfg<128, 8, 1, 64, false, 1, 2>;
}  // namespace

template <>
void launch_prefill<128>(const AttentionArgs& a) {
  if (a.fp16) return launch_prefill_cfg<Cfg, __half>(a);
  launch_prefill_cfg<Cfg, __nv_bfloat16>(a);
}

}  // namespace llmk::cuda::attn
