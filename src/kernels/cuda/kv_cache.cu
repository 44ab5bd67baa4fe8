// KV append: block (t, k-or-v) copies row t of k or v into cache row positions[t], converted to
// the cache's element type, with 16-byte accesses where every row start is aligned.
#include "kernels/cuda/kv_cache.h"
#include "kernels/cuda/vec.cuh"
#include "kernels/kv_quant.h"

namespace llmk::cuda {

namespace {

template <class TS, class TC, int kVec>
__global__ void kv_append_kernel(const KvAppendArgs a) {
  grid_dependency_wait();
  const int64_t t = blockIdx.x;
  const bool is_v = blockIdx.y == 1;
  const int64_t pos = a.positions[t * a.pos_stride];
  if (pos < 0 || pos >= a.L) return;  // the caller's error; writing would corrupt memory
  TC* dst = static_cast<TC*>(is_v ? a.v_cache : a.k_cache) +
            pos * (is_v ? a.v_cache_ld_l : a.k_cache_ld_l);
  const int64_t dst_ld_h = is_v ? a.v_cache_ld_h : a.k_cache_ld_h;
  const TS* src = static_cast<const TS*>(is_v ? a.v : a.k) + t * (is_v ? a.v_ld_t : a.k_ld_t);
  const int64_t src_ld_h = is_v ? a.v_ld_h : a.k_ld_h;
  const int64_t chunks = a.D / kVec;  // per head
  for (int64_t c = threadIdx.x; c < a.H * chunks; c += blockDim.x) {
    const int64_t h = c / chunks, i = c % chunks * kVec;
    float f[kVec];
    load_vec<TS, kVec>(src + h * src_ld_h + i, f);
    store_vec<TC, kVec>(dst + h * dst_ld_h + i, f);
  }
}

// 8-bit caches: a warp per (token, head) row of K or V (block (t, k-or-v), warps taking heads in
// turn), lane i holding elements i, i + 32, ...: the head's largest |value| by a warp reduction,
// then each element encoded as kernels/kv_quant.h states (the CPU's arithmetic).
constexpr int kMaxPerLane = 8;  // D <= 256 (ops::check_kv_scales)
template <class TS, kvq::Format F>
__global__ void kv_append_8bit_kernel(const KvAppendArgs a) {
  grid_dependency_wait();
  const int64_t t = blockIdx.x;
  const bool is_v = blockIdx.y == 1;
  const int64_t pos = a.positions[t * a.pos_stride];
  if (pos < 0 || pos >= a.L) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  uint8_t* cache = static_cast<uint8_t*>(is_v ? a.v_cache : a.k_cache) +
                   pos * (is_v ? a.v_cache_ld_l : a.k_cache_ld_l);
  const int64_t cache_ld_h = is_v ? a.v_cache_ld_h : a.k_cache_ld_h;
  float* scale = (is_v ? a.v_scale : a.k_scale) + pos * a.H;
  const TS* src = static_cast<const TS*>(is_v ? a.v : a.k) + t * (is_v ? a.v_ld_t : a.k_ld_t);
  const int64_t src_ld_h = is_v ? a.v_ld_h : a.k_ld_h;
  for (int64_t h = warp; h < a.H; h += warps) {
    float f[kMaxPerLane];
    float absmax = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxPerLane; ++j) {
      const int64_t i = lane + 32 * j;
      f[j] = 0.0f;
      if (i < a.D) {
        f[j] = to_float(src[h * src_ld_h + i]);
        absmax = fmaxf(absmax, fabsf(f[j]));
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o /= 2) absmax = fmaxf(absmax, __shfl_xor_sync(0xffffffffu, absmax, o));
    const float inv = kvq::inverse_scale<F>(absmax);
#pragma unroll
    for (int j = 0; j < kMaxPerLane; ++j) {
      const int64_t i = lane + 32 * j;
      if (i < a.D) cache[h * cache_ld_h + i] = kvq::encode<F>(f[j] * inv);
    }
    if (lane == 0) scale[h] = kvq::scale_of<F>(absmax);
  }
}

template <class TS>
void launch_8bit(const KvAppendArgs& a) {
  const dim3 grid(static_cast<unsigned>(a.T), 2);
  const dim3 block(static_cast<unsigned>(32 * std::min<int64_t>(a.H, 8)));
  if (a.format == KvFormat::E4M3) {
    launch_dependent(kv_append_8bit_kernel<TS, kvq::Format::E4M3>, grid, block, 0, a);
  } else {
    launch_dependent(kv_append_8bit_kernel<TS, kvq::Format::I8>, grid, block, 0, a);
  }
}

template <class TS, class TC>
void launch(const KvAppendArgs& a, bool vec) {
  const dim3 grid(static_cast<unsigned>(a.T), 2);
  if (vec) {
    launch_dependent(kv_append_kernel<TS, TC, 8>, grid, dim3(block_threads_for(a.H * a.D / 8, 256)),
                     0, a);
  } else {
    launch_dependent(kv_append_kernel<TS, TC, 1>, grid, dim3(block_threads_for(a.H * a.D, 256)), 0,
                     a);
  }
}

}  // namespace

void kv_append(const KvAppendArgs& a) {
  if (a.T == 0 || a.H == 0 || a.D == 0) return;
  if (a.format != KvFormat::Plain) {
    with_float_type(a.src_type, [&](auto ts) { launch_8bit<decltype(ts)>(a); });
    check_launch("kv_append (8-bit)");
    return;
  }
  const int64_t lds[] = {a.k_cache_ld_l, a.k_cache_ld_h, a.v_cache_ld_l, a.v_cache_ld_h,
                         a.k_ld_t,       a.k_ld_h,       a.v_ld_t,       a.v_ld_h};
  bool vec = a.D % 8 == 0 && is_aligned(a.k_cache, 16) && is_aligned(a.v_cache, 16) &&
             is_aligned(a.k, 16) && is_aligned(a.v, 16);
  for (int64_t ld : lds) vec = vec && ld % 8 == 0;
  with_float_type(a.src_type, [&](auto ts) {
    with_float_type(a.cache_type, [&](auto tc) { launch<decltype(ts), decltype(tc)>(a, vec); });
  });
  check_launch("kv_append");
}

namespace {

template <KvFormat F, class T>
__device__ __forceinline__ float decoded(const void* pool, int64_t at) {
  if constexpr (F == KvFormat::Plain) {
    return to_float(static_cast<const T*>(pool)[at]);
  } else if constexpr (F == KvFormat::E4M3) {
    return kvq::decode<kvq::Format::E4M3>(static_cast<const uint8_t*>(pool)[at]);
  } else {
    return kvq::decode<kvq::Format::I8>(static_cast<const uint8_t*>(pool)[at]);
  }
}

// Block i: row rows[i] of both pools, threads over its H x D elements. A plain pool holds T.
template <KvFormat F, class T>
__global__ void kv_gather_kernel(const KvGatherArgs a) {
  grid_dependency_wait();
  const int64_t i = blockIdx.x, row = a.rows[i];
  const bool ok = row >= 0 && row < a.L;
  T* ok_k = static_cast<T*>(a.out_k) + i * a.H * a.D;
  T* ok_v = static_cast<T*>(a.out_v) + i * a.H * a.D;
  for (int64_t e = threadIdx.x; e < a.H * a.D; e += blockDim.x) {
    float k = 0.0f, v = 0.0f;
    if (ok) {
      const int64_t at = row * a.H * a.D + e;
      k = decoded<F, T>(a.k_pool, at);
      v = decoded<F, T>(a.v_pool, at);
      if constexpr (F != KvFormat::Plain) {
        const int64_t s = row * a.H + e / a.D;
        k *= a.k_scale[s];
        v *= a.v_scale[s];
      }
    }
    ok_k[e] = from_float<T>(k);
    ok_v[e] = from_float<T>(v);
  }
}

}  // namespace

void kv_gather(const KvGatherArgs& a) {
  if (a.n == 0 || a.H == 0 || a.D == 0) return;
  const dim3 grid(static_cast<unsigned>(a.n)), block(block_threads_for(a.H * a.D, 256));
  with_float_type(a.out_type, [&](auto t) {
    using T = decltype(t);
    switch (a.format) {
      case KvFormat::Plain:
        launch_dependent(kv_gather_kernel<KvFormat::Plain, T>, grid, block, 0, a);
        break;
      case KvFormat::E4M3:
        launch_dependent(kv_gather_kernel<KvFormat::E4M3, T>, grid, block, 0, a);
        break;
      case KvFormat::I8:
        launch_dependent(kv_gather_kernel<KvFormat::I8, T>, grid, block, 0, a);
        break;
    }
  });
  check_launch("kv_gather");
}

}  // namespace llmk::cuda
