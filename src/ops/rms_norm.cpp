#include "kernels/cpu/rms_norm.h"

#include "ops/check.h"
#include "ops/ops.h"

namespace llmk::ops {

using namespace detail;

void rms_norm(Tensor& out, const Tensor& x, const Tensor& w, float eps, bool add_one) {
  constexpr std::string_view op = "rms_norm";
  require_cpu(op, "out", out);
  require_cpu(op, "x", x);
  require_cpu(op, "w", w);
  require_dtype(op, "x", x, DType::F32);
  require_dtype(op, "out", out, DType::F32);
  require_dtype(op, "w", w, DType::F32);
  LLMK_CHECK(x.ndim() >= 1, "ops::rms_norm: x is {} but needs at least one dimension", x.str());
  const int64_t D = x.dim(-1);
  LLMK_CHECK(D > 0, "ops::rms_norm: x is {}: the normalised dimension is empty", x.str());
  require_shape(op, "out", out, x.shape());
  require_shape(op, "w", w, {D});
  require_last_dim_contiguous(op, "x", x);
  require_last_dim_contiguous(op, "out", out);
  require_last_dim_contiguous(op, "w", w);
  LLMK_CHECK(eps >= 0.0f, "ops::rms_norm: eps = {} must be >= 0", eps);
  require_no_partial_overlap(op, "out", out, "x", x);
  require_disjoint(op, "out", out, "w", w);
  for_each_row_run<2>({&out, &x}, [&](auto p, int64_t rows, auto ld) {
    cpu::rms_norm(p[0], ld[0], p[1], ld[1], rows, D, w.data<const float>(), eps, add_one);
  });
}

}  // namespace llmk::ops
