#include "kernels/cpu/matmul.h"
#include "ops/check.h"
#include "ops/ops.h"

#ifdef LLMK_HAS_CUDA
#include "kernels/cuda/gemm/linear.h"
#endif

namespace llmk::ops {

using namespace detail;

namespace {

constexpr std::string_view kOp = "linear";

struct Dims {
  int64_t M, N, K;
};

// Shapes, layouts and aliasing, common to both devices; dtypes are checked per device.
Dims check_shapes(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor* bias) {
  require_ndim(kOp, "x", x, 2);
  require_ndim(kOp, "w", w, 2);
  const Dims d{x.dim(0), w.dim(0), x.dim(1)};
  LLMK_CHECK(w.dim(1) == d.K, "ops::linear: x is {} but w is {}: inner dims differ", x.str(),
             w.str());
  require_shape(kOp, "out", out, {d.M, d.N});
  require_last_dim_contiguous(kOp, "x", x);
  require_last_dim_contiguous(kOp, "w", w);
  require_last_dim_contiguous(kOp, "out", out);
  require_disjoint(kOp, "out", out, "x", x);
  require_disjoint(kOp, "out", out, "w", w);
  if (bias) {
    require_shape(kOp, "bias", *bias, {d.N});
    require_last_dim_contiguous(kOp, "bias", *bias);
    require_disjoint(kOp, "out", out, "bias", *bias);
  }
  return d;
}

#ifdef LLMK_HAS_CUDA
void require_bf16_or_f32(std::string_view name, const Tensor& t) {
  LLMK_CHECK(t.dtype() == DType::BF16 || t.dtype() == DType::F32,
             "ops::linear: {} is {} but must be bf16 or f32 on CUDA", name, t.str());
}

// Rows of a matrix with more than one row must not overlap: the row stride covers a row.
void require_rows_apart(std::string_view name, const Tensor& t) {
  LLMK_CHECK(t.dim(0) <= 1 || t.stride(0) >= t.dim(1),
             "ops::linear: {} ({}) has row stride {}, less than its {} columns: rows overlap", name,
             t.str(), t.stride(0), t.dim(1));
}

void linear_cuda(Tensor& out, const Tensor& x, const Tensor& w, const Tensor* bias) {
  LLMK_CHECK(!is_quantized(w.dtype()),
             "ops::linear: w is {} on the GPU, but the CUDA linear takes bf16 weights only; "
             "convert block-quantised weights to bf16 at load",
             w.str());
  require_dtype(kOp, "x", x, DType::BF16);
  require_dtype(kOp, "w", w, DType::BF16);
  require_bf16_or_f32("out", out);
  const Dims d = check_shapes(out, x, w, bias);
  require_rows_apart("x", x);
  require_rows_apart("w", w);
  require_rows_apart("out", out);
  cuda::LinearArgs a;
  if (bias) {
    require_bf16_or_f32("bias", *bias);
    a.bias = bias->data();
    a.bias_dtype = bias->dtype();
  }
  a.out = out.data();
  a.out_dtype = out.dtype();
  a.ldo = out.stride(0);
  a.x = x.data();
  a.ldx = x.stride(0);
  a.w = w.data();
  a.ldw = w.stride(0);
  a.M = d.M;
  a.N = d.N;
  a.K = d.K;
  cuda::linear(a);
}
#endif

}  // namespace

void linear(Tensor& out, const Tensor& x, const Tensor& w, const Tensor* bias) {
  const bool cuda = bias ? on_cuda(kOp, {{"out", &out}, {"x", &x}, {"w", &w}, {"bias", bias}})
                         : on_cuda(kOp, {{"out", &out}, {"x", &x}, {"w", &w}});
  if (cuda) {
#ifdef LLMK_HAS_CUDA
    linear_cuda(out, x, w, bias);
#endif
    return;
  }
  require_dtype(kOp, "x", x, DType::F32);
  require_ndim(kOp, "w", w, 2);
  LLMK_CHECK(cpu::linear_supports(w.dtype()), "ops::linear: w is {}: dtype {} is not supported",
             w.str(), dtype_name(w.dtype()));
  require_dtype(kOp, "out", out, DType::F32);
  const Dims d = check_shapes(out, x, w, bias);
  cpu::LinearArgs a;
  if (bias) {
    require_dtype(kOp, "bias", *bias, DType::F32);
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
  a.M = d.M;
  a.N = d.N;
  a.K = d.K;
  cpu::linear(a);
}

}  // namespace llmk::ops
