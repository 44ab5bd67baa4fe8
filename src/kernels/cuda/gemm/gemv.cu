// out[N] = w[N, K] . x[K] (+ bias) for one row: see gemv.h.
//
// Block of 4 warps; warp w of block b owns rows (4 b + w) * kRows .. + kRows - 1 (kRows = 2). Lane
// l takes the 16-byte chunks l, l + 32, ... of every row it owns (and of x), four chunks per row
// at a time with all their loads issued before any product, so each lane has 4 x kRows 16-byte
// weight loads in flight; then the warp sums its lanes by shuffles and lane 0 writes the row
// (+ bias). Weights are read once: loaded with no L1 allocation. x (at most a few KB) stays in L1.
//
// Gated output: warp w of block b owns output j = 4 b + w, its two rows the gate row j and the up
// row F + j, so the epilogue applies the activation and writes one value.
//
// RoPE epilogue (a Q|K|V projection): warp u owns pair i = u % (D/2) of head u / (D/2), the rows
// RoPE rotates together ((i, i + D/2), or (2i, 2i + 1) for adjacent pairs), so the epilogue
// rotates them (value heads: as they are) and writes key and value heads to the cache row too.
//
// Programmatic dependent launch (sm_90): the grid may start while the previous kernel finishes.
// Weights do not depend on it, so each warp issues its first group of weight loads, then waits
// for the previous kernel (griddepcontrol.wait) before reading x or writing out. The next kernel
// is released at that wait, before or after it (cuda::release_dependents_first).
#include <algorithm>
#include <type_traits>

#include "kernels/cuda/gemm/gemv.h"
#include "kernels/cuda/gemm/pair_epilogue.cuh"
#include "kernels/cuda/vec.cuh"

namespace llmk::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarp;
constexpr int kRows = 2;   // rows per warp
constexpr int kGroup = 4;  // chunks per lane and row in flight

// Sum of the 8 products of two chunks of 8 elements of TIn (bf16 or fp16).
template <typename TIn>
__device__ __forceinline__ float dot8(const uint4& a, const uint4& b, float acc) {
  using Pair = typename PairOf<TIn>::type;
  const auto* pa = reinterpret_cast<const Pair*>(&a);
  const auto* pb = reinterpret_cast<const Pair*>(&b);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 fa = pair_to_float2(pa[i]), fb = pair_to_float2(pb[i]);
    acc = fmaf(fa.x, fb.x, acc);
    acc = fmaf(fa.y, fb.y, acc);
  }
  return acc;
}

// The plain output (Act = void), the gated one (Act = SiluMul or GeluTanhMul) or the RoPE
// epilogue (Act = RopeQkv).
template <typename TIn, typename TOut, typename TBias, class Act>
__global__ void __launch_bounds__(kThreads)
    gemv_kernel(TOut* __restrict__ out, const uint16_t* __restrict__ x,
                const uint16_t* __restrict__ w, int64_t ldw, const TBias* __restrict__ bias, int N,
                int chunks, const GemvRope rope, bool release_first) {
  constexpr bool kPaired = !std::is_void_v<Act>;
  static_assert(kRows == 2, "a gated warp owns a gate row and its up row; a RoPE warp a pair");
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int unit = blockIdx.x * kWarps + warp;  // the warp's output (gated) or row pair
  const int row0 = unit * kRows;
  PairRows p;  // kPaired: the unit's rows
  if constexpr (kPaired) p = pair_rows<Act>(unit, N, rope);
  if (kPaired ? !p.live : row0 >= N) {
    grid_dependency_wait(release_first);
    return;
  }
  int rows[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    // Unpaired: a missing last row re-reads row N - 1, unused.
    rows[r] = kPaired ? p.rows[r] : min(row0 + r, N - 1);
  }
  const uint4* wr[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    wr[r] = reinterpret_cast<const uint4*>(w + static_cast<int64_t>(rows[r]) * ldw);
  }
  const uint4* xv = reinterpret_cast<const uint4*>(x);
  const uint4 zero = make_uint4(0, 0, 0, 0);

  float acc[kRows] = {};
  uint4 wc[kGroup][kRows];
  // The first group's weights, before the wait: they do not depend on the previous kernel.
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
    const int c = lane + g * kWarp;
#pragma unroll
    for (int r = 0; r < kRows; ++r) wc[g][r] = c < chunks ? load_stream(wr[r] + c) : zero;
  }
  grid_dependency_wait(release_first);
  for (int base = 0; base < chunks; base += kGroup * kWarp) {
    uint4 xc[kGroup];
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      const int c = base + lane + g * kWarp;
      xc[g] = c < chunks ? __ldg(xv + c) : zero;
    }
    if (base > 0) {
#pragma unroll
      for (int g = 0; g < kGroup; ++g) {
        const int c = base + lane + g * kWarp;
#pragma unroll
        for (int r = 0; r < kRows; ++r) wc[g][r] = c < chunks ? load_stream(wr[r] + c) : zero;
      }
    }
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) acc[r] = dot8<TIn>(wc[g][r], xc[g], acc[r]);
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) acc[r] = warp_sum(acc[r]);
  if (lane == 0) {
    if constexpr (kPaired) {
      pair_store<Act>(out, acc, p, unit, bias, rope);
    } else {
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const int row = row0 + r;
        if (row < N) out[row] = from_float<TOut>(acc[r] + (bias ? to_float(bias[row]) : 0.0f));
      }
    }
  }
}

