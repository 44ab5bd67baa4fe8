// launch_prefill<64>: the prefill kernel's tiling at head dim 64 (see prefill_kernel.cuh).
#include "kernels/cuda/attention/launch.h"
#include "kernels/cuda/attention/prefill_kernel.cuh"

namespace llmk::cuda::attn {

namespace {
using Cfg = PrefillCfg<64, 4, 2, 64, true, 2, 2>;
using CfgAlt = PrefillCfg<64, 8, 1, 64, true, 2, 1>;  // LLMK_PREFILL_VARIANT=1 (bf16), for tuning
}  // namespace

template <>
void launch_prefill<64>(const AttentionArgs& a) {
  if (a.fp16) return launch_prefill_cfg<Cfg, __half>(a);
  if (prefill_variant() == 1) return launch_prefill_cfg<CfgAlt, __nv_bfloat16>(a);
  launch_prefill_cfg<Cfg, __nv_bfloat16>(a);
}

}  // namespace llmk::cuda::attn
