#include "kernels/cpu/elementwise.h"

#include <cstring>

#include "core/error.h"
#include "core/half.h"
#include "kernels/cpu/vec_math.h"

namespace llmk::cpu {

void add(float* out, int64_t out_ld, const float* a, int64_t a_ld, const float* b, int64_t b_ld,
         int64_t rows, int64_t D) {
  detail::parallel_rows(rows, D, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* o = out + r * out_ld;
      const float* x = a + r * a_ld;
      const float* y = b + r * b_ld;
      for (int64_t i = 0; i < D; ++i) o[i] = x[i] + y[i];
    }
  });
}

void scale(float* x, int64_t x_ld, int64_t rows, int64_t D, float s) {
  detail::parallel_rows(rows, D, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* v = x + r * x_ld;
      for (int64_t i = 0; i < D; ++i) v[i] *= s;
    }
  });
}

namespace {

float load_as_f32(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::F32:
      return static_cast<const float*>(p)[i];
    case DType::F16:
      return fp16_to_float(static_cast<const uint16_t*>(p)[i]);
    default:
      return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
  }
}

void store_f32(void* p, DType t, int64_t i, float v) {
  switch (t) {
    case DType::F32:
      static_cast<float*>(p)[i] = v;
      break;
    case DType::F16:
      static_cast<uint16_t*>(p)[i] = float_to_fp16(v);
      break;
    default:
      static_cast<uint16_t*>(p)[i] = float_to_bf16(v);
      break;
  }
}

// One innermost row of n elements.
void copy_row(char* dst, DType dt, int64_t ds, const char* src, DType st, int64_t ss, int64_t n) {
  if (dt == st) {
    const auto es = static_cast<int64_t>(element_size(dt));
    if (ds == 1 && ss == 1) {
      std::memcpy(dst, src, static_cast<size_t>(n * es));
    } else {
      for (int64_t i = 0; i < n; ++i) {
        std::memcpy(dst + i * ds * es, src + i * ss * es, static_cast<size_t>(es));
      }
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i) store_f32(dst, dt, i * ds, load_as_f32(src, st, i * ss));
}

}  // namespace

bool copy_supports(DType dst_type, DType src_type) {
  if (dst_type == src_type) return !is_quantized(dst_type);
  return is_float_type(dst_type) && is_float_type(src_type);
}

void copy(void* dst, DType dst_type, const int64_t* dst_strides, const void* src, DType src_type,
          const int64_t* src_strides, const int64_t* shape, int ndim) {
  LLMK_CHECK(copy_supports(dst_type, src_type), "copy: cannot copy {} to {}", dtype_name(src_type),
             dtype_name(dst_type));
  int64_t numel = 1;
  for (int i = 0; i < ndim; ++i) numel *= shape[i];
  if (numel == 0) return;
  const auto des = static_cast<int64_t>(element_size(dst_type));
  const auto ses = static_cast<int64_t>(element_size(src_type));
  if (ndim == 0) {
    copy_row(static_cast<char*>(dst), dst_type, 1, static_cast<const char*>(src), src_type, 1, 1);
    return;
  }
  // Rows are the last dimension; the outer index space is walked by a counter per row.
  const int64_t n = shape[ndim - 1];
  const int64_t rows = numel / n;
  detail::parallel_rows(rows, n, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      int64_t rem = r, doff = 0, soff = 0;
      for (int d = ndim - 2; d >= 0; --d) {
        const int64_t i = rem % shape[d];
        rem /= shape[d];
        doff += i * dst_strides[d];
        soff += i * src_strides[d];
      }
      copy_row(static_cast<char*>(dst) + doff * des, dst_type, dst_strides[ndim - 1],
               static_cast<const char*>(src) + soff * ses, src_type, src_strides[ndim - 1], n);
    }
  });
}

}  // namespace llmk::cpu
