#include "kernels/cpu/rms_norm.h"

#include "kernels/cpu/elementwise.h"
#include "ops/check.h"
#include "ops/ops.h"

#ifdef LLMK_HAS_CUDA
#include "kernels/cuda/rms_norm.h"
#endif

namespace llmk::ops {

using namespace detail;

namespace {

// Checks shared by rms_norm and add_rms_norm once the device is known; returns D.
int64_t check_norm(std::string_view op, bool cuda, const Tensor& out, const Tensor& x,
                   const Tensor& w, float eps) {
  require_activations(op, cuda, {{"x", &x}, {"out", &out}});
  require_dtype(op, "w", w, DType::F32);
  LLMK_CHECK(x.ndim() >= 1, "ops::{}: x is {} but needs at least one dimension", op, x.str());
  const int64_t D = x.dim(-1);
  LLMK_CHECK(D > 0, "ops::{}: x is {}: the normalised dimension is empty", op, x.str());
  require_shape(op, "out", out, x.shape());
  require_shape(op, "w", w, {D});
  require_last_dim_contiguous(op, "x", x);
  require_last_dim_contiguous(op, "out", out);
  require_last_dim_contiguous(op, "w", w);
  LLMK_CHECK(eps >= 0.0f, "ops::{}: eps = {} must be >= 0", op, eps);
  require_disjoint(op, "out", out, "w", w);
  return D;
}

}  // namespace

void rms_norm(Tensor& out, const Tensor& x, const Tensor& w, float eps, bool add_one) {
  constexpr std::string_view op = "rms_norm";
  const bool cuda = on_cuda(op, {{"out", &out}, {"x", &x}, {"w", &w}});
  const int64_t D = check_norm(op, cuda, out, x, w, eps);
  require_no_partial_overlap(op, "out", out, "x", x);
  if (cuda) {
#ifdef LLMK_HAS_CUDA
    if (x.ndim() == 3) {  // [A, B, D] with any strides (QK-norm over heads): one launch
      if (x.numel() == 0) return;
      cuda::rms_norm_2d(x.dtype(), out.data(), out.stride(0), out.stride(1), x.data(), x.stride(0),
                        x.stride(1), x.dim(0), x.dim(1), D, w.data<const float>(), eps, add_one);
      return;
    }
    for_each_row_run_raw<2>({&out, &x}, [&](auto p, int64_t rows, auto ld) {
      cuda::rms_norm(x.dtype(), p[0], ld[0], p[1], ld[1], rows, D, w.data<const float>(), eps,
                     add_one);
    });
#endif
    return;
  }
  for_each_row_run<2>({&out, &x}, [&](auto p, int64_t rows, auto ld) {
    cpu::rms_norm(p[0], ld[0], p[1], ld[1], rows, D, w.data<const float>(), eps, add_one);
  });
}

void add_rms_norm(Tensor& x, const Tensor& delta, Tensor& out, const Tensor& w, float eps,
                  bool add_one) {
  constexpr std::string_view op = "add_rms_norm";
  const bool has_delta = delta.defined();
  const bool cuda = has_delta
                        ? on_cuda(op, {{"x", &x}, {"delta", &delta}, {"out", &out}, {"w", &w}})
                        : on_cuda(op, {{"x", &x}, {"out", &out}, {"w", &w}});
  require_ndim(op, "x", x, 2);
  const int64_t D = check_norm(op, cuda, out, x, w, eps);
  require_disjoint(op, "out", out, "x", x);
  require_disjoint(op, "x", x, "w", w);
  if (has_delta) {
    require_dtype(op, "delta", delta, x.dtype());
    require_shape(op, "delta", delta, x.shape());
    require_last_dim_contiguous(op, "delta", delta);
    require_disjoint(op, "out", out, "delta", delta);
    require_no_partial_overlap(op, "x", x, "delta", delta);
  }
  const int64_t T = x.dim(0);
  if (T == 0) return;
  if (cuda) {
#ifdef LLMK_HAS_CUDA
    cuda::add_rms_norm(x.dtype(), x.data(), x.stride(0), has_delta ? delta.data() : nullptr,
                       has_delta ? delta.stride(0) : 0, out.data(), out.stride(0), T, D,
                       w.data<const float>(), eps, add_one);
#endif
    return;
  }
  float* xp = x.data<float>();
  if (has_delta) {
    cpu::add(xp, x.stride(0), xp, x.stride(0), delta.data<const float>(), delta.stride(0), T, D);
  }
  cpu::rms_norm(out.data<float>(), out.stride(0), xp, x.stride(0), T, D, w.data<const float>(), eps,
                add_one);
}

}  // namespace llmk::ops
