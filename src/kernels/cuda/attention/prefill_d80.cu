// launch_prefill<80>: the prefill kernels' tilings at head dim 80 (as Phi-2 and StableLM give).
// Tiles hold 80 of the 128 columns of two 64-column panels (wgmma) or rows padded to 88 elements
// (mma.sync): head dim 96's tilings.
#include "kernels/cuda/attention/launch.h"
#include "kernels/cuda/attention/prefill_wgmma.cuh"

namespace llmk::cuda::attn {

namespace {
// wgmma (WgmmaCfg<kD, warpgroups, keys per tile, min blocks>): head dim 128's tiling, 2
// warpgroups x 64 rows, 128-key tiles, 1 block per SM.
using Wg = WgmmaCfg<80, 2, 128, 1>;
// mma.sync (PrefillCfg<kD, warps, m-tiles per warp, keys per tile, Q in registers, K/V stages,
// min blocks>): head dim 128's tiling, 8 warps x 16 rows, Q re-read from shared memory, one
// K/V stage.
using Mma = PrefillCfg<80, 8, 1, 64, false, 1, 2>;
}  // namespace

template <>
void launch_prefill<80>(const AttentionArgs& a, PrefillKernel k) {
  launch_prefill_either<Wg, Mma>(a, k);
}

}  // namespace llmk::cuda::attn
