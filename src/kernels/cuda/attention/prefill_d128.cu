// launch_prefill<128>: the prefill kernel's tiling at head dim 128 (see prefill_kernel.cuh).
// PrefillCfg<kD, warps, m-tiles per warp, keys per tile, Q in registers, K/V stages, min blocks>.
#include "kernels/cuda/attention/launch.h"
#include "kernels/cuda/attention/prefill_kernel.cuh"

namespace llmk::cuda::attn {

namespace {
// bf16: two K/V stages, one barrier per tile. In
// docs/runs/2026-11-21-h100-attention-prefill-run3.md it is column "v1": 0.83-0.89x SDPA at the
// issue's D128 shapes, where the one-stage FA2 order (then the default, column "llmk") gave
// 0.80-0.86x.
using Cfg = PrefillCfg<128, 4, 2, 64, false, 2, 2>;
// fp16: the one-stage tiling its device tests ran with.
using CfgF16 = PrefillCfg<128, 4, 2, 64, false, 1, 2>;
// Alternatives for tuning (bf16), picked by LLMK_PREFILL_VARIANT=1 or 2.
using CfgV1 = PrefillCfg<128, 4, 2, 64, false, 1, 2>;
using CfgV2 = PrefillCfg<128, 4, 2, 32, false, 2, 2>;
}  // namespace

template <>
void launch_prefill<128>(const AttentionArgs& a) {
  if (a.fp16) return launch_prefill_cfg<CfgF16, __half>(a);
  switch (prefill_variant()) {
    case 1:
      return launch_prefill_cfg<CfgV1, __nv_bfloat16>(a);
    case 2:
      return launch_prefill_cfg<CfgV2, __nv_bfloat16>(a);
    default:
      return launch_prefill_cfg<Cfg, __nv_bfloat16>(a);
  }
}

}  // namespace llmk::cuda::attn
