#include "kernels/cpu/argmax.h"

#include <cmath>

#include "kernels/cpu/vec_math.h"

namespace llmk::cpu {

void argmax(int32_t* out, int64_t out_stride, const float* x, int64_t x_ld, int64_t rows,
            int64_t N) {
  detail::parallel_rows(rows, N, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * x_ld;
      int64_t best = 0;
      float best_v = std::isnan(xr[0]) ? -INFINITY : xr[0];
      for (int64_t i = 1; i < N; ++i) {
        if (xr[i] > best_v) {  // false for NaN; strict, so the first of equals stays
          best_v = xr[i];
          best = i;
        }
      }
      out[r * out_stride] = static_cast<int32_t>(best);
    }
  });
}

}  // namespace llmk::cpu
