// launch_prefill<64>: the prefill kernel's tiling at head dim 64 (see prefill_kernel.cuh).
// PrefillCfg<kD, warps, m-tiles per warp, keys per tile, Q in registers, K/V stages, min blocks>.
#include "kernels/cuda/attention/launch.h"
#include "kernels/cuda/attention/prefill_kernel.cuh"

namespace llmk::cuda::attn {

namespace {
// bf16 and fp16: 4 warps x 32 rows, Q in registers, two K/V stages. H100
// (docs/runs/2026-11-21-h100-attention-prefill-tuned.md): 1.00-1.01x SDPA flash at B16 H32 S512,
// where an 8-warp x 16-row tiling (column fD) ran 0.86-0.94x.
using Cfg = PrefillCfg<64, 4, 2, 64, true, 2, 2>;
}  // namespace

template <>
void launch_prefill<64>(const AttentionArgs& a) {
  if (a.fp16) return launch_prefill_cfg<Cfg, __half>(a);
  launch_prefill_cfg<Cfg, __nv_bfloat16>(a);
}

}  // namespace llmk::cuda::attn
