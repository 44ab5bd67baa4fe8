// launch_prefill<64>: the prefill kernels' tilings at head dim 64.
#include "kernels/cuda/attention/launch.h"
#include "kernels/cuda/attention/prefill_wgmma.cuh"

namespace llmk::cuda::attn {

namespace {
// wgmma (WgmmaCfg<kD, warpgroups, keys per tile, min blocks>): 2 warpgroups x 64 rows, 64-key
// tiles, 2 blocks per SM. H100 (docs/perf.md): the fastest of the three tilings tried at
// B16 H32 S512.
using Wg = WgmmaCfg<64, 2, 64, 2>;
// mma.sync (PrefillCfg<kD, warps, m-tiles per warp, keys per tile, Q in registers, K/V stages,
// min blocks>): 4 warps x 32 rows, Q in registers, two K/V stages. H100
// (docs/runs/2026-11-21-h100-attention-prefill-tuned.md): 1.00-1.01x SDPA flash at B16 H32 S512,
// where an 8-warp x 16-row tiling (column fD) ran 0.86-0.94x.
using Mma = PrefillCfg<64, 4, 2, 64, true, 2, 2>;
}  // namespace

template <>
void launch_prefill<64>(const AttentionArgs& a, PrefillKernel k) {
  launch_prefill_either<Wg, Mma>(a, k);
}

}  // namespace llmk::cuda::attn
