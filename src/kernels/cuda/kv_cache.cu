// KV append: block (t, k-or-v) copies row t of k or v into cache row positions[t], with 16-byte
// accesses where every row start is aligned.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kv_cache.h"

namespace llmk::cuda {

namespace {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ void load(const float* p, float (&f)[8]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0];
  const float4 b = reinterpret_cast<const float4*>(p)[1];
  f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
}
__device__ __forceinline__ void load(const float* p, float (&f)[1]) { f[0] = *p; }
template <int N>
__device__ __forceinline__ void load(const bf16* p, float (&f)[N]) {
  load_bf16<N>(p, f);
}

template <class TS, int kVec>
__global__ void kv_append_kernel(const KvAppendArgs a) {
  grid_dependency_wait();
  const int64_t t = blockIdx.x;
  const bool is_v = blockIdx.y == 1;
  const int64_t pos = a.positions[t * a.pos_stride];
  if (pos < 0 || pos >= a.L) return;  // the caller's error; writing would corrupt memory
  bf16* dst = static_cast<bf16*>(is_v ? a.v_cache : a.k_cache) +
              pos * (is_v ? a.v_cache_ld_l : a.k_cache_ld_l);
  const int64_t dst_ld_h = is_v ? a.v_cache_ld_h : a.k_cache_ld_h;
  const TS* src = static_cast<const TS*>(is_v ? a.v : a.k) + t * (is_v ? a.v_ld_t : a.k_ld_t);
  const int64_t src_ld_h = is_v ? a.v_ld_h : a.k_ld_h;
  const int64_t chunks = a.D / kVec;  // per head
  for (int64_t c = threadIdx.x; c < a.H * chunks; c += blockDim.x) {
    const int64_t h = c / chunks, i = c % chunks * kVec;
    float f[kVec];
    load(src + h * src_ld_h + i, f);
    store_bf16<kVec>(dst + h * dst_ld_h + i, f);
  }
}

template <class TS>
void launch(const KvAppendArgs& a, bool vec) {
  const dim3 grid(static_cast<unsigned>(a.T), 2);
  if (vec) {
    launch_dependent(kv_append_kernel<TS, 8>, grid, dim3(block_threads_for(a.H * a.D / 8, 256)), 0,
                     a);
  } else {
    launch_dependent(kv_append_kernel<TS, 1>, grid, dim3(block_threads_for(a.H * a.D, 256)), 0, a);
  }
}

}  // namespace

void kv_append(const KvAppendArgs& a) {
  if (a.T == 0 || a.H == 0 || a.D == 0) return;
  const int64_t lds[] = {a.k_cache_ld_l, a.k_cache_ld_h, a.v_cache_ld_l, a.v_cache_ld_h,
                         a.k_ld_t,       a.k_ld_h,       a.v_ld_t,       a.v_ld_h};
  bool vec = a.D % 8 == 0 && is_aligned(a.k_cache, 16) && is_aligned(a.v_cache, 16) &&
             is_aligned(a.k, 16) && is_aligned(a.v, 16);
  for (int64_t ld : lds) vec = vec && ld % 8 == 0;
  if (a.src_type == DType::F32) {
    launch<float>(a, vec);
  } else {
    launch<bf16>(a, vec);
  }
  check_launch("kv_append");
}

}  // namespace llmk::cuda
