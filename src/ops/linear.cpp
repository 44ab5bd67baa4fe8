#include "kernels/cpu/matmul.h"
#include "ops/check.h"
#include "ops/ops.h"

namespace llmk::ops {

using namespace detail;

void linear(Tensor& out, const Tensor& x, const Tensor& w, const Tensor* bias) {
  constexpr std::string_view op = "linear";
  require_cpu(op, "out", out);
  require_cpu(op, "x", x);
  require_cpu(op, "w", w);
  require_dtype(op, "x", x, DType::F32);
  require_ndim(op, "x", x, 2);
  require_ndim(op, "w", w, 2);
  LLMK_CHECK(cpu::linear_supports(w.dtype()), "ops::linear: w is {}: dtype {} is not supported",
             w.str(), dtype_name(w.dtype()));
  const int64_t M = x.dim(0), K = x.dim(1), N = w.dim(0);
  LLMK_CHECK(w.dim(1) == K, "ops::linear: x is {} but w is {}: inner dims differ", x.str(),
             w.str());
  require_dtype(op, "out", out, DType::F32);
  require_shape(op, "out", out, {M, N});
  require_last_dim_contiguous(op, "x", x);
  require_last_dim_contiguous(op, "w", w);
  require_last_dim_contiguous(op, "out", out);
  require_disjoint(op, "out", out, "x", x);
  require_disjoint(op, "out", out, "w", w);
  cpu::LinearArgs a;
  if (bias) {
    require_cpu(op, "bias", *bias);
    require_dtype(op, "bias", *bias, DType::F32);
    require_shape(op, "bias", *bias, {N});
    require_last_dim_contiguous(op, "bias", *bias);
    require_disjoint(op, "out", out, "bias", *bias);
    a.bias = bias->data<const float>();
  }
  a.y = out.data<float>();
  a.ldy = out.stride(0);
  a.x = x.data<const float>();
  a.ldx = x.stride(0);
  a.w = w.data();
  a.wtype = w.dtype();
  // Block types are stored whole rows back to back; plain types may have a row stride.
  a.w_row_bytes = is_quantized(w.dtype())
                      ? w.row_bytes()
                      : w.stride(0) * static_cast<int64_t>(element_size(w.dtype()));
  a.M = M;
  a.N = N;
  a.K = K;
  cpu::linear(a);
}

}  // namespace llmk::ops
