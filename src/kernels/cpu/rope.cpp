#include "kernels/cpu/rope.h"

#include <cmath>
#include <vector>

#include "kernels/cpu/vec_math.h"

namespace llmk::cpu {

void rope(const RopeArgs& a) {
  const int half = a.rot_dim / 2;
  if (half == 0 || a.T == 0 || a.H == 0) return;
  std::vector<double> inv_freq(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i) {
    double f = std::pow(a.theta, -2.0 * i / a.rot_dim);
    if (a.freq_factors) f /= static_cast<double>(a.freq_factors[i]);
    inv_freq[static_cast<size_t>(i)] = f * a.freq_scale;
  }
  detail::parallel_rows(a.T, a.H * a.rot_dim + 20 * half, [&](int64_t t0, int64_t t1) {
    thread_local std::vector<float> cs;
    cs.resize(static_cast<size_t>(2 * half));
    float* cosv = cs.data();
    float* sinv = cs.data() + half;
    for (int64_t t = t0; t < t1; ++t) {
      const double pos = a.positions[t * a.pos_stride];
      for (int i = 0; i < half; ++i) {
        const double angle = pos * inv_freq[static_cast<size_t>(i)];
        cosv[i] = static_cast<float>(std::cos(angle));
        sinv[i] = static_cast<float>(std::sin(angle));
      }
      for (int64_t h = 0; h < a.H; ++h) {
        float* v = a.x + t * a.ld_t + h * a.ld_h;
        // Pair i is (v[i0], v[i1]): (i, i + half) or (2i, 2i + 1).
        const int64_t step = a.half_split ? 1 : 2;
        const int64_t other = a.half_split ? half : 1;
        for (int i = 0; i < half; ++i) {
          float* p0 = v + i * step;
          float* p1 = p0 + other;
          const float x0 = *p0, x1 = *p1;
          *p0 = x0 * cosv[i] - x1 * sinv[i];
          *p1 = x0 * sinv[i] + x1 * cosv[i];
        }
      }
    }
  });
}

}  // namespace llmk::cpu
