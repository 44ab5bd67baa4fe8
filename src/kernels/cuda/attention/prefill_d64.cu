// launch_prefill<64>: the prefill kernel's tiling at head dim 64 (see prefill_kernel.cuh).
// PrefillCfg<kD, warps, m-tiles per warp, keys per tile, Q in registers, K/V stages, min blocks>.
#include "kernels/cuda/attention/launch.h"
#include "kernels/cuda/attention/prefill_kernel.cuh"

namespace llmk::cuda::attn {

namespace {
using Cfg = PrefillCfg<64, 4, 2, 64, true, 2, 2>;
// Alternatives for tuning (bf16), picked by LLMK_PREFILL_VARIANT=1 or 2.
using CfgV1 = PrefillCfg<64, 4, 2, 64, true, 1, 2>;
using CfgV2 = PrefillCfg<64, 4, 2, 64, false, 2, 2>;
}  // namespace

template <>
void launch_prefill<64>(const AttentionArgs& a) {
  if (a.fp16) return launch_prefill_cfg<Cfg, __half>(a);
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
