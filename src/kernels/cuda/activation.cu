// Gated activations: an element-wise map over rows (kernels/cuda/map_rows.cuh).
#include "kernels/cuda/activation.cuh"
#include "kernels/cuda/activation.h"
#include "kernels/cuda/map_rows.cuh"

namespace llmk::cuda {

void gated_act(DType dt, void* out, int64_t out_ld, const void* gate, int64_t gate_ld,
               const void* up, int64_t up_ld, int64_t rows, int64_t F, Activation act) {
  with_float_type(dt, [&](auto t) {
    using T = decltype(t);
    const MapRows<T, 2> a{
        static_cast<T*>(out), out_ld, {static_cast<const T*>(gate), static_cast<const T*>(up)},
        {gate_ld, up_ld},     rows,   F};
    if (act == Activation::SiLU) {
      map_rows("gated_act", a, SiluMul{});
    } else {
      map_rows("gated_act", a, GeluTanhMul{});
    }
  });
}

}  // namespace llmk::cuda
