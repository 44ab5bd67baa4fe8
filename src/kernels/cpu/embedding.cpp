#include "kernels/cpu/embedding.h"

#include "kernels/cpu/dequant.h"
#include "kernels/cpu/vec_math.h"

namespace llmk::cpu {

void embedding(float* out, int64_t out_ld, const void* table, DType dtype, int64_t row_bytes,
               int64_t D, const int32_t* ids, int64_t ids_stride, int64_t T) {
  const auto* base = static_cast<const uint8_t*>(table);
  detail::parallel_rows(T, D, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t id = ids[t * ids_stride];
      dequantize_row(dtype, base + id * row_bytes, out + t * out_ld, D);
    }
  });
}

}  // namespace llmk::cpu
