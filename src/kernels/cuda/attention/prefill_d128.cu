// launch_prefill<128>: the prefill kernels' tilings at head dim 128.
#include "kernels/cuda/attention/launch.h"
#include "kernels/cuda/attention/prefill_wgmma.cuh"

namespace llmk::cuda::attn {

namespace {
// wgmma (WgmmaCfg<kD, warpgroups, keys per tile, min blocks>): 2 warpgroups x 64 rows, 128-key
// tiles, 1 block per SM (161 KB of shared memory, no spill). H100 (docs/perf.md): the 64-key
// tiling at 2 blocks per SM spills at 128 registers and is slower at long sequences.
using Wg = WgmmaCfg<128, 2, 128, 1>;
// mma.sync: 8 warps x 16 rows (128 registers, 2 blocks = 16 warps per SM, no spill), Q re-read
// from shared memory, one K/V stage (FA2 order). H100
// (docs/runs/2026-11-21-h100-attention-prefill-tuned.md, column fB): 0.81-1.05x SDPA flash.
using Mma = PrefillCfg<128, 8, 1, 64, false, 1, 2>;
}  // namespace

template <>
void launch_prefill<128>(const AttentionArgs& a, PrefillKernel k) {
  launch_prefill_either<Wg, Mma>(a, k);
}

}  // namespace llmk::cuda::attn
