// launch_prefill<112>: the prefill kernels' tilings at head dim 112. Tiles hold 112 of the 128
// columns of two 64-column panels (wgmma) or rows padded to 120 elements (mma.sync): head dim
// 96's tilings.
#include "kernels/cuda/attention/launch.h"
#include "kernels/cuda/attention/prefill_wgmma.cuh"

namespace llmk::cuda::attn {

namespace {
// wgmma (WgmmaCfg<kD, warpgroups, keys per tile, min blocks>): head dim 128's tiling, 2
// warpgroups x 64 rows, 128-key tiles, 1 block per SM.
using Wg = WgmmaCfg<112, 2, 128, 1>;
// mma.sync (PrefillCfg<kD, warps, m-tiles per warp, keys per tile, Q in registers, K/V stages,
// min blocks>): head dim 128's tiling, 8 warps x 16 rows, Q re-read from shared memory, one
// K/V stage.
using Mma = PrefillCfg<112, 8, 1, 64, false, 1, 2>;
}  // namespace

template <>
void launch_prefill<112>(const AttentionArgs& a, PrefillKernel k) {
  launch_prefill_either<Wg, Mma>(a, k);
}

}  // namespace llmk::cuda::attn
