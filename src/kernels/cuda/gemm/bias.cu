#include <algorithm>

#include "kernels/cuda/gemm/bias.h"
#include "kernels/cuda/vec.cuh"

namespace llmk::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxRowBlocks = 65535;  // gridDim.y limit; blocks stride over the rest

// One thread per column: its bias element is read once and added to every row it visits.
template <typename TOut, typename TBias, bool kAssign>
__global__ void add_bias_rows_kernel(TOut* __restrict__ out, int64_t ldo,
                                     const TBias* __restrict__ bias, int64_t M, int64_t N) {
  const int64_t n = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= N) return;
  const float b = to_float(bias[n]);
  for (int64_t m = blockIdx.y; m < M; m += gridDim.y) {
    TOut& o = out[m * ldo + n];
    o = from_float<TOut>(kAssign ? b : to_float(o) + b);
  }
}

template <typename TOut, typename TBias>
void launch(void* out, int64_t ldo, const void* bias, int64_t M, int64_t N, bool assign,
            cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(ceil_div(N, kThreads)),
                  static_cast<unsigned>(std::min(M, kMaxRowBlocks)));
  auto* o = static_cast<TOut*>(out);
  const auto* b = static_cast<const TBias*>(bias);
  if (assign) {
    add_bias_rows_kernel<TOut, TBias, true><<<grid, kThreads, 0, stream>>>(o, ldo, b, M, N);
  } else {
    add_bias_rows_kernel<TOut, TBias, false><<<grid, kThreads, 0, stream>>>(o, ldo, b, M, N);
  }
  check_launch("cuda::add_bias_rows");
}

}  // namespace

bool add_bias_rows(void* out, DType out_dtype, int64_t ldo, const void* bias, DType bias_dtype,
                   int64_t M, int64_t N, bool assign, cudaStream_t stream) {
  if (M == 0 || N == 0) return true;
  if (!is_float_type(out_dtype) || !is_float_type(bias_dtype)) return false;
  with_float_type(out_dtype, [&](auto to) {
    with_float_type(bias_dtype, [&](auto tb) {
      launch<decltype(to), decltype(tb)>(out, ldo, bias, M, N, assign, stream);
    });
  });
  return true;
}

}  // namespace llmk::cuda
