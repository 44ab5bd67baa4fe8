#include "kernels/cpu/argmax.h"

#include <cstdint>
#include <limits>

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

}  // namespace llmk::ops
