// Vectors of bf16, fp16 or f32 elements for the CUDA kernels that take any of the three
// (activations whose dtype the caller chose): K consecutive elements moved as raw 16-byte (or
// smaller) words and converted to and from floats, and the host-side dispatch from a DType to
// the element type. Included by .cu files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "core/dtype.h"
#include "kernels/cuda/common.cuh"

namespace llmk::cuda {

// Elements of T in one 16-byte vector.
template <class T>
constexpr int kVecOf = 16 / static_cast<int>(sizeof(T));

// ---------------------------------------------------------------------------------------------
// Loads and stores of K consecutive elements of TS as raw words, in accesses of up to 16 bytes
// (the address aligned to min(K * sizeof(TS), 16) bytes), and their conversion to floats.

template <int kBytes>
struct RawWord;
template <>
struct RawWord<2> {
  using type = uint16_t;
};
template <>
struct RawWord<4> {
  using type = uint32_t;
};
template <>
struct RawWord<8> {
  using type = uint2;
};
template <>
struct RawWord<16> {
  using type = uint4;
};

template <class TS, int K>
struct Chunk {
  static constexpr int kBytes = K * static_cast<int>(sizeof(TS));
  static constexpr int kWordBytes = kBytes < 16 ? kBytes : 16;
  static constexpr int kWords = kBytes / kWordBytes;
  static_assert(kBytes % kWordBytes == 0, "Chunk: a whole number of words");
  using Word = typename RawWord<kWordBytes>::type;
  Word w[kWords];
};

template <class TS, int K>
__device__ __forceinline__ Chunk<TS, K> load_chunk(const TS* p) {
  using C = Chunk<TS, K>;
  C c;
  const auto* src = reinterpret_cast<const typename C::Word*>(p);
#pragma unroll
  for (int i = 0; i < C::kWords; ++i) c.w[i] = src[i];
  return c;
}

template <class TS, int K>
__device__ __forceinline__ void store_chunk(TS* p, const Chunk<TS, K>& c) {
  using C = Chunk<TS, K>;
  auto* dst = reinterpret_cast<typename C::Word*>(p);
#pragma unroll
  for (int i = 0; i < C::kWords; ++i) dst[i] = c.w[i];
}

__device__ __forceinline__ float2 pair_to_float2(__nv_bfloat162 v) { return __bfloat1622float2(v); }
__device__ __forceinline__ float2 pair_to_float2(__half2 v) { return __half22float2(v); }
template <class TS>
struct PairOf;
template <>
struct PairOf<__nv_bfloat16> {
  using type = __nv_bfloat162;
  static __device__ __forceinline__ type make(float a, float b) {
    return __floats2bfloat162_rn(a, b);
  }
};
template <>
struct PairOf<__half> {
  using type = __half2;
  static __device__ __forceinline__ type make(float a, float b) { return __floats2half2_rn(a, b); }
};

template <class TS, int K>
__device__ __forceinline__ void unpack(const Chunk<TS, K>& c, float (&f)[K]) {
  if constexpr (sizeof(TS) == 2 && K % 2 == 0) {
    const auto* h = reinterpret_cast<const typename PairOf<TS>::type*>(c.w);
#pragma unroll
    for (int k = 0; k < K / 2; ++k) {
      const float2 v = pair_to_float2(h[k]);
      f[2 * k] = v.x;
      f[2 * k + 1] = v.y;
    }
  } else {
    const auto* e = reinterpret_cast<const TS*>(c.w);
#pragma unroll
    for (int k = 0; k < K; ++k) f[k] = to_float(e[k]);
  }
}

template <class TS, int K>
__device__ __forceinline__ Chunk<TS, K> pack(const float (&f)[K]) {
  Chunk<TS, K> c;
  if constexpr (sizeof(TS) == 2 && K % 2 == 0) {
    auto* h = reinterpret_cast<typename PairOf<TS>::type*>(c.w);
#pragma unroll
    for (int k = 0; k < K / 2; ++k) h[k] = PairOf<TS>::make(f[2 * k], f[2 * k + 1]);
  } else {
    auto* e = reinterpret_cast<TS*>(c.w);
#pragma unroll
    for (int k = 0; k < K; ++k) e[k] = from_float<TS>(f[k]);
  }
  return c;
}

// K consecutive elements of TS (the address aligned to min(K * sizeof(TS), 16) bytes) as
// floats, and back, each rounded once to TS.
template <class TS, int K>
__device__ __forceinline__ void load_vec(const TS* p, float (&f)[K]) {
  unpack(load_chunk<TS, K>(p), f);
}
template <class TS, int K>
__device__ __forceinline__ void store_vec(TS* p, const float (&f)[K]) {
  store_chunk(p, pack<TS, K>(f));
}
// Two consecutive elements (4- or 8-byte aligned) as a float2, and back.
template <class TS>
__device__ __forceinline__ float2 load_pair(const TS* p) {
  float f[2];
  load_vec<TS, 2>(p, f);
  return float2{f[0], f[1]};
}
template <class TS>
__device__ __forceinline__ void store_pair(TS* p, float a, float b) {
  const float f[2] = {a, b};
  store_vec<TS, 2>(p, f);
}

// Rounds each value to TS and back, as storing and reloading would (nothing for f32).
template <class TS, int N>
__device__ __forceinline__ void round_to(float (&f)[N]) {
  if constexpr (!std::is_same_v<TS, float>) {
#pragma unroll
    for (int k = 0; k < N; ++k) f[k] = to_float(from_float<TS>(f[k]));
  }
}

// Calls fn(T{}) with T the element type of dt (__nv_bfloat16, __half or float); any other dtype
// (is_float_type false) is a broken precondition of the caller (the ops check dtypes first).
template <class Fn>
void with_float_type(DType dt, Fn&& fn) {
  switch (dt) {
    case DType::BF16:
      fn(__nv_bfloat16{});
      return;
    case DType::F16:
      fn(__half{});
      return;
    case DType::F32:
      fn(float{});
      return;
    default:
      throw_cuda_error(cudaErrorInvalidValue, "with_float_type: not bf16, f16 or f32", __FILE__,
                       __LINE__);
  }
}

}  // namespace llmk::cuda
