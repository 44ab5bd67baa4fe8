#include "kernels/cpu/matmul.h"
#include "kernels/quant_layout.h"
#include "ops/check.h"
#include "ops/linear_args.h"
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

// Shapes, layouts and aliasing, common to both devices; dtypes are checked per device. A gated
// out (one-row fusions) holds half the columns: act(gate) * up of a stacked gate|up w.
Dims check_shapes(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor* bias,
                  bool gated_out = false) {
  require_ndim(kOp, "x", x, 2);
  require_ndim(kOp, "w", w, 2);
  const Dims d{x.dim(0), w.dim(0), x.dim(1)};
  LLMK_CHECK(w.dim(1) == d.K, "ops::linear: x is {} but w is {}: inner dims differ", x.str(),
             w.str());
  LLMK_CHECK(!gated_out || d.N % 2 == 0,
             "ops::linear: w is {}: a stacked gate|up needs an even number of rows", w.str());
  require_shape(kOp, "out", out, {d.M, gated_out ? d.N / 2 : d.N});
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
void require_float_type(std::string_view name, const Tensor& t) {
  LLMK_CHECK(is_float_type(t.dtype()), "ops::linear: {} is {} but must be bf16, f16 or f32 on CUDA",
             name, t.str());
}

// Rows of a matrix with more than one row must not overlap: the row stride covers a row.
void require_rows_apart(std::string_view name, const Tensor& t) {
  LLMK_CHECK(t.dim(0) <= 1 || t.stride(0) >= t.dim(1),
             "ops::linear: {} ({}) has row stride {}, less than its {} columns: rows overlap", name,
             t.str(), t.stride(0), t.dim(1));
}
#endif

}  // namespace

#ifdef LLMK_HAS_CUDA
namespace detail {

// Checks the CUDA operands and returns the launcher's arguments.
cuda::LinearArgs linear_cuda_args(Tensor& out, const Tensor& x, const Tensor& w, const Tensor* bias,
                                  bool gated_out) {
  LLMK_CHECK(!is_quantized(w.dtype()),
             "ops::linear: w is {} on the GPU, but the CUDA linear takes bf16, f16 or f32 "
             "weights only; convert block-quantised weights at load",
             w.str());
  require_float_type("x", x);
  LLMK_CHECK(w.dtype() == x.dtype(), "ops::linear: w is {} but x is {}: they must share one dtype",
             w.str(), x.str());
  require_float_type("out", out);
  const Dims d = check_shapes(out, x, w, bias, gated_out);
  require_rows_apart("x", x);
  require_rows_apart("w", w);
  require_rows_apart("out", out);
  cuda::LinearArgs a;
  if (bias) {
    require_float_type("bias", *bias);
    a.bias = bias->data();
    a.bias_dtype = bias->dtype();
  }
  a.out = out.data();
  a.out_dtype = out.dtype();
  a.ldo = out.stride(0);
  a.in_dtype = x.dtype();
  a.x = x.data();
  a.ldx = x.stride(0);
  a.w = w.data();
  a.ldw = w.stride(0);
  a.M = d.M;
  a.N = d.N;
  a.K = d.K;
  a.batch_invariant = batch_invariant();
  return a;
}

cuda::QLinearArgs linear_cuda_qargs(Tensor& out, const Tensor& x, const Tensor& w,
                                    const Tensor* bias, bool accumulate, bool gated_out) {
  LLMK_CHECK(qlayout::gpu_keeps(w.dtype()),
             "ops::linear: w is {} on the GPU, but the CUDA linear reads the block types Q4_0, "
             "Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K only; dequantise the others at load",
             w.str());
  LLMK_CHECK(x.dtype() == DType::BF16,
             "ops::linear: w is {} on the GPU, which takes bf16 x, but x is {}", w.str(), x.str());
  LLMK_CHECK(out.dtype() == DType::BF16 || out.dtype() == DType::F32,
             "ops::linear: w is {} on the GPU, which writes a bf16 or f32 out, but out is {}",
             w.str(), out.str());
  // The GPU layout (kernels/quant_layout.h) is of the whole matrix: w must be one, not a view.
  LLMK_CHECK(w.is_contiguous(), "ops::linear: w is {}: a quantised matrix must be contiguous",
             w.str());
  const Dims d = check_shapes(out, x, w, bias, gated_out);
  require_rows_apart("x", x);
  require_rows_apart("out", out);
  cuda::QLinearArgs a;
  if (bias) {
    LLMK_CHECK(bias->dtype() == DType::BF16 || bias->dtype() == DType::F32,
               "ops::linear: bias is {} but must be bf16 or f32 with a quantised w", bias->str());
    a.bias = bias->data();
    a.bias_dtype = bias->dtype();
  }
  a.out = out.data();
  a.out_dtype = out.dtype();
  a.ldo = d.M <= 1 ? d.N : out.stride(0);
  a.x = x.data();
  a.ldx = d.M <= 1 ? d.K : x.stride(0);
  a.w = w.data();
  a.wtype = w.dtype();
  a.M = d.M;
  a.N = d.N;
  a.K = d.K;
  a.accumulate = accumulate;
  return a;
}

}  // namespace detail
#endif