template <typename TIn, typename TOut, typename TBias, class Act>
void launch(const GemvArgs& a) {
  launch_dependent(gemv_kernel<TIn, TOut, TBias, Act>, dim3(gemv_blocks(a)), dim3(kThreads), 0,
                   static_cast<TOut*>(a.out), static_cast<const uint16_t*>(a.x),
                   static_cast<const uint16_t*>(a.w), a.ldw, static_cast<const TBias*>(a.bias),
                   static_cast<int>(a.N), static_cast<int>(a.K / 8), a.rope ? *a.rope : GemvRope{},
                   release_dependents_first());
  check_launch("cuda::gemv");
}

template <typename TIn, typename TOut, typename TBias>
void launch_act(const GemvArgs& a) {
  if constexpr (std::is_same_v<TOut, TIn>) {
    if (a.rope) {
      launch<TIn, TOut, TBias, RopeQkv>(a);
      return;
    }
    if (a.gated) {
      if (a.act == Activation::SiLU) {
        launch<TIn, TOut, TBias, SiluMul>(a);
      } else {
        launch<TIn, TOut, TBias, GeluTanhMul>(a);
      }
      return;
    }
  }
  launch<TIn, TOut, TBias, void>(a);
}

template <typename TIn, typename TOut>
bool launch_out(const GemvArgs& a) {
  if (a.bias == nullptr || a.bias_dtype == a.in_dtype) {
    launch_act<TIn, TOut, TIn>(a);
  } else if (a.bias_dtype == DType::F32) {
    launch_act<TIn, TOut, float>(a);
  } else {
    return false;
  }
  return true;
}

template <typename TIn>
bool launch_in(const GemvArgs& a) {
  if (a.out_dtype == a.in_dtype) return launch_out<TIn, TIn>(a);
  if (a.out_dtype == DType::F32) return launch_out<TIn, float>(a);
  return false;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

unsigned gemv_blocks(const GemvArgs& a) {
  const int64_t units = a.gated || a.rope ? a.N / 2 : ceil_div(a.N, int64_t{kRows});  // warps' work
  return static_cast<unsigned>(ceil_div(units, int64_t{kWarps}));
}

bool gemv_applies(const GemvArgs& a) {
  const bool in16 = a.in_dtype == DType::BF16 || a.in_dtype == DType::F16;
  const bool same_out = a.out_dtype == a.in_dtype;
  return in16 && (same_out || a.out_dtype == DType::F32) && a.K > 0 && a.K % 8 == 0 &&
         a.ldw % 8 == 0 && a.N > 0 && a.N < (int64_t{1} << 31) && a.K / 8 < (int64_t{1} << 31) &&
         aligned16(a.x) && aligned16(a.w) && (!a.gated || (a.N % 2 == 0 && same_out)) &&
         (!a.rope || (same_out && !a.gated && a.rope->D > 0 && a.rope->D % 2 == 0 &&
                      a.N == int64_t{a.rope->Hq + 2 * a.rope->Hkv} * a.rope->D));
}

bool gemv(const GemvArgs& a) {
  if (!gemv_applies(a)) return false;
  if (a.in_dtype == DType::BF16) return launch_in<__nv_bfloat16>(a);
  return launch_in<__half>(a);
}

}  // namespace llmk::cuda
