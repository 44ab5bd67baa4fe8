#include "kernels/cpu/kv_cache.h"

#include "ops/check.h"
#include "ops/kv_append.h"
#include "ops/ops.h"

namespace llmk::ops {

using namespace detail;

namespace detail {

bool check_kv_append(std::string_view op, const Tensor& k_cache, const Tensor& v_cache,
                     const Tensor& k, const Tensor& v, const Tensor& positions) {
  const bool cuda = on_cuda(op, {{"k_cache", &k_cache},
                                 {"v_cache", &v_cache},
                                 {"k", &k},
                                 {"v", &v},
                                 {"positions", &positions}});
  const DType cache_type = cuda ? DType::BF16 : DType::F32;
  for (const auto& [name, t] : {NamedTensor{"k_cache", &k_cache}, NamedTensor{"v_cache", &v_cache},
                                NamedTensor{"k", &k}, NamedTensor{"v", &v}}) {
    require_ndim(op, name, *t, 3);
    require_last_dim_contiguous(op, name, *t);
  }
  require_dtype(op, "k_cache", k_cache, cache_type);
  require_dtype(op, "v_cache", v_cache, cache_type);
  if (cuda) {
    LLMK_CHECK(k.dtype() == DType::BF16 || k.dtype() == DType::F32,
               "ops::{}: k is {} but must be bf16 or f32", op, k.str());
    require_dtype(op, "v", v, k.dtype());
  } else {
    require_dtype(op, "k", k, DType::F32);
    require_dtype(op, "v", v, DType::F32);
  }
  const int64_t L = k_cache.dim(0), H = k_cache.dim(1), D = k_cache.dim(2), T = k.dim(0);
  require_shape(op, "v_cache", v_cache, k_cache.shape());
  require_shape(op, "k", k, {T, H, D});
  require_shape(op, "v", v, {T, H, D});
  require_dtype(op, "positions", positions, DType::I32);
  require_shape(op, "positions", positions, {T});
  // The caches may interleave (one [L, 2, H, D] buffer), so only their starts are compared.
  LLMK_CHECK(k_cache.numel() == 0 || k_cache.data() != v_cache.data(),
             "ops::{}: k_cache and v_cache ({}) start at the same address", op, k_cache.str());
  for (const auto& [cname, c] :
       {NamedTensor{"k_cache", &k_cache}, NamedTensor{"v_cache", &v_cache}}) {
    for (const auto& [name, t] :
         {NamedTensor{"k", &k}, NamedTensor{"v", &v}, NamedTensor{"positions", &positions}}) {
      require_disjoint(op, cname, *c, name, *t);
    }
  }
  if (!cuda) {
    const auto* pos = positions.data<const int32_t>();
    for (int64_t t = 0; t < T; ++t) {
      const int32_t p = pos[t * positions.stride(0)];
      LLMK_CHECK(p >= 0 && p < L,
                 "ops::{}: positions[{}] = {} is outside the cache of {} rows (k_cache {})", op, t,
                 p, L, k_cache.str());
    }
  }
  return cuda;
}

void cpu_kv_append(Tensor& k_cache, Tensor& v_cache, const Tensor& k, const Tensor& v,
                   const Tensor& positions) {
  const int64_t T = k.dim(0), H = k_cache.dim(1), D = k_cache.dim(2);
  const auto* pos = positions.data<const int32_t>();
  cpu::kv_append(k_cache.data<float>(), k_cache.stride(0), k_cache.stride(1), k.data<const float>(),
                 k.stride(0), k.stride(1), pos, positions.stride(0), T, H, D);
  cpu::kv_append(v_cache.data<float>(), v_cache.stride(0), v_cache.stride(1), v.data<const float>(),
                 v.stride(0), v.stride(1), pos, positions.stride(0), T, H, D);
}

#ifdef LLMK_HAS_CUDA
// Positions stay on the device: rows outside the cache are skipped there (the caller's error,
// unchecked so that a captured step replays at any position).
cuda::KvAppendArgs cuda_kv_append_args(Tensor& k_cache, Tensor& v_cache, const Tensor& k,
                                       const Tensor& v, const Tensor& positions) {
  cuda::KvAppendArgs a;
  a.k_cache = k_cache.data();
  a.v_cache = v_cache.data();
  a.k_cache_ld_l = k_cache.stride(0);
  a.k_cache_ld_h = k_cache.stride(1);
  a.v_cache_ld_l = v_cache.stride(0);
  a.v_cache_ld_h = v_cache.stride(1);
  a.k = k.data();
  a.v = v.data();
  a.k_ld_t = k.stride(0);
  a.k_ld_h = k.stride(1);
  a.v_ld_t = v.stride(0);
  a.v_ld_h = v.stride(1);
  a.src_type = k.dtype();
  a.positions = positions.data<const int32_t>();
  a.pos_stride = positions.stride(0);
  a.T = k.dim(0);
  a.L = k_cache.dim(0);
  a.H = k_cache.dim(1);
  a.D = k_cache.dim(2);
  return a;
}
#endif

}  // namespace detail

void kv_append(Tensor& k_cache, Tensor& v_cache, const Tensor& k, const Tensor& v,
               const Tensor& positions) {
  const bool cuda = check_kv_append("kv_append", k_cache, v_cache, k, v, positions);
  if (k.dim(0) == 0) return;
  if (cuda) {
#ifdef LLMK_HAS_CUDA
    cuda::kv_append(cuda_kv_append_args(k_cache, v_cache, k, v, positions));
#endif
    return;
  }
  cpu_kv_append(k_cache, v_cache, k, v, positions);
}

}  // namespace llmk::ops
