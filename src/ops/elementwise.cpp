#include "kernels/cpu/elementwise.h"

#include <cstring>

#include "kernels/cpu/softmax.h"
#include "ops/check.h"
#include "ops/ops.h"

#ifdef LLMK_HAS_CUDA
#include "kernels/cuda/copy.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/softmax.h"
#endif

namespace llmk::ops {

using namespace detail;

namespace {

int64_t last_dim(const Tensor& t) { return t.ndim() == 0 ? 1 : t.dim(-1); }

}  // namespace

void add(Tensor& out, const Tensor& a, const Tensor& b) {
  constexpr std::string_view op = "add";
  const bool cuda = on_cuda(op, {{"out", &out}, {"a", &a}, {"b", &b}});
  [[maybe_unused]] const DType dt =
      require_activations(op, cuda, {{"out", &out}, {"a", &a}, {"b", &b}});
  for (const auto& [name, t] :
       {NamedTensor{"out", &out}, NamedTensor{"a", &a}, NamedTensor{"b", &b}}) {
    require_last_dim_contiguous(op, name, *t);
  }
  LLMK_CHECK(a.shape() == b.shape(), "ops::add: a is {} but b is {}: shapes differ", a.str(),
             b.str());
  require_shape(op, "out", out, a.shape());
  require_no_partial_overlap(op, "out", out, "a", a);
  require_no_partial_overlap(op, "out", out, "b", b);
  const int64_t D = last_dim(a);
  if (cuda) {
#ifdef LLMK_HAS_CUDA
    for_each_row_run_raw<3>({&out, &a, &b}, [&](auto p, int64_t rows, auto ld) {
      cuda::add(dt, p[0], ld[0], p[1], ld[1], p[2], ld[2], rows, D);
    });
#endif
    return;
  }
  for_each_row_run<3>({&out, &a, &b}, [&](auto p, int64_t rows, auto ld) {
    cpu::add(p[0], ld[0], p[1], ld[1], p[2], ld[2], rows, D);
  });
}

void scale(Tensor& x, float s) {
  constexpr std::string_view op = "scale";
  const bool cuda = on_cuda(op, {{"x", &x}});
  [[maybe_unused]] const DType dt = require_activations(op, cuda, {{"x", &x}});
  require_last_dim_contiguous(op, "x", x);
  const int64_t D = last_dim(x);
  if (cuda) {
#ifdef LLMK_HAS_CUDA
    for_each_row_run_raw<1>(
        {&x}, [&](auto p, int64_t rows, auto ld) { cuda::scale(dt, p[0], ld[0], rows, D, s); });
#endif
    return;
  }
  for_each_row_run<1>({&x},
                      [&](auto p, int64_t rows, auto ld) { cpu::scale(p[0], ld[0], rows, D, s); });
}

void softmax(Tensor& out, const Tensor& x) {
  constexpr std::string_view op = "softmax";
  const bool cuda = on_cuda(op, {{"out", &out}, {"x", &x}});
  for (const auto& [name, t] : {NamedTensor{"out", &out}, NamedTensor{"x", &x}}) {
    if (cuda) {
      LLMK_CHECK(t->dtype() == DType::F32 || t->dtype() == DType::BF16,
                 "ops::softmax: {} is {} but must be f32 or bf16", name, t->str());
    } else {
      require_dtype(op, name, *t, DType::F32);
    }
    require_last_dim_contiguous(op, name, *t);
  }
  LLMK_CHECK(x.ndim() >= 1, "ops::softmax: x is {} but needs at least one dimension", x.str());
  require_shape(op, "out", out, x.shape());
  require_no_partial_overlap(op, "out", out, "x", x);
  const int64_t N = x.dim(-1);
  if (N == 0) return;
  if (cuda) {
#ifdef LLMK_HAS_CUDA
    for_each_row_run_raw<2>({&out, &x}, [&](auto p, int64_t rows, auto ld) {
      cuda::softmax(p[0], out.dtype(), ld[0], p[1], x.dtype(), ld[1], rows, N);
    });
#endif
    return;
  }
  for_each_row_run<2>({&out, &x}, [&](auto p, int64_t rows, auto ld) {
    cpu::softmax(p[0], ld[0], p[1], ld[1], rows, N);
  });
}

void copy(Tensor& dst, const Tensor& src) {
  constexpr std::string_view op = "copy";
  const bool cuda = on_cuda(op, {{"dst", &dst}, {"src", &src}});
  LLMK_CHECK(dst.shape() == src.shape(), "ops::copy: dst is {} but src is {}: shapes differ",
             dst.str(), src.str());
  require_disjoint(op, "dst", dst, "src", src);
  const bool blocks = is_quantized(dst.dtype()) || is_quantized(src.dtype());
  if (blocks) {
    LLMK_CHECK(dst.dtype() == src.dtype(),
               "ops::copy: cannot convert {} to {}; block types only copy to themselves", src.str(),
               dst.str());
    LLMK_CHECK(dst.is_contiguous() && src.is_contiguous(),
               "ops::copy: block-type copies need contiguous dst and src ({} <- {})", dst.str(),
               src.str());
  } else {
    LLMK_CHECK(cpu::copy_supports(dst.dtype(), src.dtype()),
               "ops::copy: cannot convert {} to {} (f32/f16/bf16 convert; other dtypes only copy "
               "to themselves)",
               src.str(), dst.str());
  }
  if (cuda) {
#ifdef LLMK_HAS_CUDA
    if (blocks) {  // contiguous bytes
      const int64_t n = src.nbytes(), one = 1;
      cuda::copy(dst.data(), DType::I8, &one, src.data(), DType::I8, &one, &n, 1);
      return;
    }
    LLMK_CHECK(cuda::copy(dst.data(), dst.dtype(), dst.strides().data(), src.data(), src.dtype(),
                          src.strides().data(), dst.shape().data(), dst.ndim()),
               "ops::copy: {} <- {} needs more than {} dimensions after merging, the most the "
               "CUDA copy takes",
               dst.str(), src.str(), cuda::kMaxCopyDims);
#endif
    return;
  }
  if (blocks) {
    std::memcpy(dst.data(), src.data(), static_cast<size_t>(src.nbytes()));
    return;
  }
  cpu::copy(dst.data(), dst.dtype(), dst.strides().data(), src.data(), src.dtype(),
            src.strides().data(), dst.shape().data(), dst.ndim());
}

}  // namespace llmk::ops