namespace {

void linear_impl(Tensor& out, const Tensor& x, const Tensor& w, const Tensor* bias,
                 bool accumulate) {
  const bool cuda = bias ? on_cuda(kOp, {{"out", &out}, {"x", &x}, {"w", &w}, {"bias", bias}})
                         : on_cuda(kOp, {{"out", &out}, {"x", &x}, {"w", &w}});
  if (cuda) {
#ifdef LLMK_HAS_CUDA
    if (is_quantized(w.dtype())) {
      cuda::qlinear(linear_cuda_qargs(out, x, w, bias, accumulate));
      return;
    }
    cuda::LinearArgs a = linear_cuda_args(out, x, w, bias);
    a.accumulate = accumulate;
    cuda::linear(a);
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
  a.accumulate = accumulate;
  cpu::linear(a);
}

}  // namespace

void linear(Tensor& out, const Tensor& x, const Tensor& w, const Tensor* bias) {
  linear_impl(out, x, w, bias, false);
}

void linear_add(Tensor& out, const Tensor& x, const Tensor& w, const Tensor* bias) {
  linear_impl(out, x, w, bias, true);
}

void linear_gated(Tensor& out, const Tensor& x, const Tensor& w, Activation act, Tensor& scratch,
                  const Tensor* bias) {
  constexpr std::string_view op = "linear_gated";
  require_ndim(op, "w", w, 2);
  require_ndim(op, "out", out, 2);
  LLMK_CHECK(w.dim(0) % 2 == 0, "ops::linear_gated: w is {}: a stacked gate|up needs even rows",
             w.str());
  const int64_t F = w.dim(0) / 2;
  require_shape(op, "out", out, {x.dim(0), F});
#ifdef LLMK_HAS_CUDA
  // One row: the one-row kernel (qgemv over quantised weights) with the activation in its
  // epilogue, where it takes the operands.
  if (x.defined() && x.device() == Device::CUDA && x.ndim() == 2 && x.dim(0) == 1) {
    const bool cuda = on_cuda(op, {{"out", &out}, {"x", &x}, {"w", &w}, {"scratch", &scratch}});
    if (is_quantized(w.dtype())) {
      cuda::QLinearArgs a = linear_cuda_qargs(out, x, w, bias, false, true);
      a.gated = true;
      a.act = cuda_activation(act);
      if (cuda && cuda::qlinear_row(a)) return;
    } else {
      const cuda::LinearArgs a = linear_cuda_args(out, x, w, bias, true);
      if (cuda && cuda::linear_gated_row(a, cuda_activation(act))) return;
    }
  }
#endif
  linear(scratch, x, w, bias);
  gated_act(out, scratch.slice(1, 0, F), scratch.slice(1, F, 2 * F), act);
}

}  // namespace llmk::ops
