// RoPE in place on [T, H, D] of bf16, fp16 or f32: one block per (token, group of heads).
//
// With a KV append fused in (decode and prefill of a decoder layer), the rotated key heads are
// also stored to their cache row, the key heads' unrotated tail dims copied there, and extra
// blocks (blockIdx.y past the RoPE groups) copy the value heads: one launch instead of two.
//
// The block first turns its token's position into cos/sin for every pair (in shared memory),
// then rotates the pairs of its heads. Frequencies come from the host in double, as cpu::rope
// computes them; the angle pos * inv_freq is formed and reduced to [-pi, pi] in double, so a
// float sincosf of it stays accurate at any position (a float angle at position 131072 would
// already be off by about 0.008 radians).
#include <algorithm>
#include <cmath>

#include "kernels/cuda/rope.cuh"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/vec.cuh"

namespace llmk::cuda {

namespace {

template <class T>
struct RopeKernelArgs {
  T* x;
  int64_t H, ld_t, ld_h;
  const int32_t* positions;
  int64_t pos_stride;
  int half;  // rotated pairs per head
  int heads_per_block;
  double freq_scale;
  const float* freq_factors;
  // The fused KV append (kc == nullptr: none). Heads k_head0.. of x are the keys.
  T* kc;
  T* vc;
  int64_t kc_ld_l, kc_ld_h, vc_ld_l, vc_ld_h;
  const T* v;
  int64_t v_ld_t, v_ld_h;
  const int32_t* rows;
  int64_t rows_stride, L, k_head0, Hkv;
  int D;
  int rope_groups;             // blockIdx.y below this: RoPE (and keys); at or above: values
  double base[kMaxRopePairs];  // theta^(-2i/rot_dim), before factors and scale
};

// The cache row of token t, or -1 when there is none (no append, or a row outside the cache:
// the caller's error, skipped as kv_append skips it).
template <class T>
__device__ __forceinline__ int64_t cache_row(const RopeKernelArgs<T>& a, int64_t t) {
  if (a.kc == nullptr) return -1;
  const int64_t r = a.rows[t * a.rows_stride];
  return r >= 0 && r < a.L ? r : -1;
}

// Elements per value chunk: 16 bytes where the rotation's accesses are vectors (then every
// row is 16-byte aligned and D a multiple of 8), else one.
template <int kPairs>
constexpr int kValueVec = kPairs == 1 ? 1 : 8;

// Values of token t into its cache row: kVec-element chunks spread over the value blocks.
template <int kVec, class T>
__device__ void copy_values(const RopeKernelArgs<T>& a, int64_t t, int64_t row) {
  const int64_t chunks = a.D / kVec;
  const int64_t first = (blockIdx.y - a.rope_groups) * static_cast<int64_t>(blockDim.x);
  const int64_t stride = (gridDim.y - a.rope_groups) * static_cast<int64_t>(blockDim.x);
  for (int64_t c = first + threadIdx.x; c < a.Hkv * chunks; c += stride) {
    const int64_t h = c / chunks, i = c % chunks * kVec;
    float f[kVec];
    load_vec<T, kVec>(a.v + t * a.v_ld_t + h * a.v_ld_h + i, f);
    store_vec<T, kVec>(a.vc + row * a.vc_ld_l + h * a.vc_ld_h + i, f);
  }
}

__device__ __forceinline__ void rotate(float& a, float& b, float c, float s) {
  const float x0 = a, x1 = b;
  a = x0 * c - x1 * s;
  b = x0 * s + x1 * c;
}

// kPairs consecutive pairs per thread: HalfSplit loads kPairs elements from each half,
// Adjacent loads 2 * kPairs interleaved elements.
template <class T, bool kHalfSplit, int kPairs>
__global__ void rope_kernel(const __grid_constant__ RopeKernelArgs<T> a) {
  grid_dependency_wait();
  __shared__ float2 cs[kMaxRopePairs];  // (cos, sin) per pair
  const int64_t t = blockIdx.x;
  const int64_t row = cache_row(a, t);
  if (static_cast<int>(blockIdx.y) >= a.rope_groups) {  // a value block
    if (row >= 0) copy_values<kValueVec<kPairs>>(a, t, row);
    return;
  }
  const double pos = a.positions[t * a.pos_stride];
  for (int i = threadIdx.x; i < a.half; i += blockDim.x) {
    cs[i] = rope_cos_sin(a.base[i], a.freq_factors, i, a.freq_scale, pos);
  }
  __syncthreads();
  const int64_t h0 = static_cast<int64_t>(blockIdx.y) * a.heads_per_block;
  const int64_t heads = min(static_cast<int64_t>(a.heads_per_block), a.H - h0);
  const int chunks = a.half / kPairs;  // per head
  for (int64_t item = threadIdx.x; item < heads * chunks; item += blockDim.x) {
    const int64_t h = h0 + item / chunks;
    const int i0 = static_cast<int>(item % chunks) * kPairs;
    T* v = a.x + t * a.ld_t + h * a.ld_h;
    // The key's cache row, where this head is a key and the token has a row.
    T* kc =
        row >= 0 && h >= a.k_head0 ? a.kc + row * a.kc_ld_l + (h - a.k_head0) * a.kc_ld_h : nullptr;
    if constexpr (kHalfSplit) {
      float lo[kPairs], hi[kPairs];
      load_vec<T, kPairs>(v + i0, lo);
      load_vec<T, kPairs>(v + i0 + a.half, hi);
#pragma unroll
      for (int k = 0; k < kPairs; ++k) rotate(lo[k], hi[k], cs[i0 + k].x, cs[i0 + k].y);
      store_vec<T, kPairs>(v + i0, lo);
      store_vec<T, kPairs>(v + i0 + a.half, hi);
      if (kc) {
        store_vec<T, kPairs>(kc + i0, lo);
        store_vec<T, kPairs>(kc + i0 + a.half, hi);
      }
    } else if constexpr (kPairs == 1) {  // any alignment: element by element
      float p0[1], p1[1];
      load_vec<T, 1>(v + 2 * i0, p0);
      load_vec<T, 1>(v + 2 * i0 + 1, p1);
      rotate(p0[0], p1[0], cs[i0].x, cs[i0].y);
      store_vec<T, 1>(v + 2 * i0, p0);
      store_vec<T, 1>(v + 2 * i0 + 1, p1);
      if (kc) {
        store_vec<T, 1>(kc + 2 * i0, p0);
        store_vec<T, 1>(kc + 2 * i0 + 1, p1);
      }
    } else {
      float p[2 * kPairs];
      load_vec<T, 2 * kPairs>(v + 2 * i0, p);
#pragma unroll
      for (int k = 0; k < kPairs; ++k) rotate(p[2 * k], p[2 * k + 1], cs[i0 + k].x, cs[i0 + k].y);
      store_vec<T, 2 * kPairs>(v + 2 * i0, p);
      if (kc) store_vec<T, 2 * kPairs>(kc + 2 * i0, p);
    }
  }
  // Keys' dims past rot_dim are not rotated: copied as they are.
  const int tail = a.D - 2 * a.half;
  const int64_t key0 = max(h0, a.k_head0), keys = h0 + heads - key0;
  if (row < 0 || tail == 0 || keys <= 0) return;
  for (int64_t item = threadIdx.x; item < keys * tail; item += blockDim.x) {
    const int64_t h = key0 + item / tail;
    const int i = 2 * a.half + static_cast<int>(item % tail);
    a.kc[row * a.kc_ld_l + (h - a.k_head0) * a.kc_ld_h + i] = a.x[t * a.ld_t + h * a.ld_h + i];
  }
}

template <class T, bool kHalfSplit, int kPairs>
void launch(RopeKernelArgs<T>& k, int64_t tokens) {
  const int64_t chunks = k.half / kPairs;
  k.rope_groups = static_cast<int>(ceil_div(k.H, k.heads_per_block));
  const int threads = block_threads_for(k.heads_per_block * chunks, 256);
  // Value blocks: about one element chunk per thread (the chunk as wide as a rotated group).
  const int64_t value_groups = k.kc ? ceil_div(k.Hkv * (k.D / kValueVec<kPairs>), threads) : 0;
  launch_dependent(
      rope_kernel<T, kHalfSplit, kPairs>,
      dim3(static_cast<unsigned>(tokens), static_cast<unsigned>(k.rope_groups + value_groups)),
      dim3(threads), 0, k);
}

template <class T>
void rope_typed(const RopeArgs& a) {
  const int half = a.rot_dim / 2;
  RopeKernelArgs<T> k{};
  k.x = static_cast<T*>(a.x);
  k.H = a.H;
  k.ld_t = a.ld_t;
  k.ld_h = a.ld_h;
  k.positions = a.positions;
  k.pos_stride = a.pos_stride;
  k.half = half;
  k.freq_scale = a.freq_scale;
  k.freq_factors = a.freq_factors;
  k.D = static_cast<int>(a.D);
  // 16-byte accesses where every row start is 16-byte aligned and the halves split evenly.
  bool rows_aligned = is_aligned(a.x, 16) && a.ld_t % 8 == 0 && a.ld_h % 8 == 0;
  if (const KvAppendArgs* ap = a.append) {
    k.kc = static_cast<T*>(ap->k_cache);
    k.vc = static_cast<T*>(ap->v_cache);
    k.kc_ld_l = ap->k_cache_ld_l;
    k.kc_ld_h = ap->k_cache_ld_h;
    k.vc_ld_l = ap->v_cache_ld_l;
    k.vc_ld_h = ap->v_cache_ld_h;
    k.v = static_cast<const T*>(ap->v);
    k.v_ld_t = ap->v_ld_t;
    k.v_ld_h = ap->v_ld_h;
    k.rows = ap->positions;
    k.rows_stride = ap->pos_stride;
    k.L = ap->L;
    k.Hkv = ap->H;
    k.k_head0 = a.H - ap->H;
    // The values are copied in chunks as wide as the rotation's: every head must split evenly.
    const int64_t lds[] = {ap->k_cache_ld_l,
                           ap->k_cache_ld_h,
                           ap->v_cache_ld_l,
                           ap->v_cache_ld_h,
                           ap->v_ld_t,
                           ap->v_ld_h,
                           a.D};
    rows_aligned = rows_aligned && is_aligned(ap->k_cache, 16) && is_aligned(ap->v_cache, 16) &&
                   is_aligned(ap->v, 16);
    for (int64_t ld : lds) rows_aligned = rows_aligned && ld % 8 == 0;
  }
  for (int i = 0; i < std::min(half, kMaxRopePairs); ++i) {
    k.base[i] = std::pow(a.theta, -2.0 * i / a.rot_dim);  // the expression cpu::rope uses
  }
  // About 64 pairs or more per thread block of up to 256 threads; a block covers whole heads.
  k.heads_per_block = static_cast<int>(std::min<int64_t>(a.H, std::max(1, 2048 / half)));
  if (a.half_split) {
    if (rows_aligned && half % 8 == 0) {
      launch<T, true, 8>(k, a.T);
    } else {
      launch<T, true, 1>(k, a.T);
    }
  } else {
    if (rows_aligned && half % 4 == 0) {
      launch<T, false, 4>(k, a.T);
    } else {
      launch<T, false, 1>(k, a.T);
    }
  }
}

}  // namespace

void rope(const RopeArgs& a) {
  if (a.rot_dim / 2 == 0 || a.T == 0 || a.H == 0) return;
  with_float_type(a.dtype, [&](auto t) { rope_typed<decltype(t)>(a); });
  check_launch("rope");
}

}  // namespace llmk::cuda
