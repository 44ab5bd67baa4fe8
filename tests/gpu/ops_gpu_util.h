// Helpers for the GPU op tests: random bf16 host data, poisoned device tensors, host copies of
// device views, the comparison with a reference (error statistics and tolerances), and the
// message of an expected llmk::Error.
//
// Convention: every CUDA op is checked against the same op on the CPU, fed the bf16-rounded
// inputs as f32, so the comparison measures the kernel and not the input rounding.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/cuda/check.h"
#include "core/cuda/device.h"
#include "core/cuda/stream.h"
#include "core/error.h"
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
// A host i32 vector tensor holding v.
inline Tensor i32_host(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::I32);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

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
  int64_t first_nonfinite = -1;  // index (in the order added) of the first non-finite output
};

// Gathers a Diff one (output, reference) pair at a time, for outputs the caller walks in its own
// layout (row pitches, several launches).
class DiffAccumulator {
 public:
  void add(double out, double ref) {
    const int64_t i = n_++;
    if (!std::isfinite(out)) {
      if (d_.nonfinite++ == 0) d_.first_nonfinite = i;
      return;
    }
    num_ += (out - ref) * (out - ref);
    den_ += ref * ref;
    d_.max_abs = std::max(d_.max_abs, std::abs(out - ref));
    d_.max_ref = std::max(d_.max_ref, std::abs(ref));
  }
  Diff result() const {
    Diff d = d_;
    d.rel_l2 = den_ > 0 ? std::sqrt(num_ / den_) : (num_ > 0 ? INFINITY : 0);
    return d;
  }

 private:
  Diff d_;
  double num_ = 0, den_ = 0;
  int64_t n_ = 0;
};

// ||a - ref|| / ||ref|| over n values (a row of logits); a non-finite a makes it non-finite.
inline double rel_l2(const float* a, const float* ref, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(a[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return std::sqrt(num / den);
}

// out, ref: host tensors of one shape (f32, f16 or bf16; any strides).
inline Diff compare(const Tensor& out_any, const Tensor& ref_any) {
  const Tensor out = to_f32(out_any), ref = to_f32(ref_any);
  DiffAccumulator acc;
  for (int64_t i = 0; i < ref.numel(); ++i) acc.add(out.data<float>()[i], ref.data<float>()[i]);
  return acc.result();
}

// Both bounds are relative to the reference, so they tighten with it: an absolute max-abs bound
// cannot fail where the outputs themselves are far smaller than it (attention over a long
// context averages v toward zero).
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
// Attention outputs of the tensor-core kernels (prefill, decode; bf16 or fp16 out, fp32
// accumulation) against a reference on the same rounded inputs. Two roundings to 16 bits
// matter: the output's (at most 2^-8 = 3.9e-3 of max |ref| for bf16) and the softmax weights'
// for the P.V product (at most 2^-8 of each weight, ~1.6e-3 RMS and random in sign, so its
// output error is ~1.6e-3 of the outputs' own spread). Both scale with the outputs, at any
// context length; rel L2 lands near 2e-3. Hence 1e-2 for both bounds. A wrong result still
// fails: a 64-key tile dropped from n keys of comparable weight moves the outputs by about
// sqrt(64 / n) of their spread (the tile's share of sum w^2): 12% at the 4099 keys the tests
// reach, 8% at 9000, over 7x both bounds. (At 4099 keys that move is ~6e-3 in absolute terms:
// an absolute max-abs bound of 1e-2 would let it through.)
inline constexpr Tolerance kAttentionOut{1e-2, 1e-2};

// Fails (non-fatally) where e breaks tol, or holds outputs not written (or not finite), or the
// reference is all zeros (the comparison would pass vacuously).
inline void expect_within(const Diff& e, const Tolerance& tol, const std::string& what) {
  EXPECT_EQ(e.nonfinite, 0) << what << ": elements not written (or not finite), the first at "
                            << e.first_nonfinite;
  EXPECT_GT(e.max_ref, 0.0) << what << ": the reference is all zeros";
  EXPECT_LE(e.rel_l2, tol.rel_l2) << what << ": relative L2 error";
  EXPECT_LE(e.max_abs, tol.max_abs_rel * e.max_ref)
      << what << ": max abs error (max |ref| " << e.max_ref << ")";
}

inline void expect_close(const Tensor& out, const Tensor& ref, const Tolerance& tol,
                         const std::string& what) {
  expect_within(compare(out, ref), tol, what);
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

// The message of the llmk::Error fn throws, or "<no llmk::Error thrown>".
inline std::string error_message(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no llmk::Error thrown>";
}

class CudaOpTest : public ::testing::Test {
 protected:
  void SetUp() override { cuda::init(); }
};

}  // namespace llmk::gpu_test
