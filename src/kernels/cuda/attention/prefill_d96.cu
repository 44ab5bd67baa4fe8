// launch_prefill<96>: the prefill kernels' tilings at head dim 96 (Phi-3). Tiles hold 96 of
// the 128 columns of two 64-column panels (wgmma) or rows padded to 104 elements (mma.sync).
#include "core/cuda/device.h"
#include "kernels/cuda/attention/launch.h"
#include "kernels/cuda/attention/prefill_wgmma.cuh"

namespace llmk::cuda::attn {

namespace {
// wgmma (WgmmaCfg<kD, warpgroups, keys per tile, min blocks>): 64-key tiles, 2 blocks per SM;
// 2 warpgroups x 64 rows, or 1 where 128-row tiles would leave SMs without a block (a short
// prompt: Phi-3-mini's 32 heads at 512 tokens are 128 such tiles). Measured on an H100 at
// 32 heads, causal (attention_prefill_bench, docs/perf.md): at 4k and 8k tokens 2 x 64 rows
// ran 6% and 4% faster than head dim 128's 2 x 64 rows over 128-key tiles at 1 block per SM, and
// 1 x 64 rows 8% and 13% slower; at 512 tokens 1 x 64 rows 7% faster.
using WgLong = WgmmaCfg<96, 2, 64, 2>;
using WgShort = WgmmaCfg<96, 1, 64, 2>;
// mma.sync (PrefillCfg<kD, warps, m-tiles per warp, keys per tile, Q in registers, K/V stages,
// min blocks>): head dim 128's tiling, 8 warps x 16 rows, Q re-read from shared memory, one
// K/V stage.
using Mma = PrefillCfg<96, 8, 1, 64, false, 1, 2>;
}  // namespace

template <>
void launch_prefill<96>(const AttentionArgs& a, PrefillKernel k) {
  // Work items of the 2-warpgroup tiling (prefill_kernel.cuh's launch_prefill_grid), against
  // the SMs' block slots.
  const int64_t long_items =
      (ceil_div(a.T, WgLong::kBM) + (a.cu_q != nullptr ? a.B - 1 : 0)) * a.Hq;
  if (k != PrefillKernel::kMmaSync &&
      long_items < int64_t{WgLong::kMinBlocks} * device_info().sm_count) {
    launch_prefill_either<WgShort, Mma>(a, k);
  } else {
    launch_prefill_either<WgLong, Mma>(a, k);
  }
}

}  // namespace llmk::cuda::attn
