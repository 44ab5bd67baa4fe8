#include "kernels/cpu/attention.h"

#include <cmath>
#include <cstdint>
#include <limits>

#include "ops/check.h"
#include "ops/ops.h"

#ifdef LLMK_HAS_CUDA
#include "kernels/cuda/attention/attention.h"
#endif

namespace llmk::ops {

using namespace detail;

namespace {

constexpr std::string_view kOp = "attention";

struct Dims {
  int64_t T, Hq, Hkv, D, L;
};

// Everything that does not depend on the device or on the position values.
Dims check_shapes(const Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v,
                  const Tensor& positions, const AttentionParams& p) {
  const std::pair<std::string_view, const Tensor*> all[] = {
      {"out", &out}, {"q", &q}, {"k", &k}, {"v", &v}};
  for (const auto& [name, t] : all) {
    require_ndim(kOp, name, *t, 3);
    require_last_dim_contiguous(kOp, name, *t);
  }
  const Dims d{q.dim(0), q.dim(1), k.dim(1), q.dim(2), k.dim(0)};
  LLMK_CHECK(k.dim(2) == d.D, "ops::attention: q is {} but k is {}: head dims differ", q.str(),
             k.str());
  require_shape(kOp, "v", v, k.shape());
  require_shape(kOp, "out", out, q.shape());
  LLMK_CHECK(d.Hkv > 0 && d.Hq % d.Hkv == 0,
             "ops::attention: q has {} heads, not a multiple of the {} KV heads of k ({})", d.Hq,
             d.Hkv, k.str());
  require_dtype(kOp, "positions", positions, DType::I32);
  require_shape(kOp, "positions", positions, {d.T});
  LLMK_CHECK(p.window >= 0, "ops::attention: window = {} must be >= 0", p.window);
  LLMK_CHECK(p.softcap >= 0.0f && std::isfinite(p.softcap),
             "ops::attention: softcap = {} must be >= 0", p.softcap);
  LLMK_CHECK(std::isfinite(p.scale), "ops::attention: scale = {} must be finite", p.scale);
  require_disjoint(kOp, "out", out, "q", q);
  require_disjoint(kOp, "out", out, "k", k);
  require_disjoint(kOp, "out", out, "v", v);
  return d;
}

float resolved_scale(const AttentionParams& p, int64_t D) {
  return p.scale != 0.0f ? p.scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
}

// CPU: positions must be consecutive and inside the cache; returns positions[0].
int64_t check_positions(const Tensor& positions, const Tensor& k, int64_t T, int64_t L) {
  const int32_t* pos = positions.data<const int32_t>();
  const int64_t stride = positions.stride(0);
  const int64_t pos0 = pos[0];
  LLMK_CHECK(pos0 >= 0, "ops::attention: positions[0] = {} must be >= 0", pos0);
  for (int64_t t = 1; t < T; ++t) {
    LLMK_CHECK(pos[t * stride] == pos0 + t,
               "ops::attention: positions must be consecutive: positions[0] = {} but "
               "positions[{}] = {} (expected {})",
               pos0, t, pos[t * stride], pos0 + t);
  }
  LLMK_CHECK(pos0 + T - 1 < L,
             "ops::attention: the KV cache holds {} positions (k is {}) but queries reach "
             "position {} (positions[{}])",
             L, k.str(), pos0 + T - 1, T - 1);
  return pos0;
}

#ifdef LLMK_HAS_CUDA
// The kernels read 16 bytes at a time along rows and heads.
void require_16_byte_rows(std::string_view name, const Tensor& t) {
  const bool ok = reinterpret_cast<uintptr_t>(t.data()) % 16 == 0 &&
                  (t.dim(0) <= 1 || t.stride(0) % 8 == 0) &&
                  (t.dim(1) <= 1 || t.stride(1) % 8 == 0);
  LLMK_CHECK(ok,
             "ops::attention: {} ({}, strides [{}]) must be 16-byte aligned, with row and head "
             "strides that are multiples of 8 elements, for the CUDA kernels",
             name, t.str(), fmt::join(t.strides(), ", "));
}

void attention_cuda(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v,
                    const Tensor& positions, const AttentionParams& p, const Dims& d) {
  const std::pair<std::string_view, const Tensor*> all[] = {
      {"out", &out}, {"q", &q}, {"k", &k}, {"v", &v}};
  for (const auto& [name, t] : all) {
    require_dtype(kOp, name, *t, DType::BF16);
    require_16_byte_rows(name, *t);
  }
  LLMK_CHECK(d.T <= 1 || positions.stride(0) == 1,
             "ops::attention: positions ({}) must be contiguous on the GPU", positions.str());
  LLMK_CHECK(cuda::attention_head_dim_supported(static_cast<int>(d.D)),
             "ops::attention: head dim {} (q is {}) is not supported by the CUDA kernels (64, "
             "128 or 256)",
             d.D, q.str());
  constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();
  LLMK_CHECK(d.T <= kMaxInt && d.Hq <= 65535 && d.L <= kMaxInt,
             "ops::attention: q is {}, k is {}: too large for the CUDA kernels", q.str(), k.str());
  if (d.T == 0 || d.Hq == 0) return;

  cuda::AttentionArgs a;
  a.out = out.data<__nv_bfloat16>();
  a.out_t = out.stride(0);
  a.out_h = out.stride(1);
  a.q = q.data<const __nv_bfloat16>();
  a.q_t = q.stride(0);
  a.q_h = q.stride(1);
  a.k = k.data<const __nv_bfloat16>();
  a.k_t = k.stride(0);
  a.k_h = k.stride(1);
  a.v = v.data<const __nv_bfloat16>();
  a.v_t = v.stride(0);
  a.v_h = v.stride(1);
  a.positions = positions.data<const int32_t>();
  a.T = static_cast<int>(d.T);
  a.Hq = static_cast<int>(d.Hq);
  a.Hkv = static_cast<int>(d.Hkv);
  a.D = static_cast<int>(d.D);
  a.L = d.L;
  a.scale = resolved_scale(p, d.D);
  a.window = p.window;
  a.softcap = p.softcap;
  if (d.T <= cuda::kDecodeMaxQueries) {
    cuda::attention_decode(a);
  } else {
    cuda::attention_prefill(a);
  }
}
#endif

}  // namespace

void attention(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v,
               const Tensor& positions, const AttentionParams& p) {
  const bool cuda =
      on_cuda(kOp, {{"out", &out}, {"q", &q}, {"k", &k}, {"v", &v}, {"positions", &positions}});
  const Dims d = check_shapes(out, q, k, v, positions, p);
  if (cuda) {
#ifdef LLMK_HAS_CUDA
    attention_cuda(out, q, k, v, positions, p, d);
#endif
    return;
  }

  const std::pair<std::string_view, const Tensor*> all[] = {
      {"out", &out}, {"q", &q}, {"k", &k}, {"v", &v}};
  for (const auto& [name, t] : all) require_dtype(kOp, name, *t, DType::F32);
  if (d.T == 0) return;
  const int64_t pos0 = check_positions(positions, k, d.T, d.L);
  cpu::AttentionArgs a;
  a.out = out.data<float>();
  a.out_t = out.stride(0);
  a.out_h = out.stride(1);
  a.q = q.data<const float>();
  a.q_t = q.stride(0);
  a.q_h = q.stride(1);
  a.k = k.data<const float>();
  a.k_t = k.stride(0);
  a.k_h = k.stride(1);
  a.v = v.data<const float>();
  a.v_t = v.stride(0);
  a.v_h = v.stride(1);
  a.T = d.T;
  a.Hq = d.Hq;
  a.Hkv = d.Hkv;
  a.D = d.D;
  a.pos0 = pos0;
  a.scale = resolved_scale(p, d.D);
  a.window = p.window;
  a.softcap = p.softcap;
  if (d.Hq == 0 || d.D == 0) return;
  cpu::attention(a);
}

}  // namespace llmk::ops
