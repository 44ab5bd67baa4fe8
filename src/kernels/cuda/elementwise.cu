// Element-wise add and scale: maps over rows (kernels/cuda/map_rows.cuh).
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/map_rows.cuh"

namespace llmk::cuda {

namespace {

struct Add {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct Scale {
  float s;
  __device__ float operator()(float x) const { return x * s; }
};

}  // namespace

void add(DType dt, void* out, int64_t out_ld, const void* a, int64_t a_ld, const void* b,
         int64_t b_ld, int64_t rows, int64_t D) {
  with_float_type(dt, [&](auto t) {
    using T = decltype(t);
    const MapRows<T, 2> m{
        static_cast<T*>(out), out_ld, {static_cast<const T*>(a), static_cast<const T*>(b)},
        {a_ld, b_ld},         rows,   D};
    map_rows("add", m, Add{});
  });
}

void scale(DType dt, void* x, int64_t x_ld, int64_t rows, int64_t D, float s) {
  with_float_type(dt, [&](auto t) {
    using T = decltype(t);
    const MapRows<T, 1> m{static_cast<T*>(x), x_ld, {static_cast<const T*>(x)}, {x_ld}, rows, D};
    map_rows("scale", m, Scale{s});
  });
}

}  // namespace llmk::cuda
