// launch_prefill<256>: the prefill kernel's tiling at head dim 256 (see prefill_kernel.cuh).
// PrefillCfg<kD, warps, m-tiles per warp, keys per tile, Q in registers, K/V stages, min blocks>.
#include "kernels/cuda/attention/launch.h"
#include "kernels/cuda/attention/prefill_kernel.cuh"

namespace llmk::cuda::attn {

namespace {
// bf16 and fp16: 8 warps x 16 rows, two K/V stages, 1 block per SM (255 registers, no spill).
using Cfg = PrefillCfg<256, 8, 1, 64, false, 2, 1>;
}  // namespace

template <>
void launch_prefill<256>(const AttentionArgs& a) {
  if (a.fp16) return launch_prefill_cfg<Cfg, __half>(a);
  launch_prefill_cfg<Cfg, __nv_bfloat16>(a);
}

}  // namespace llmk::cuda::attn
