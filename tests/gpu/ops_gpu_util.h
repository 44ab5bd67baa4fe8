// Helpers for the GPU op tests (norm_rope_test.cpp, elementwise_test.cpp): random bf16 host
// data, poisoned device tensors, host copies of device views, and the bf16 comparison.
//
// Convention: every CUDA op is checked against the same op on the CPU, fed the bf16-rounded
// inputs as f32, so the comparison measures the kernel and not the input rounding.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>

#include "core/cuda/check.h"
#include "core/cuda/device.h"
#include "core/cuda/stream.h"
#include "core/half.h"
#include "core/tensor.h"
#include "ops/ops.h"

namespace llmk::gpu_test {

// Host tensor of uniform values in [lo, hi), rounded to `dtype` (f32, f16 or bf16).
inline Tensor random_host(const Shape& shape, DType dtype, uint32_t seed, float lo = -1.0f,
                          float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  Tensor t = Tensor::empty(shape, dtype);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float v = dist(rng);
    if (dtype == DType::F32) {
      t.data<float>()[i] = v;
    } else {
      t.data<uint16_t>()[i] = dtype == DType::BF16 ? float_to_bf16(v) : float_to_fp16(v);
    }
  }
  return t;
}

// A contiguous f32 host copy of a host tensor of f32/f16/bf16 with any strides.
inline Tensor to_f32(const Tensor& host) {
  Tensor out = Tensor::empty(host.shape(), DType::F32);
  ops::copy(out, host);
  return out;
}

// A device tensor whose every byte is 0xFF: NaN as bf16, f16 and f32, -1 as i32.
inline Tensor poisoned_cuda(const Shape& shape, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype, Device::CUDA);
  LLMK_CUDA_CHECK(
      cudaMemsetAsync(t.data(), 0xFF, static_cast<size_t>(t.nbytes()), cuda::current_stream()));
  return t;
}

// Number of elements of a host tensor (any dtype of 2 or 4 bytes) that are not all-ones bytes,
// i.e. that something wrote over the poison.
inline int64_t unpoisoned(const Tensor& host) {
  const Tensor c = host.contiguous();
  const auto* b = c.data<const uint8_t>();
  const int64_t es = static_cast<int64_t>(element_size(c.dtype()));
  int64_t n = 0;
  for (int64_t i = 0; i < c.numel(); ++i) {
    bool all = true;
    for (int64_t k = 0; k < es; ++k) all &= b[i * es + k] == 0xFF;
    n += !all;
  }
  return n;
}

struct Diff {
  double rel_l2 = 0, max_abs = 0, max_ref = 0;
  int64_t nonfinite = 0;
};

// out, ref: f32 host tensors of one shape (any strides).
inline Diff compare(const Tensor& out_any, const Tensor& ref_any) {
  const Tensor out = to_f32(out_any), ref = to_f32(ref_any);
  Diff e;
  double num = 0, den = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double o = out.data<float>()[i], r = ref.data<float>()[i];
    if (!std::isfinite(o)) {
      ++e.nonfinite;
      continue;
    }
    num += (o - r) * (o - r);
    den += r * r;
    e.max_abs = std::max(e.max_abs, std::abs(o - r));
    e.max_ref = std::max(e.max_ref, std::abs(r));
  }
  e.rel_l2 = den > 0 ? std::sqrt(num / den) : (num > 0 ? INFINITY : 0);
  return e;
}

struct Tolerance {
  double rel_l2;       // ||out - ref|| / ||ref||
  double max_abs_rel;  // max |out - ref| / max |ref|
};
// bf16 outputs of fp32 math: bf16 keeps 8 significant bits, so one rounding to nearest is at
// most 2^-8 = 3.9e-3 of the value (about 1.1e-3 RMS over many random values, but a handful of
// elements can sit near the bound: rel L2 up to 3e-3 was seen at D = 1..17). The fp32
// differences (rsqrtf, expf, sincosf against the CPU's double or vector code) are near 1e-6 and
// can at most move a value across a rounding midpoint. Hence rel L2 <= 4.5e-3 and
// max abs <= 2^-7 max |ref|.
inline constexpr Tolerance kBf16Out{4.5e-3, 2.0 / 256};
// f32 outputs (softmax): fp32 math in another order and with other exp implementations; the
// sums of up to 32k terms differ by a few 1e-6 between the CPU's 8 running lanes and the GPU's
// tree, and every output carries that relative error.
inline constexpr Tolerance kF32Out{1e-4, 1e-4};

inline void expect_close(const Tensor& out, const Tensor& ref, const Tolerance& tol,
                         const std::string& what) {
  const Diff e = compare(out, ref);
  EXPECT_EQ(e.nonfinite, 0) << what << ": elements not written (or not finite)";
  EXPECT_GT(e.max_ref, 0.0) << what << ": the reference is all zeros";
  EXPECT_LE(e.rel_l2, tol.rel_l2) << what;
  EXPECT_LE(e.max_abs, tol.max_abs_rel * e.max_ref) << what << " (max |ref| " << e.max_ref << ")";
}

// out (bf16, any strides) must equal ref (f32) rounded to bf16, element for element: for ops
// whose fp32 math is the same on both sides (add, scale, copies, gathers).
inline void expect_bf16_exact(const Tensor& out, const Tensor& ref, const std::string& what) {
  const Tensor o = out.contiguous(), r = to_f32(ref);
  ASSERT_EQ(o.dtype(), DType::BF16);
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < r.numel(); ++i) {
    const uint16_t want = float_to_bf16(r.data<float>()[i]);
    if (o.data<uint16_t>()[i] != want) {
      if (first < 0) first = i;
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << r.numel() << " differ, first at flat index "
                    << first;
}

class CudaOpTest : public ::testing::Test {
 protected:
  void SetUp() override { cuda::init(); }
};

}  // namespace llmk::gpu_test
