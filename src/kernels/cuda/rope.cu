// RoPE in place on bf16 [T, H, D]: one block per (token, group of heads).
//
// The block first turns its token's position into cos/sin for every pair (in shared memory),
// then rotates the pairs of its heads. Frequencies come from the host in double, as cpu::rope
// computes them; the angle pos * inv_freq is formed and reduced to [-pi, pi] in double, so a
// float sincosf of it stays accurate at any position (a float angle at position 131072 would
// already be off by about 0.008 radians).
#include <algorithm>
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/rope.h"

namespace llmk::cuda {

namespace {

using bf16 = __nv_bfloat16;

struct RopeKernelArgs {
  bf16* x;
  int64_t H, ld_t, ld_h;
  const int32_t* positions;
  int64_t pos_stride;
  int half;  // rotated pairs per head
  int heads_per_block;
  double freq_scale;
  const float* freq_factors;
  double base[kMaxRopePairs];  // theta^(-2i/rot_dim), before factors and scale
};

__device__ __forceinline__ void rotate(float& a, float& b, float c, float s) {
  const float x0 = a, x1 = b;
  a = x0 * c - x1 * s;
  b = x0 * s + x1 * c;
}

// kPairs consecutive pairs per thread: HalfSplit loads kPairs elements from each half,
// Adjacent loads 2 * kPairs interleaved elements.
template <bool kHalfSplit, int kPairs>
__global__ void rope_kernel(const __grid_constant__ RopeKernelArgs a) {
  grid_dependency_wait();
  __shared__ float2 cs[kMaxRopePairs];  // (cos, sin) per pair
  const int64_t t = blockIdx.x;
  const double pos = a.positions[t * a.pos_stride];
  for (int i = threadIdx.x; i < a.half; i += blockDim.x) {
    double f = a.base[i];
    if (a.freq_factors) f /= static_cast<double>(a.freq_factors[i]);
    const double angle = pos * (f * a.freq_scale);
    constexpr double kTwoPi = 6.283185307179586476925286766559;
    const double reduced = angle - rint(angle * (1.0 / kTwoPi)) * kTwoPi;
    float s, c;
    sincosf(static_cast<float>(reduced), &s, &c);
    cs[i] = make_float2(c, s);
  }
  __syncthreads();
  const int64_t h0 = static_cast<int64_t>(blockIdx.y) * a.heads_per_block;
  const int64_t heads = min(static_cast<int64_t>(a.heads_per_block), a.H - h0);
  const int chunks = a.half / kPairs;  // per head
  for (int64_t item = threadIdx.x; item < heads * chunks; item += blockDim.x) {
    const int64_t h = h0 + item / chunks;
    const int i0 = static_cast<int>(item % chunks) * kPairs;
    bf16* v = a.x + t * a.ld_t + h * a.ld_h;
    if constexpr (kHalfSplit) {
      float lo[kPairs], hi[kPairs];
      load_bf16<kPairs>(v + i0, lo);
      load_bf16<kPairs>(v + i0 + a.half, hi);
#pragma unroll
      for (int k = 0; k < kPairs; ++k) rotate(lo[k], hi[k], cs[i0 + k].x, cs[i0 + k].y);
      store_bf16<kPairs>(v + i0, lo);
      store_bf16<kPairs>(v + i0 + a.half, hi);
    } else if constexpr (kPairs == 1) {  // any alignment: element by element
      float p0[1], p1[1];
      load_bf16<1>(v + 2 * i0, p0);
      load_bf16<1>(v + 2 * i0 + 1, p1);
      rotate(p0[0], p1[0], cs[i0].x, cs[i0].y);
      store_bf16<1>(v + 2 * i0, p0);
      store_bf16<1>(v + 2 * i0 + 1, p1);
    } else {
      float p[2 * kPairs];
      load_bf16<2 * kPairs>(v + 2 * i0, p);
#pragma unroll
      for (int k = 0; k < kPairs; ++k) rotate(p[2 * k], p[2 * k + 1], cs[i0 + k].x, cs[i0 + k].y);
      store_bf16<2 * kPairs>(v + 2 * i0, p);
    }
  }
}

template <bool kHalfSplit, int kPairs>
void launch(const RopeKernelArgs& k, int64_t T) {
  const int64_t chunks = k.half / kPairs;
  const auto groups = static_cast<unsigned>(ceil_div(k.H, k.heads_per_block));
  const int threads = block_threads_for(k.heads_per_block * chunks, 256);
  launch_dependent(rope_kernel<kHalfSplit, kPairs>, dim3(static_cast<unsigned>(T), groups),
                   dim3(threads), 0, k);
}

}  // namespace

void rope(const RopeArgs& a) {
  const int half = a.rot_dim / 2;
  if (half == 0 || a.T == 0 || a.H == 0) return;
  RopeKernelArgs k{};
  k.x = static_cast<bf16*>(a.x);
  k.H = a.H;
  k.ld_t = a.ld_t;
  k.ld_h = a.ld_h;
  k.positions = a.positions;
  k.pos_stride = a.pos_stride;
  k.half = half;
  k.freq_scale = a.freq_scale;
  k.freq_factors = a.freq_factors;
  for (int i = 0; i < std::min(half, kMaxRopePairs); ++i) {
    k.base[i] = std::pow(a.theta, -2.0 * i / a.rot_dim);  // the expression cpu::rope uses
  }
  // About 64 pairs or more per thread block of up to 256 threads; a block covers whole heads.
  k.heads_per_block = static_cast<int>(std::min<int64_t>(a.H, std::max(1, 2048 / half)));
  // 16-byte accesses where every row start is 16-byte aligned and the halves split evenly.
  const bool rows_aligned = is_aligned(a.x, 16) && a.ld_t % 8 == 0 && a.ld_h % 8 == 0;
  if (a.half_split) {
    if (rows_aligned && half % 8 == 0) {
      launch<true, 8>(k, a.T);
    } else {
      launch<true, 1>(k, a.T);
    }
  } else {
    if (rows_aligned && half % 4 == 0) {
      launch<false, 4>(k, a.T);
    } else {
      launch<false, 1>(k, a.T);
    }
  }
  check_launch("rope");
}

}  // namespace llmk::cuda
