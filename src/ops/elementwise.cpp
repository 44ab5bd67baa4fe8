#include "kernels/cpu/elementwise.h"

#include <cstring>

#include "kernels/cpu/softmax.h"
#include "ops/check.h"
#include "ops/ops.h"

namespace llmk::ops {

using namespace detail;

namespace {

void require_f32_rows(std::string_view op, std::string_view name, const Tensor& t) {
  require_cpu(op, name, t);
  require_dtype(op, name, t, DType::F32);
  require_last_dim_contiguous(op, name, t);
}

int64_t last_dim(const Tensor& t) { return t.ndim() == 0 ? 1 : t.dim(-1); }

}  // namespace

void add(Tensor& out, const Tensor& a, const Tensor& b) {
  constexpr std::string_view op = "add";
  require_f32_rows(op, "out", out);
  require_f32_rows(op, "a", a);
  require_f32_rows(op, "b", b);
  LLMK_CHECK(a.shape() == b.shape(), "ops::add: a is {} but b is {}: shapes differ", a.str(),
             b.str());
  require_shape(op, "out", out, a.shape());
  require_no_partial_overlap(op, "out", out, "a", a);
  require_no_partial_overlap(op, "out", out, "b", b);
  const int64_t D = last_dim(a);
  for_each_row_run<3>({&out, &a, &b}, [&](auto p, int64_t rows, auto ld) {
    cpu::add(p[0], ld[0], p[1], ld[1], p[2], ld[2], rows, D);
  });
}

void scale(Tensor& x, float s) {
  constexpr std::string_view op = "scale";
  require_f32_rows(op, "x", x);
  const int64_t D = last_dim(x);
  for_each_row_run<1>({&x},
                      [&](auto p, int64_t rows, auto ld) { cpu::scale(p[0], ld[0], rows, D, s); });
}

void softmax(Tensor& out, const Tensor& x) {
  constexpr std::string_view op = "softmax";
  require_f32_rows(op, "out", out);
  require_f32_rows(op, "x", x);
  LLMK_CHECK(x.ndim() >= 1, "ops::softmax: x is {} but needs at least one dimension", x.str());
  require_shape(op, "out", out, x.shape());
  require_no_partial_overlap(op, "out", out, "x", x);
  const int64_t N = x.dim(-1);
  if (N == 0) return;
  for_each_row_run<2>({&out, &x}, [&](auto p, int64_t rows, auto ld) {
    cpu::softmax(p[0], ld[0], p[1], ld[1], rows, N);
  });
}

void copy(Tensor& dst, const Tensor& src) {
  constexpr std::string_view op = "copy";
  require_cpu(op, "dst", dst);
  require_cpu(op, "src", src);
  LLMK_CHECK(dst.shape() == src.shape(), "ops::copy: dst is {} but src is {}: shapes differ",
             dst.str(), src.str());
  require_disjoint(op, "dst", dst, "src", src);
  if (is_quantized(dst.dtype()) || is_quantized(src.dtype())) {
    LLMK_CHECK(dst.dtype() == src.dtype(),
               "ops::copy: cannot convert {} to {}; block types only copy to themselves", src.str(),
               dst.str());
    LLMK_CHECK(dst.is_contiguous() && src.is_contiguous(),
               "ops::copy: block-type copies need contiguous dst and src ({} <- {})", dst.str(),
               src.str());
    std::memcpy(dst.data(), src.data(), static_cast<size_t>(src.nbytes()));
    return;
  }
  LLMK_CHECK(cpu::copy_supports(dst.dtype(), src.dtype()),
             "ops::copy: cannot convert {} to {} (f32/f16/bf16 convert; other dtypes only copy "
             "to themselves)",
             src.str(), dst.str());
  cpu::copy(dst.data(), dst.dtype(), dst.strides().data(), src.data(), src.dtype(),
            src.strides().data(), dst.shape().data(), dst.ndim());
}

}  // namespace llmk::ops
