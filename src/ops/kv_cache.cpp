#include "kernels/cpu/kv_cache.h"

#include <algorithm>

#include "ops/check.h"
#include "ops/kv_append.h"
#include "ops/ops.h"

namespace llmk::ops {

using namespace detail;

namespace detail {

kvq::Format kv_format(const Tensor& cache) {
  return cache.dtype() == DType::F8E4M3 ? kvq::Format::E4M3 : kvq::Format::I8;
}

void check_kv_scales(std::string_view op, const Tensor& k_cache, const Tensor& v_cache,
                     const KvScales* scales) {
  const auto eight_bit = [](const Tensor& t) {
    return t.dtype() == DType::F8E4M3 || t.dtype() == DType::I8;
  };
  if (scales == nullptr) {
    LLMK_CHECK(!eight_bit(k_cache) && !eight_bit(v_cache),
               "ops::{}: the caches are {} and {}: 8-bit caches need their scales", op,
               k_cache.str(), v_cache.str());
    return;
  }
  LLMK_CHECK(eight_bit(k_cache) && k_cache.dtype() == v_cache.dtype(),
             "ops::{}: with scales the caches must both be f8e4m3 or both i8, not {} and {}", op,
             k_cache.str(), v_cache.str());
  LLMK_CHECK(k_cache.ndim() == 3 && k_cache.dim(2) <= 256,
             "ops::{}: an 8-bit cache ({}) holds head dims up to 256", op, k_cache.str());
  for (const auto& [name, t] :
       {NamedTensor{"scales.k", &scales->k}, NamedTensor{"scales.v", &scales->v}}) {
    LLMK_CHECK(t->defined(), "ops::{}: {} is missing", op, name);
    require_dtype(op, name, *t, DType::F32);
    require_shape(op, name, *t, {k_cache.dim(0), k_cache.dim(1)});
    LLMK_CHECK(t->is_contiguous() && t->device() == k_cache.device(),
               "ops::{}: {} ({}) must be contiguous, on the caches' device", op, name, t->str());
  }
}

bool check_kv_append(std::string_view op, const Tensor& k_cache, const Tensor& v_cache,
                     const Tensor& k, const Tensor& v, const Tensor& positions,
                     const KvScales* scales) {
  const bool cuda = on_cuda(op, {{"k_cache", &k_cache},
                                 {"v_cache", &v_cache},
                                 {"k", &k},
                                 {"v", &v},
                                 {"positions", &positions}});
  for (const auto& [name, t] : {NamedTensor{"k_cache", &k_cache}, NamedTensor{"v_cache", &v_cache},
                                NamedTensor{"k", &k}, NamedTensor{"v", &v}}) {
    require_ndim(op, name, *t, 3);
    require_last_dim_contiguous(op, name, *t);
  }
  check_kv_scales(op, k_cache, v_cache, scales);
  // On CUDA the new rows may be of another float type than a plain cache: they are converted.
  if (scales == nullptr)
    require_activations(op, cuda, {{"k_cache", &k_cache}, {"v_cache", &v_cache}});
  require_activations(op, cuda, {{"k", &k}, {"v", &v}});
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
                   const Tensor& positions, KvScales* scales) {
  const int64_t T = k.dim(0), H = k_cache.dim(1), D = k_cache.dim(2);
  const auto* pos = positions.data<const int32_t>();
  if (scales != nullptr) {
    const kvq::Format f = kv_format(k_cache);
    cpu::kv_append_8bit(static_cast<uint8_t*>(k_cache.data()), k_cache.stride(0), k_cache.stride(1),
                        scales->k.data<float>(), H, k.data<const float>(), k.stride(0), k.stride(1),
                        pos, positions.stride(0), T, H, D, f);
    cpu::kv_append_8bit(static_cast<uint8_t*>(v_cache.data()), v_cache.stride(0), v_cache.stride(1),
                        scales->v.data<float>(), H, v.data<const float>(), v.stride(0), v.stride(1),
                        pos, positions.stride(0), T, H, D, f);
    return;
  }
  cpu::kv_append(k_cache.data<float>(), k_cache.stride(0), k_cache.stride(1), k.data<const float>(),
                 k.stride(0), k.stride(1), pos, positions.stride(0), T, H, D);
  cpu::kv_append(v_cache.data<float>(), v_cache.stride(0), v_cache.stride(1), v.data<const float>(),
                 v.stride(0), v.stride(1), pos, positions.stride(0), T, H, D);
}

#ifdef LLMK_HAS_CUDA
cuda::KvFormat cuda_kv_format(const Tensor& cache) {
  return kv_format(cache) == kvq::Format::E4M3 ? cuda::KvFormat::E4M3 : cuda::KvFormat::I8;
}

// Positions stay on the device: rows outside the cache are skipped there (the caller's error,
// unchecked so that a captured step replays at any position).
cuda::KvAppendArgs cuda_kv_append_args(Tensor& k_cache, Tensor& v_cache, const Tensor& k,
                                       const Tensor& v, const Tensor& positions, KvScales* scales) {
  cuda::KvAppendArgs a;
  if (scales != nullptr) {
    a.format = cuda_kv_format(k_cache);
    a.k_scale = scales->k.data<float>();
    a.v_scale = scales->v.data<float>();
  }
  a.k_cache = k_cache.data();
  a.v_cache = v_cache.data();
  a.cache_type = k_cache.dtype();
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
               const Tensor& positions, KvScales* scales) {
  const bool cuda = check_kv_append("kv_append", k_cache, v_cache, k, v, positions, scales);
  if (k.dim(0) == 0) return;
  if (cuda) {
#ifdef LLMK_HAS_CUDA
    cuda::kv_append(cuda_kv_append_args(k_cache, v_cache, k, v, positions, scales));
#endif
    return;
  }
  cpu_kv_append(k_cache, v_cache, k, v, positions, scales);
}

void kv_gather(Tensor& out_k, Tensor& out_v, const Tensor& k_pool, const Tensor& v_pool,
               const Tensor& rows, const KvScales* scales) {
  constexpr std::string_view op = "kv_gather";
  const bool cuda = on_cuda(op, {{"out_k", &out_k},
                                 {"out_v", &out_v},
                                 {"k_pool", &k_pool},
                                 {"v_pool", &v_pool},
                                 {"rows", &rows}});
  for (const auto& [name, t] : {NamedTensor{"out_k", &out_k}, NamedTensor{"out_v", &out_v},
                                NamedTensor{"k_pool", &k_pool}, NamedTensor{"v_pool", &v_pool}}) {
    require_ndim(op, name, *t, 3);
    LLMK_CHECK(t->is_contiguous(), "ops::{}: {} ({}) must be contiguous", op, name, t->str());
  }
  check_kv_scales(op, k_pool, v_pool, scales);
  const int64_t L = k_pool.dim(0), H = k_pool.dim(1), D = k_pool.dim(2), n = rows.numel();
  require_shape(op, "v_pool", v_pool, k_pool.shape());
  require_dtype(op, "rows", rows, DType::I32);
  require_shape(op, "rows", rows, {n});
  require_shape(op, "out_k", out_k, {n, H, D});
  require_shape(op, "out_v", out_v, {n, H, D});
  const DType out_type = require_activations(op, cuda, {{"out_k", &out_k}, {"out_v", &out_v}});
  if (scales == nullptr) {
    require_dtype(op, "k_pool", k_pool, out_type);
    require_dtype(op, "v_pool", v_pool, out_type);
  }
  if (n == 0) return;
  if (cuda) {
#ifdef LLMK_HAS_CUDA
    LLMK_CHECK(rows.is_contiguous(), "ops::{}: rows ({}) must be contiguous", op, rows.str());
    cuda::KvGatherArgs a;
    a.out_k = out_k.data();
    a.out_v = out_v.data();
    a.out_type = out_type;
    a.k_pool = k_pool.data();
    a.v_pool = v_pool.data();
    a.rows = rows.data<const int32_t>();
    a.n = n;
    a.L = L;
    a.H = H;
    a.D = D;
    if (scales != nullptr) {
      a.format = cuda_kv_format(k_pool);
      a.k_scale = scales->k.data<const float>();
      a.v_scale = scales->v.data<const float>();
    }
    cuda::kv_gather(a);
#endif
    return;
  }
  const int32_t* r = rows.data<const int32_t>();
  const kvq::Format f = scales ? kv_format(k_pool) : kvq::Format::I8;  // (8-bit only)
  for (int64_t i = 0; i < n; ++i) {
    const int64_t j = r[i * rows.stride(0)];
    LLMK_CHECK(j >= 0 && j < L, "ops::{}: rows[{}] = {} is outside the pool of {} rows", op, i, j,
               L);
    for (int64_t h = 0; h < H; ++h) {
      float* dk = out_k.data<float>() + (i * H + h) * D;
      float* dv = out_v.data<float>() + (i * H + h) * D;
      const int64_t at = (j * H + h) * D;
      if (scales != nullptr) {
        cpu::kv_decode(dk, static_cast<const uint8_t*>(k_pool.data()) + at,
                       scales->k.data<const float>()[j * H + h], D, f);
        cpu::kv_decode(dv, static_cast<const uint8_t*>(v_pool.data()) + at,
                       scales->v.data<const float>()[j * H + h], D, f);
      } else {
        std::copy_n(k_pool.data<const float>() + at, D, dk);
        std::copy_n(v_pool.data<const float>() + at, D, dv);
      }
    }
  }
}

}  // namespace llmk::ops
