#include "kernels/cpu/activation.h"

#include "ops/check.h"
#include "ops/linear_args.h"
#include "ops/ops.h"

#ifdef LLMK_HAS_CUDA
#include "kernels/cuda/activation.h"
#endif

namespace llmk::ops {

using namespace detail;

void gated_act(Tensor& out, const Tensor& gate, const Tensor& up, Activation act) {
  constexpr std::string_view op = "gated_act";
  const bool cuda = on_cuda(op, {{"out", &out}, {"gate", &gate}, {"up", &up}});
  [[maybe_unused]] const DType dt =
      require_activations(op, cuda, {{"out", &out}, {"gate", &gate}, {"up", &up}});
  for (const auto& [name, t] :
       {NamedTensor{"out", &out}, NamedTensor{"gate", &gate}, NamedTensor{"up", &up}}) {
    require_last_dim_contiguous(op, name, *t);
  }
  require_ndim(op, "gate", gate, 2);
  require_shape(op, "up", up, gate.shape());
  require_shape(op, "out", out, gate.shape());
  require_no_partial_overlap(op, "out", out, "gate", gate);
  require_no_partial_overlap(op, "out", out, "up", up);
  const int64_t F = gate.dim(-1);
  if (cuda) {
#ifdef LLMK_HAS_CUDA
    for_each_row_run_raw<3>({&out, &gate, &up}, [&](auto p, int64_t rows, auto ld) {
      cuda::gated_act(dt, p[0], ld[0], p[1], ld[1], p[2], ld[2], rows, F, cuda_activation(act));
    });
#endif
    return;
  }
  const auto kind = act == Activation::SiLU ? cpu::Activation::SiLU : cpu::Activation::GeluTanh;
  for_each_row_run<3>({&out, &gate, &up}, [&](auto p, int64_t rows, auto ld) {
    cpu::gated_act(p[0], ld[0], p[1], ld[1], p[2], ld[2], rows, F, kind);
  });
}

}  // namespace llmk::ops
