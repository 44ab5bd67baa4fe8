#include "kernels/cpu/rope.h"

#include <cmath>
#include <type_traits>

#include "ops/check.h"
#include "ops/kv_append.h"
#include "ops/linear_args.h"
#include "ops/ops.h"

#ifdef LLMK_HAS_CUDA
#include "kernels/cuda/rope.h"
#endif

namespace llmk::ops {

using namespace detail;

namespace {

// Checks rope's operands as ops.h states them (errors name `op`); true when they are on CUDA.
bool check_rope(std::string_view op, const Tensor& x, const Tensor& positions,
                const RopeParams& p) {
  const bool cuda =
      p.freq_factors
          ? on_cuda(op, {{"x", &x}, {"positions", &positions}, {"freq_factors", p.freq_factors}})
          : on_cuda(op, {{"x", &x}, {"positions", &positions}});
  require_activations(op, cuda, {{"x", &x}});
  require_ndim(op, "x", x, 3);
  require_last_dim_contiguous(op, "x", x);
  require_dtype(op, "positions", positions, DType::I32);
  const int64_t T = x.dim(0), D = x.dim(2);
  require_shape(op, "positions", positions, {T});
  const int64_t rot = p.rot_dim == 0 ? D : p.rot_dim;
  LLMK_CHECK(rot > 0 && rot % 2 == 0 && rot <= D,
             "ops::{}: rot_dim = {} must be even and in (0, head dim {}] (x is {})", op, p.rot_dim,
             D, x.str());
  LLMK_CHECK(p.theta > 0.0f && std::isfinite(p.theta), "ops::{}: theta = {} must be positive", op,
             p.theta);
  LLMK_CHECK(std::isfinite(p.freq_scale) && p.freq_scale > 0.0f,
             "ops::{}: freq_scale = {} must be positive", op, p.freq_scale);
  if (p.freq_factors) {
    const Tensor& f = *p.freq_factors;
    require_dtype(op, "freq_factors", f, DType::F32);
    require_shape(op, "freq_factors", f, {rot / 2});
    require_last_dim_contiguous(op, "freq_factors", f);
    require_disjoint(op, "x", x, "freq_factors", f);
  }
  require_disjoint(op, "x", x, "positions", positions);
#ifdef LLMK_HAS_CUDA
  LLMK_CHECK(!cuda || rot <= 2 * cuda::kMaxRopePairs,
             "ops::{}: rot_dim {} is over the {} the CUDA kernel takes (x is {})", op, rot,
             2 * cuda::kMaxRopePairs, x.str());
#endif
  return cuda;
}

// The launcher's arguments (cpu::RopeArgs or cuda::RopeArgs: the same fields) for x.
template <class Args, class Elem>
Args rope_args(Tensor& x, const Tensor& positions, const RopeParams& p) {
  Args a;
  a.x = x.data<Elem>();
  if constexpr (std::is_void_v<Elem>) a.dtype = x.dtype();  // CUDA: any float type
  a.T = x.dim(0);
  a.H = x.dim(1);
  a.D = x.dim(2);
  a.ld_t = x.stride(0);
  a.ld_h = x.stride(1);
  a.positions = positions.data<const int32_t>();
  a.pos_stride = positions.stride(0);
  a.rot_dim = static_cast<int>(p.rot_dim == 0 ? x.dim(2) : p.rot_dim);
  a.theta = p.theta;
  a.half_split = p.layout == RopeLayout::HalfSplit;
  a.freq_scale = p.freq_scale;
  a.freq_factors = p.freq_factors ? p.freq_factors->data<const float>() : nullptr;
  return a;
}

}  // namespace

void rope(Tensor& x, const Tensor& positions, const RopeParams& p) {
  if (check_rope("rope", x, positions, p)) {
#ifdef LLMK_HAS_CUDA
    cuda::rope(rope_args<cuda::RopeArgs, void>(x, positions, p));
#endif
    return;
  }
  cpu::rope(rope_args<cpu::RopeArgs, float>(x, positions, p));
}

void rope_kv_append(Tensor& qk, const Tensor& positions, const RopeParams& p, Tensor& k_cache,
                    Tensor& v_cache, const Tensor& v, const Tensor& cache_rows, KvScales* scales) {
  constexpr std::string_view op = "rope_kv_append";
  const bool cuda = check_rope(op, qk, positions, p);
  require_ndim(op, "k_cache", k_cache, 3);
  const int64_t H = qk.dim(1), Hkv = k_cache.dim(1);
  LLMK_CHECK(Hkv <= H, "ops::{}: k_cache has {} heads but qk only {} (qk is {})", op, Hkv, H,
             qk.str());
  const Tensor k = qk.slice(1, H - Hkv, H);
  check_kv_append(op, k_cache, v_cache, k, v, cache_rows, scales);
  if (!cuda) {  // the operands are checked: the CPU kernels themselves
    cpu::rope(rope_args<cpu::RopeArgs, float>(qk, positions, p));
    cpu_kv_append(k_cache, v_cache, k, v, cache_rows, scales);
    return;
  }
#ifdef LLMK_HAS_CUDA
  const cuda::KvAppendArgs append = cuda_kv_append_args(k_cache, v_cache, k, v, cache_rows, scales);
  cuda::RopeArgs a = rope_args<cuda::RopeArgs, void>(qk, positions, p);
  // 8-bit rows, or rows converted to a cache of another type: the rotation, then the append.
  if (scales != nullptr || k_cache.dtype() != qk.dtype() || v.dtype() != qk.dtype()) {
    cuda::rope(a);
    if (k.dim(0) > 0) cuda::kv_append(append);
    return;
  }
  a.append = &append;
  cuda::rope(a);
#endif
}

void linear_rope_kv_append(Tensor& qkv, const Tensor& x, const Tensor& w, const Tensor* bias,
                           int64_t n_heads, const Tensor& positions, const RopeParams& p,
                           Tensor& k_cache, Tensor& v_cache, const Tensor& cache_rows,
                           KvScales* scales) {
  constexpr std::string_view op = "linear_rope_kv_append";
  require_ndim(op, "qkv", qkv, 2);
  require_ndim(op, "k_cache", k_cache, 3);
  const int64_t Hkv = k_cache.dim(1), D = k_cache.dim(2);
  LLMK_CHECK(n_heads > 0 && qkv.dim(1) == (n_heads + 2 * Hkv) * D,
             "ops::{}: qkv is {}, but {} query heads and k_cache {} make {} columns", op, qkv.str(),
             n_heads, k_cache.str(), (n_heads + 2 * Hkv) * D);
  Tensor qk = qkv.slice(1, 0, (n_heads + Hkv) * D).unflatten(1, {n_heads + Hkv, D});
  const Tensor v =
      qkv.slice(1, (n_heads + Hkv) * D, (n_heads + 2 * Hkv) * D).unflatten(1, {Hkv, D});
#ifdef LLMK_HAS_CUDA
  // One token on CUDA, every dim rotated: the one-row linear (qgemv over quantised weights) with
  // the rotation and the append in its epilogue, where it takes the operands (gemv_applies,
  // qgemv_applies; the epilogue writes the cache rows in the output's type, so a plain cache of
  // that type).
  if (scales == nullptr && x.defined() && x.device() == Device::CUDA && x.ndim() == 2 &&
      x.dim(0) == 1 && (p.rot_dim == 0 || p.rot_dim == D) && k_cache.dtype() == qkv.dtype()) {
    const bool cuda = check_rope(op, qk, positions, p);
    const Tensor keys = qk.slice(1, n_heads, n_heads + Hkv);
    check_kv_append(op, k_cache, v_cache, keys, v, cache_rows);
    require_disjoint(op, "qkv", qkv, "x", x);
    const cuda::KvAppendArgs kv = cuda_kv_append_args(k_cache, v_cache, keys, v, cache_rows);
    cuda::GemvRope r;
    r.position = positions.data<const int32_t>();
    r.cache_row = kv.positions;
    r.k_cache = kv.k_cache;
    r.v_cache = kv.v_cache;
    r.kc_ld_l = kv.k_cache_ld_l;
    r.kc_ld_h = kv.k_cache_ld_h;
    r.vc_ld_l = kv.v_cache_ld_l;
    r.vc_ld_h = kv.v_cache_ld_h;
    r.L = kv.L;
    r.D = static_cast<int>(D);
    r.Hq = static_cast<int>(n_heads);
    r.Hkv = static_cast<int>(Hkv);
    r.half_split = p.layout == RopeLayout::HalfSplit;
    r.theta = p.theta;
    r.freq_scale = p.freq_scale;
    r.freq_factors = p.freq_factors ? p.freq_factors->data<const float>() : nullptr;
    if (is_quantized(w.dtype())) {
      cuda::QLinearArgs a = linear_cuda_qargs(qkv, x, w, bias, false);
      a.rope = &r;
      if (cuda && cuda::qlinear_row(a)) return;
    } else {
      const cuda::LinearArgs a = linear_cuda_args(qkv, x, w, bias);
      if (cuda && cuda::linear_rope_row(a, r)) return;
    }
  }
#endif
  linear(qkv, x, w, bias);
  rope_kv_append(qk, positions, p, k_cache, v_cache, v, cache_rows, scales);
}

}  // namespace llmk::ops
