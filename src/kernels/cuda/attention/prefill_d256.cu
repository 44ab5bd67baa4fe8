// launch_prefill<256>: the prefill kernels' tilings at head dim 256.
#include "kernels/cuda/attention/launch.h"
#include "kernels/cuda/attention/prefill_wgmma.cuh"

namespace llmk::cuda::attn {

namespace {
// wgmma (WgmmaCfg<kD, warpgroups, keys per tile, min blocks>): 2 warpgroups x 64 rows, 64-key
// tiles, 1 block per SM (193 KB of shared memory). H100 (docs/perf.md): 1.3x the one-warpgroup
// tiling.
using Wg = WgmmaCfg<256, 2, 64, 1>;
// mma.sync: 8 warps x 16 rows, two K/V stages, 1 block per SM (255 registers, no spill).
using Mma = PrefillCfg<256, 8, 1, 64, false, 2, 1>;
}  // namespace

template <>
void launch_prefill<256>(const AttentionArgs& a, PrefillKernel k) {
  launch_prefill_either<Wg, Mma>(a, k);
}

}  // namespace llmk::cuda::attn
