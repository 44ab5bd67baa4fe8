// The per-head-dim launchers behind attention.h, instantiated in prefill_d*.cu and decode.cu for
// kD in {64, 128, 256}; attention.cpp checks the arguments and picks the instantiation. Internal
// to this folder.
#pragma once

#include <cstddef>

#include "kernels/cuda/attention/attention.h"

namespace llmk::cuda::attn {

// Prefill: specialised (one tiling per head dim) in prefill_d64.cu, prefill_d128.cu and
// prefill_d256.cu.
template <int kD>
void launch_prefill(const AttentionArgs& a);
template <>
void launch_prefill<64>(const AttentionArgs& a);
template <>
void launch_prefill<128>(const AttentionArgs& a);
template <>
void launch_prefill<256>(const AttentionArgs& a);

// Dynamic shared memory of one decode block serving `group` query heads.
template <int kD>
size_t decode_smem_bytes(int group);
// `split` blocks (a cluster, 1..kDecodeMaxSplit) share the keys of one (query, KV head).
constexpr int kDecodeMaxSplit = 8;  // the portable cluster size
template <int kD>
void launch_decode(const AttentionArgs& a, int split);

}  // namespace llmk::cuda::attn
