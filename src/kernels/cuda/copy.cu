// Strided copies with dtype conversion. The host merges the index space down to as few
// dimensions as the strides allow; the kernel walks the last dimension with consecutive threads
// (coalesced where its stride is 1) and the outer dimensions with grid rows.
#include <algorithm>

#include "kernels/cuda/copy.h"
#include "kernels/cuda/vec.cuh"

namespace llmk::cuda {

namespace {

struct CopyDims {
  int ndim;  // >= 1; dimension ndim - 1 is walked by threads
  int64_t shape[kMaxCopyDims];
  int64_t dst_stride[kMaxCopyDims];
  int64_t src_stride[kMaxCopyDims];
};

// Same-dtype copies move raw bits of the element's size; conversions go through fp32.
template <class TD, class TS>
__device__ __forceinline__ TD convert(TS v) {
  if constexpr (std::is_same_v<TD, TS>) {
    return v;
  } else {
    return from_float<TD>(to_float(v));
  }
}

template <class TD, class TS>
__global__ void copy_kernel(TD* dst, const TS* src, const CopyDims d, int64_t rows) {
  const int last = d.ndim - 1;
  const int64_t n = d.shape[last];
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    int64_t doff = 0, soff = 0, rem = r;
    for (int k = last - 1; k >= 0; --k) {
      const int64_t i = rem % d.shape[k];
      rem /= d.shape[k];
      doff += i * d.dst_stride[k];
      soff += i * d.src_stride[k];
    }
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      dst[doff + i * d.dst_stride[last]] = convert<TD>(src[soff + i * d.src_stride[last]]);
    }
  }
}

template <class TD, class TS>
void launch(void* dst, const void* src, const CopyDims& d) {
  int64_t rows = 1;
  for (int k = 0; k + 1 < d.ndim; ++k) rows *= d.shape[k];
  const int64_t n = d.shape[d.ndim - 1];
  constexpr int kThreads = 256;
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(ceil_div(n, kThreads), 4096)),
                  static_cast<unsigned>(std::min(rows, kMaxGridY)));
  copy_kernel<TD, TS><<<grid, kThreads, 0, current_stream()>>>(
      static_cast<TD*>(dst), static_cast<const TS*>(src), d, rows);
}

}  // namespace

bool copy(void* dst, DType dst_type, const int64_t* dst_strides, const void* src, DType src_type,
          const int64_t* src_strides, const int64_t* shape, int ndim) {
  const bool convertible = dst_type == src_type
                               ? !is_quantized(dst_type)
                               : is_float_type(dst_type) && is_float_type(src_type);
  if (!convertible) return false;
  for (int k = 0; k < ndim; ++k) {
    if (shape[k] == 0) return true;
  }
  // Drop dimensions of size 1, then merge neighbours whose strides chain on both sides.
  CopyDims d{};
  d.ndim = 0;
  for (int k = 0; k < ndim; ++k) {
    if (shape[k] == 1) continue;
    if (d.ndim > 0) {
      const int j = d.ndim - 1;
      if (d.dst_stride[j] == dst_strides[k] * shape[k] &&
          d.src_stride[j] == src_strides[k] * shape[k]) {
        d.shape[j] *= shape[k];
        d.dst_stride[j] = dst_strides[k];
        d.src_stride[j] = src_strides[k];
        continue;
      }
    }
    if (d.ndim == kMaxCopyDims) return false;
    d.shape[d.ndim] = shape[k];
    d.dst_stride[d.ndim] = dst_strides[k];
    d.src_stride[d.ndim] = src_strides[k];
    ++d.ndim;
  }
  if (d.ndim == 0) {  // a single element
    d.ndim = 1;
    d.shape[0] = 1;
    d.dst_stride[0] = d.src_stride[0] = 1;
  }
  if (dst_type == src_type) {
    const size_t es = element_size(dst_type);
    if (d.ndim == 1 && d.dst_stride[0] == 1 && d.src_stride[0] == 1) {
      LLMK_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(d.shape[0]) * es,
                                      cudaMemcpyDeviceToDevice, current_stream()));
      return true;
    }
    switch (es) {
      case 1:
        launch<uint8_t, uint8_t>(dst, src, d);
        break;
      case 2:
        launch<uint16_t, uint16_t>(dst, src, d);
        break;
      case 4:
        launch<uint32_t, uint32_t>(dst, src, d);
        break;
      default:
        launch<uint64_t, uint64_t>(dst, src, d);
        break;
    }
  } else {
    with_float_type(dst_type, [&](auto td) {
      with_float_type(src_type, [&](auto ts) { launch<decltype(td), decltype(ts)>(dst, src, d); });
    });
  }
  check_launch("copy");
  return true;
}

}  // namespace llmk::cuda
