#include "kernels/cpu/rope.h"

#include <cmath>

#include "ops/check.h"
#include "ops/ops.h"

#ifdef LLMK_HAS_CUDA
#include "kernels/cuda/rope.h"
#endif

namespace llmk::ops {

using namespace detail;

void rope(Tensor& x, const Tensor& positions, const RopeParams& p) {
  constexpr std::string_view op = "rope";
  const bool cuda =
      p.freq_factors
          ? on_cuda(op, {{"x", &x}, {"positions", &positions}, {"freq_factors", p.freq_factors}})
          : on_cuda(op, {{"x", &x}, {"positions", &positions}});
  require_dtype(op, "x", x, cuda ? DType::BF16 : DType::F32);
  require_ndim(op, "x", x, 3);
  require_last_dim_contiguous(op, "x", x);
  require_dtype(op, "positions", positions, DType::I32);
  const int64_t T = x.dim(0), H = x.dim(1), D = x.dim(2);
  require_shape(op, "positions", positions, {T});
  const int64_t rot = p.rot_dim == 0 ? D : p.rot_dim;
  LLMK_CHECK(rot > 0 && rot % 2 == 0 && rot <= D,
             "ops::rope: rot_dim = {} must be even and in (0, head dim {}] (x is {})", p.rot_dim, D,
             x.str());
  LLMK_CHECK(p.theta > 0.0f && std::isfinite(p.theta), "ops::rope: theta = {} must be positive",
             p.theta);
  LLMK_CHECK(std::isfinite(p.freq_scale) && p.freq_scale > 0.0f,
             "ops::rope: freq_scale = {} must be positive", p.freq_scale);
  if (p.freq_factors) {
    const Tensor& f = *p.freq_factors;
    require_dtype(op, "freq_factors", f, DType::F32);
    require_shape(op, "freq_factors", f, {rot / 2});
    require_last_dim_contiguous(op, "freq_factors", f);
    require_disjoint(op, "x", x, "freq_factors", f);
  }
  require_disjoint(op, "x", x, "positions", positions);
  if (cuda) {
#ifdef LLMK_HAS_CUDA
    LLMK_CHECK(rot <= 2 * cuda::kMaxRopePairs,
               "ops::rope: rot_dim {} is over the {} the CUDA kernel takes (x is {})", rot,
               2 * cuda::kMaxRopePairs, x.str());
    cuda::RopeArgs a;
    a.x = x.data();
    a.T = T;
    a.H = H;
    a.D = D;
    a.ld_t = x.stride(0);
    a.ld_h = x.stride(1);
    a.positions = positions.data<const int32_t>();
    a.pos_stride = positions.stride(0);
    a.rot_dim = static_cast<int>(rot);
    a.theta = p.theta;
    a.half_split = p.layout == RopeLayout::HalfSplit;
    a.freq_scale = p.freq_scale;
    a.freq_factors = p.freq_factors ? p.freq_factors->data<const float>() : nullptr;
    cuda::rope(a);
#endif
    return;
  }
  cpu::RopeArgs a;
  if (p.freq_factors) a.freq_factors = p.freq_factors->data<const float>();
  a.x = x.data<float>();
  a.T = T;
  a.H = H;
  a.D = D;
  a.ld_t = x.stride(0);
  a.ld_h = x.stride(1);
  a.positions = positions.data<const int32_t>();
  a.pos_stride = positions.stride(0);
  a.rot_dim = static_cast<int>(rot);
  a.theta = p.theta;
  a.half_split = p.layout == RopeLayout::HalfSplit;
  a.freq_scale = p.freq_scale;
  cpu::rope(a);
}

}  // namespace llmk::ops
