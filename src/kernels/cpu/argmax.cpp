#include "kernels/cpu/argmax.h"

#include <cmath>

#include "kernels/cpu/vec_math.h"
#include "kernels/gumbel.h"

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

void sample_gumbel(int32_t* out, const float* x, int64_t x_ld, int64_t rows, int64_t N,
                   const float* temperature, const float* min_p, const uint64_t* seed) {
  argmax(out, 1, x, x_ld, rows, N);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * x_ld;
    const float top = xr[out[r]];
    if (!(top > -INFINITY)) continue;  // nothing finite to draw from: the argmax stands
    const float inv_t = 1.0f / temperature[r];
    const float floor = gumbel::floor_of(top, temperature[r], min_p[r]);
    float best = -INFINITY;
    for (int64_t i = 0; i < N; ++i) {
      if (!(xr[i] >= floor) || !(xr[i] > -INFINITY)) continue;
      const float k = gumbel::key(xr[i], inv_t, gumbel::noise(seed[r], i));
      if (k > best) {
        best = k;
        out[r] = static_cast<int32_t>(i);
      }
    }
  }
}

}  // namespace llmk::cpu
