// The per-head-dim launchers behind attention.h, instantiated in prefill_d*.cu and decode.cu for
// kD in {64, 80, 96, 112, 128, 256} (attention.cpp's HeadDims); attention.cpp checks the arguments
// and picks the instantiation. Internal to this folder.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>

#include <cstddef>

#include "kernels/cuda/attention/attention.h"

namespace llmk::cuda::attn {

// Prefill: specialised (one tiling per head dim and kernel) in prefill_d<kD>.cu; k picks the
// kernel (kAuto and kWgmma: Hopper kernels; the caller checked the device).
template <int kD>
void launch_prefill(const AttentionArgs& a, PrefillKernel k);
template <>
void launch_prefill<64>(const AttentionArgs& a, PrefillKernel k);
template <>
void launch_prefill<80>(const AttentionArgs& a, PrefillKernel k);
template <>
void launch_prefill<96>(const AttentionArgs& a, PrefillKernel k);
template <>
void launch_prefill<112>(const AttentionArgs& a, PrefillKernel k);
template <>
void launch_prefill<128>(const AttentionArgs& a, PrefillKernel k);
template <>
void launch_prefill<256>(const AttentionArgs& a, PrefillKernel k);

// Decode: how one launch is laid out, chosen on the host (attention.cpp) from host-known
// values only, so a captured launch replays at any position.
struct DecodePlan {
  int groups = 0;  // row groups per KV head: ceil(max_q_per_seq * G / decode_max_rows)
  int split = 1;   // blocks sharing the keys of one (sequence, KV head, row group)
  // Split > 1: partial results [split][T * Hq][D] (unnormalised), their (max, sum) pairs
  // [split][T * Hq][2] (log2 domain), and one arrival counter per (sequence, KV head, row
  // group), zero between launches (the last block to arrive combines and resets it).
  float* part_o = nullptr;
  float* part_ml = nullptr;
  int* counters = nullptr;
  // K/V tiles by the bulk tensor copy engine (decode_plan in attention.cpp sets it where
  // decode_tma_possible allows and the loader asks for it): one copy per tma_box_rows keys
  // (the page size, or 64) and 64-dim panel; tma_head_outer: a cache laid out [Hkv][rows][D].
  bool tma = false;
  bool tma_head_outer = false;
  int tma_box_rows = 0;
  // > 0: the launch asks for enough shared memory that at most this many blocks share an SM
  // (decode_plan sets it for the 8-bit builds when the grid is smaller than the SMs hold).
  int per_sm_cap = 0;
};
constexpr int kDecodeMaxSplit = 64;
// Largest `rows` the kernels are built for at head dim kD.
template <int kD>
int decode_max_rows();
// Dynamic shared memory of one decode block, and how many such blocks fit on one SM, for the
// TMA or the cp.async loader, or (fmt 1 E4M3, 2 int8: AttentionArgs::kv_format) the 8-bit build.
template <int kD>
size_t decode_smem_bytes(bool tma, int fmt = 0);
template <int kD>
int decode_blocks_per_sm(bool tma, int fmt = 0);
// Head dims with an 8-bit build of the decode kernel.
constexpr bool decode_8bit_supported(int d) { return d == 64 || d == 128; }
// ... and with a TMA loader (DecodePlan::tma) besides cp.async.
constexpr bool decode_8bit_tma_supported(int d) { return d == 128; }
// False (nothing launched) when plan.tma and the driver refused the tensor maps (or has no
// encoder); the caller reports it.
template <int kD>
bool launch_decode(const AttentionArgs& a, const DecodePlan& plan);

// cuTensorMapEncodeTiled from the driver, found through the runtime (no link against libcuda);
// nullptr where the driver has none.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder();

// A [rows][heads][D] 16-bit tensor (row and head strides in elements) as a 3-d tensor map with
// boxes of 64 columns x 1 head x box_rows rows and the 128-byte swizzle (the panels the wgmma
// descriptors read); false if the driver has no encoder or refused the map.
bool encode_head_rows(CUtensorMap* map, const void* base, int64_t rows, int64_t heads, int D,
                      int64_t t_stride, int64_t h_stride, int box_rows, bool fp16);

}  // namespace llmk::cuda::attn
