#include "kernels/cpu/attention.h"

#include <cmath>

#include "ops/check.h"
#include "ops/ops.h"

namespace llmk::ops {

using namespace detail;

void attention(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v, int64_t pos0,
               const AttentionParams& p) {
  constexpr std::string_view op = "attention";
  const std::pair<std::string_view, const Tensor*> all[] = {
      {"out", &out}, {"q", &q}, {"k", &k}, {"v", &v}};
  for (const auto& [name, t] : all) {
    require_cpu(op, name, *t);
    require_dtype(op, name, *t, DType::F32);
    require_ndim(op, name, *t, 3);
    require_last_dim_contiguous(op, name, *t);
  }
  const int64_t T = q.dim(0), Hq = q.dim(1), D = q.dim(2);
  const int64_t L = k.dim(0), Hkv = k.dim(1);
  LLMK_CHECK(k.dim(2) == D, "ops::attention: q is {} but k is {}: head dims differ", q.str(),
             k.str());
  require_shape(op, "v", v, k.shape());
  require_shape(op, "out", out, q.shape());
  LLMK_CHECK(Hkv > 0 && Hq % Hkv == 0,
             "ops::attention: q has {} heads, not a multiple of the {} KV heads of k ({})", Hq, Hkv,
             k.str());
  LLMK_CHECK(pos0 >= 0, "ops::attention: pos0 = {} must be >= 0", pos0);
  LLMK_CHECK(L >= pos0 + T,
             "ops::attention: the KV cache holds {} positions (k is {}) but queries reach "
             "position {} (pos0 {} + T {} - 1)",
             L, k.str(), pos0 + T - 1, pos0, T);
  LLMK_CHECK(p.window >= 0, "ops::attention: window = {} must be >= 0", p.window);
  LLMK_CHECK(p.softcap >= 0.0f && std::isfinite(p.softcap),
             "ops::attention: softcap = {} must be >= 0", p.softcap);
  LLMK_CHECK(std::isfinite(p.scale), "ops::attention: scale = {} must be finite", p.scale);
  require_disjoint(op, "out", out, "q", q);
  require_disjoint(op, "out", out, "k", k);
  require_disjoint(op, "out", out, "v", v);
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
  a.T = T;
  a.Hq = Hq;
  a.Hkv = Hkv;
  a.D = D;
  a.pos0 = pos0;
  a.scale = p.scale != 0.0f ? p.scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  a.window = p.window;
  a.softcap = p.softcap;
  if (T == 0 || Hq == 0 || D == 0) return;
  cpu::attention(a);
}

}  // namespace llmk::ops
