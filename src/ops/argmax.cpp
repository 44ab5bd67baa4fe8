#include "kernels/cpu/argmax.h"

#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/penalty.h"
#include "ops/check.h"
#include "ops/ops.h"

#ifdef LLMK_HAS_CUDA
#include "kernels/cuda/argmax.h"
#endif

namespace llmk::ops {

using namespace detail;

void argmax(Tensor& out, const Tensor& x) {
  constexpr std::string_view op = "argmax";
  const bool cuda = on_cuda(op, {{"out", &out}, {"x", &x}});
  if (cuda) {
    LLMK_CHECK(x.dtype() == DType::F32 || x.dtype() == DType::BF16,
               "ops::argmax: x is {} but must be f32 or bf16", x.str());
  } else {
    require_dtype(op, "x", x, DType::F32);
  }
  require_ndim(op, "x", x, 2);
  require_last_dim_contiguous(op, "x", x);
  const int64_t M = x.dim(0), N = x.dim(1);
  LLMK_CHECK(N >= 1 && N <= std::numeric_limits<int32_t>::max(),
             "ops::argmax: x is {}: rows must hold 1 to 2^31 - 1 elements", x.str());
  require_dtype(op, "out", out, DType::I32);
  require_shape(op, "out", out, {M});
  require_disjoint(op, "out", out, "x", x);
  if (M == 0) return;
  if (cuda) {
#ifdef LLMK_HAS_CUDA
    cuda::argmax(out.data<int32_t>(), out.stride(0), x.data(), x.dtype(), x.stride(0), M, N);
#endif
    return;
  }
  cpu::argmax(out.data<int32_t>(), out.stride(0), x.data<const float>(), x.stride(0), M, N);
}

void sample_gumbel(Tensor& out, const Tensor& logits, const Tensor& temperature,
                   const Tensor& min_p, const Tensor& seed) {
  constexpr std::string_view op = "sample_gumbel";
  const bool cuda = on_cuda(op, {{"out", &out},
                                 {"logits", &logits},
                                 {"temperature", &temperature},
                                 {"min_p", &min_p},
                                 {"seed", &seed}});
  require_dtype(op, "logits", logits, DType::F32);
  require_ndim(op, "logits", logits, 2);
  require_last_dim_contiguous(op, "logits", logits);
  const int64_t M = logits.dim(0), N = logits.dim(1);
  LLMK_CHECK(N >= 1 && N <= std::numeric_limits<int32_t>::max(),
             "ops::sample_gumbel: logits is {}: rows must hold 1 to 2^31 - 1 elements",
             logits.str());
  require_dtype(op, "out", out, DType::I32);
  require_dtype(op, "temperature", temperature, DType::F32);
  require_dtype(op, "min_p", min_p, DType::F32);
  require_dtype(op, "seed", seed, DType::I64);
  for (const auto& [name, t] : {std::pair<std::string_view, const Tensor*>{"out", &out},
                                {"temperature", &temperature},
                                {"min_p", &min_p},
                                {"seed", &seed}}) {
    require_shape(op, name, *t, {M});
    LLMK_CHECK(t->is_contiguous(), "ops::sample_gumbel: {} ({}) must be contiguous", name,
               t->str());
  }
  require_disjoint(op, "out", out, "logits", logits);
  if (M == 0) return;
  const auto* seeds = reinterpret_cast<const uint64_t*>(seed.data<const int64_t>());
  if (cuda) {
#ifdef LLMK_HAS_CUDA
    cuda::sample_gumbel(out.data<int32_t>(), logits.data<const float>(), logits.stride(0), M, N,
                        temperature.data<const float>(), min_p.data<const float>(), seeds);
#endif
    return;
  }
  const float* t = temperature.data<const float>();
  const float* p = min_p.data<const float>();
  for (int64_t r = 0; r < M; ++r) {
    LLMK_CHECK(std::isfinite(t[r]) && t[r] > 0 && p[r] >= 0 && p[r] < 1,
               "ops::sample_gumbel: row {}: temperature {} must be > 0 and min_p {} in [0, 1)", r,
               t[r], p[r]);
  }
  cpu::sample_gumbel(out.data<int32_t>(), logits.data<const float>(), logits.stride(0), M, N, t, p,
                     seeds);
}

void apply_penalties(Tensor& logits, const Tensor& at, const Tensor& by) {
  constexpr std::string_view op = "apply_penalties";
  const bool cuda = on_cuda(op, {{"logits", &logits}, {"at", &at}, {"by", &by}});
  require_dtype(op, "logits", logits, DType::F32);
  require_ndim(op, "logits", logits, 2);
  require_last_dim_contiguous(op, "logits", logits);
  require_dtype(op, "at", at, DType::I32);
  require_dtype(op, "by", by, DType::F32);
  require_ndim(op, "at", at, 2);
  const int64_t n = at.dim(0);
  require_shape(op, "at", at, {n, 2});
  require_shape(op, "by", by, {n, 2});
  LLMK_CHECK(at.is_contiguous() && by.is_contiguous(),
             "ops::apply_penalties: at ({}) and by ({}) "
             "must be contiguous",
             at.str(), by.str());
  if (n == 0) return;
  if (cuda) {
#ifdef LLMK_HAS_CUDA
    cuda::apply_penalties(logits.data<float>(), logits.stride(0), at.data<const int32_t>(),
                          by.data<const float>(), n);
#endif
    return;
  }
  const int64_t M = logits.dim(0), N = logits.dim(1);
  const int32_t* a = at.data<const int32_t>();
  const float* b = by.data<const float>();
  for (int64_t e = 0; e < n; ++e) {
    LLMK_CHECK(a[2 * e] >= 0 && a[2 * e] < M && a[2 * e + 1] >= 0 && a[2 * e + 1] < N,
               "ops::apply_penalties: entry {} is at ({}, {}), outside logits {}", e, a[2 * e],
               a[2 * e + 1], logits.str());
    float& l = logits.data<float>()[a[2 * e] * logits.stride(0) + a[2 * e + 1]];
    l = penalty::apply(l, b[2 * e], b[2 * e + 1]);
  }
}

}  // namespace llmk::ops
