// ops::linear on CUDA (cuBLASLt) against ops::linear on the CPU.
//
// Inputs are drawn fresh for every shape and rounded to bf16 first; the CPU computes in fp32 from
// the same rounded values, so the comparison measures the GPU path, not the input rounding.
// Outputs are poisoned (all bits set: NaN in bf16 and f32) before every call, so an element the
// GPU never wrote fails. The comparison is ops_gpu_util.h's (gpu_test::compare, expect_within);
// the tolerances are this op's, against the CPU result `ref`, with u = 2^-8 the unit roundoff of
// bf16:
//   bf16 out: ||out - ref|| / ||ref|| <= 5e-3 and max |out - ref| <= 4u * max |ref| (1.6e-2):
//             one rounding to bf16 costs at most u of the value, and a bias of the other dtype
//             (added by a kernel after the GEMM's own rounding) costs two;
//   f32 out:  ||out - ref|| / ||ref|| <= 2e-4 and max |out - ref| <= 2e-3 * max |ref|
//             (fp32 accumulation in another order, on tensor cores).
#include "kernels/cuda/gemm/linear.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "core/cuda/allocator.h"
#include "core/cuda/check.h"
#include "core/cuda/device.h"
#include "core/cuda/stream.h"
#include "core/error.h"
#include "core/half.h"
#include "core/tensor.h"
#include "ops/ops.h"
#include "ops_gpu_util.h"

namespace llmk {
namespace {

// splitmix64: fast, seedable, good enough for test data.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  float uniform(float lo, float hi) {  // in [lo, hi)
    const double u = static_cast<double>(next() >> 11) * 0x1.0p-53;
    return static_cast<float>(lo + (hi - lo) * u);
  }

 private:
  uint64_t next() {
    uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  uint64_t s_;
};

// Host bf16 tensor of uniform values in [-scale, scale).
Tensor random_bf16(const Shape& shape, Rng& rng, float scale) {
  Tensor t = Tensor::empty(shape, DType::BF16);
  auto* p = t.data<uint16_t>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = float_to_bf16(rng.uniform(-scale, scale));
  return t;
}

Tensor random_f32(const Shape& shape, Rng& rng, float scale) {
  Tensor t = Tensor::empty(shape, DType::F32);
  auto* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = rng.uniform(-scale, scale);
  return t;
}

using gpu_test::compare;
using gpu_test::error_message;
using gpu_test::expect_within;
using gpu_test::poisoned_cuda;
using gpu_test::to_f32;
using gpu_test::Tolerance;

// The tolerances of the header comment, by output dtype.
Tolerance tolerance_for(DType out_dtype) {
  return out_dtype == DType::BF16 ? Tolerance{5e-3, 4.0 / 256} : Tolerance{2e-4, 2e-3};
}

class Linear : public ::testing::Test {
 protected:
  void SetUp() override { cuda::init(); }
};

// The output of one GPU call: a [M, N] view of a [M, N + pad] device tensor (pad 0: dense),
// poisoned in full first.
struct Out {
  Tensor wide, view;
  Out(int64_t M, int64_t N, int64_t pad, DType dtype)
      : wide(poisoned_cuda({M, N + pad}, dtype)), view(wide.slice(1, 0, N)) {}
  // The view's values as f32 on the host; checks that the padding kept its poison.
  Tensor values() const {
    const Tensor host = wide.to(Device::CPU);
    const int64_t N = view.dim(1), es = static_cast<int64_t>(element_size(host.dtype()));
    int64_t touched = 0;
    for (int64_t m = 0; m < host.dim(0); ++m) {
      const auto* row = host.data<const uint8_t>() + m * host.stride(0) * es;
      for (int64_t b = N * es; b < host.dim(1) * es; ++b) touched += row[b] != 0xFF;
    }
    EXPECT_EQ(touched, 0) << "bytes written past the last column of out";
    return to_f32(host.slice(1, 0, N));
  }
};

// One (M, N, K) problem: fresh inputs; every bias kind x output dtype, each with dense x and
// out, a strided x, and a strided out.
void check_problem(int64_t M, int64_t N, int64_t K, uint64_t seed) {
  Rng rng(seed);
  // x is cut from a wider host matrix at column 1, so that the strided device view has an odd
  // row stride and a 2-byte-aligned start: the least aligned x the op accepts.
  constexpr int64_t kPad = 5;
  const Tensor x_wide = random_bf16({M, K + kPad}, rng, 1.0f);
  const Tensor x_host = x_wide.slice(1, 1, 1 + K);
  const float w_scale = 1.0f / std::sqrt(static_cast<float>(K));  // outputs of order 1/sqrt(3)
  const Tensor w_host = random_bf16({N, K}, rng, w_scale);
  const Tensor b_bf16_host = random_bf16({N}, rng, 0.5f);
  const Tensor b_f32_host = random_f32({N}, rng, 0.5f);

  const Tensor x32 = to_f32(x_host), w32 = to_f32(w_host);
  const Tensor x_dense = x_host.to(Device::CUDA);
  const Tensor x_wide_dev = x_wide.to(Device::CUDA);
  const Tensor x_strided = x_wide_dev.slice(1, 1, 1 + K);
  const Tensor w = w_host.to(Device::CUDA);
  const Tensor b_bf16 = b_bf16_host.to(Device::CUDA), b_f32 = b_f32_host.to(Device::CUDA);

  struct BiasCase {
    const char* name;
    const Tensor* dev;
    const Tensor* host;
  };
  const BiasCase biases[] = {
      {"none", nullptr, nullptr}, {"bf16", &b_bf16, &b_bf16_host}, {"f32", &b_f32, &b_f32_host}};
  struct Layout {
    const char* name;
    const Tensor* x;
    int64_t out_pad;
  };
  const Layout layouts[] = {{"dense", &x_dense, 0},
                            {"x strided (ld K+5, start +1)", &x_strided, 0},
                            {"out strided (ld N+3)", &x_dense, 3}};
  double worst[2] = {0, 0};  // rel-L2 for bf16 and f32 outputs
  for (const BiasCase& b : biases) {
    Tensor ref = Tensor::empty({M, N}, DType::F32);
    if (b.host) {
      const Tensor b32 = to_f32(*b.host);
      ops::linear(ref, x32, w32, &b32);
    } else {
      ops::linear(ref, x32, w32);
    }
    for (DType out_dtype : {DType::BF16, DType::F32}) {
      for (const Layout& l : layouts) {
        const std::string what = fmt::format("M={} N={} K={} bias {} out {} {}", M, N, K, b.name,
                                             dtype_name(out_dtype), l.name);
        Out out(M, N, l.out_pad, out_dtype);
        ops::linear(out.view, *l.x, w, b.dev);
        const gpu_test::Diff e = compare(out.values(), ref);
        expect_within(e, tolerance_for(out_dtype), what);
        double& wst = worst[out_dtype == DType::BF16 ? 0 : 1];
        wst = std::max(wst, e.rel_l2);
      }
    }
  }
  std::printf("  M=%-5lld N=%-6lld K=%-5lld worst rel-L2: bf16 out %.2e, f32 out %.2e\n",
              static_cast<long long>(M), static_cast<long long>(N), static_cast<long long>(K),
              worst[0], worst[1]);
}

TEST_F(Linear, MatchesTheCpuOverShapesBiasesDtypesAndStrides) {
  struct Problem {
    int64_t N, K;
    std::vector<int64_t> Ms;
  };
  // The large products keep to small M so that the CPU reference stays quick.
  const Problem problems[] = {
      {896, 896, {1, 2, 7, 64, 333, 2048}},
      {17, 33, {1, 2, 7, 64, 333, 2048}},
      {4864, 896, {1, 2, 7, 64, 333}},
      {4096, 4096, {1, 2, 7, 64}},
      {151936, 896, {1}},
  };
  uint64_t seed = 1;
  for (const Problem& p : problems) {
    for (int64_t M : p.Ms) check_problem(M, p.N, p.K, seed++);
  }
  const cuda::LinearStats s = cuda::linear_stats();
  std::printf("  cuBLASLt calls %llu, plans %llu, bias in epilogue %llu, bias by kernel %llu\n",
              static_cast<unsigned long long>(s.calls), static_cast<unsigned long long>(s.plans),
              static_cast<unsigned long long>(s.bias_epilogue),
              static_cast<unsigned long long>(s.bias_kernel));
  EXPECT_GT(s.bias_epilogue, 0u) << "the epilogue bias path never ran";
}

// One row (a batch-1 decode step) runs llmk's own kernel (gemv.h) where x and w are 16-byte
// aligned and K a multiple of 8 (check_problem's dense layouts), cuBLASLt elsewhere (its strided
// x starts 2 bytes in): both against the CPU at shapes that fill no tile evenly, and Phi-3-mini's.
TEST_F(Linear, OneRowKernelMatchesTheCpuAtAwkwardShapes) {
  // N of 7 and 9: the last warp's second row is missing. No N below 7: check_problem's bf16-out,
  // f32-bias case on cuBLASLt (the strided x) rounds twice, which one output can show above the
  // bound (N = 1, K = 8 did on an H100: rel-L2 0.035).
  const std::pair<int64_t, int64_t> shapes[] = {
      {16, 8}, {7, 24}, {9, 1032}, {130, 4096}, {4097, 3080}, {3072, 3072}, {3072, 8192}};
  uint64_t seed = 100;
  for (auto [N, K] : shapes) {
    const uint64_t before = cuda::linear_stats().gemv;
    check_problem(1, N, K, seed++);
    EXPECT_GT(cuda::linear_stats().gemv, before) << "N=" << N << " K=" << K << ": gemv never ran";
  }
  // Off: the same problem goes to cuBLASLt.
  cuda::set_linear_gemv(false);
  const uint64_t before = cuda::linear_stats().gemv;
  check_problem(1, 130, 4096, seed++);
  EXPECT_EQ(cuda::linear_stats().gemv, before);
  cuda::set_linear_gemv(true);
}

// linear_gated: one row runs the gate|up product and the activation in one launch of the one-row
// kernel (scratch keeps its poison); more rows, or the kernel off, run linear into scratch and
// then gated_act. Both against the CPU's linear, rounded to bf16 as the GPU's linear output is,
// then gated_act; with and without a bias of each dtype, at shapes that leave blocks part-full.
// The fused kernel must meet the bf16 bound of a single linear (one rounding before the
// activation, one after). The composed path (cuBLASLt, then gated_act) is two ops, each held to
// its own bound: the linear's 5e-3 (its bf16 output, rounded once more where an f32 bias is added
// after the GEMM) passed through the activation plus gated_act's own rounding, 1e-2 together.
TEST_F(Linear, GatedProjectionMatchesTheCpu) {
  const std::tuple<int64_t, int64_t, int64_t> shapes[] = {
      {1, 3, 24}, {1, 9, 1032}, {1, 8192, 3072}, {1, 130, 4096}, {3, 130, 4096}};
  uint64_t seed = 200;
  for (auto [M, F, K] : shapes) {
    for (ops::Activation act : {ops::Activation::SiLU, ops::Activation::GeluTanh}) {
      for (int bias_kind : {0, 1, 2}) {  // none, bf16, f32
        for (bool gemv_on : {true, false}) {
          const std::string what = fmt::format("linear_gated M={} F={} K={} {} bias {}{}", M, F, K,
                                               act == ops::Activation::SiLU ? "silu" : "gelu",
                                               bias_kind == 0   ? "none"
                                               : bias_kind == 1 ? "bf16"
                                                                : "f32",
                                               gemv_on ? "" : " gemv off");
          Rng rng(seed++);
          const Tensor x_host = random_bf16({M, K}, rng, 1.0f);
          const Tensor w_host =
              random_bf16({2 * F, K}, rng, 3.0f / std::sqrt(static_cast<float>(K)));
          const Tensor b_host =
              bias_kind == 2 ? random_f32({2 * F}, rng, 0.5f) : random_bf16({2 * F}, rng, 0.5f);
          const Tensor x = x_host.to(Device::CUDA), w = w_host.to(Device::CUDA);
          const Tensor b = b_host.to(Device::CUDA);
          Tensor scratch = poisoned_cuda({M, 2 * F}, DType::BF16);
          Out out(M, F, 3, DType::BF16);
          cuda::set_linear_gemv(gemv_on);
          const uint64_t before = cuda::linear_stats().gemv;
          ops::linear_gated(out.view, x, w, act, scratch, bias_kind ? &b : nullptr);
          const bool fused = cuda::linear_stats().gemv > before;
          cuda::set_linear_gemv(true);
          Tensor lin = Tensor::empty({M, 2 * F}, DType::F32);
          const Tensor b32 = to_f32(b_host);
          ops::linear(lin, to_f32(x_host), to_f32(w_host), bias_kind ? &b32 : nullptr);
          Tensor lin16 = Tensor::empty({M, 2 * F}, DType::BF16);
          ops::copy(lin16, lin);
          const Tensor lin_r = to_f32(lin16);
          Tensor ref = Tensor::empty({M, F}, DType::F32);
          ops::gated_act(ref, lin_r.slice(1, 0, F), lin_r.slice(1, F, 2 * F), act);
          EXPECT_EQ(fused, M == 1 && gemv_on) << what;
          expect_within(compare(out.values(), ref),
                        fused ? tolerance_for(DType::BF16) : Tolerance{1e-2, 4.0 / 256}, what);
          const int64_t written = gpu_test::unpoisoned(scratch.to(Device::CPU));
          EXPECT_EQ(written, fused ? 0 : M * 2 * F) << what;
        }
      }
    }
  }
}

// Which path each (out, bias) dtype pair takes; both are checked against the CPU above. A bias
// of the output's dtype must fuse into the cuBLASLt epilogue; the other pairing takes the kernel.
TEST_F(Linear, BiasOfTheOutputDtypeFusesIntoTheEpilogue) {
  Rng rng(3);
  const Tensor x = random_bf16({7, 896}, rng, 1.0f).to(Device::CUDA);
  const Tensor w = random_bf16({896, 896}, rng, 0.03f).to(Device::CUDA);
  for (DType out_dtype : {DType::BF16, DType::F32}) {
    for (DType bias_dtype : {DType::BF16, DType::F32}) {
      const Tensor b =
          (bias_dtype == DType::BF16 ? random_bf16({896}, rng, 0.5f) : random_f32({896}, rng, 0.5f))
              .to(Device::CUDA);
      Tensor out = Tensor::empty({7, 896}, out_dtype, Device::CUDA);
      const cuda::LinearStats s0 = cuda::linear_stats();
      ops::linear(out, x, w, &b);
      const cuda::LinearStats s1 = cuda::linear_stats();
      const bool fused = s1.bias_epilogue == s0.bias_epilogue + 1;
      EXPECT_TRUE(fused || s1.bias_kernel == s0.bias_kernel + 1);
      std::printf("  out %s, bias %s: bias %s\n", std::string(dtype_name(out_dtype)).c_str(),
                  std::string(dtype_name(bias_dtype)).c_str(),
                  fused ? "in the cuBLASLt epilogue" : "by the separate kernel");
      EXPECT_EQ(fused, out_dtype == bias_dtype);
    }
  }
  cuda::synchronize();
}

// linear_gelu: GELU, the bias and the pre-activation (aux) in cuBLASLt's epilogue. f32 outputs, so
// that the activation's form shows: the output matches GELU's tanh approximation (torch's
// approximate="tanh") of the GPU's own pre-activation to f32 precision, and differs from the erf
// form by more than that (the forms differ by up to 4.7e-4, near |z| = 2.7).
TEST_F(Linear, GeluEpilogueIsTheTanhFormWithTheBiasAndPreActivation) {
  Rng rng(17);
  constexpr int64_t M = 96, N = 64, K = 40;
  const Tensor x = random_bf16({M, K}, rng, 1.0f), w = random_bf16({N, K}, rng, 0.6f);
  const Tensor b = random_f32({N}, rng, 1.0f);
  const Tensor xd = x.to(Device::CUDA), wd = w.to(Device::CUDA), bd = b.to(Device::CUDA);
  Tensor out = poisoned_cuda({M, N}, DType::F32), aux = poisoned_cuda({M, N}, DType::F32);
  cuda::LinearArgs a{.out = out.data(),
                     .out_dtype = DType::F32,
                     .ldo = N,
                     .x = xd.data(),
                     .ldx = K,
                     .w = wd.data(),
                     .ldw = K,
                     .bias = bd.data(),
                     .bias_dtype = DType::F32,
                     .M = M,
                     .N = N,
                     .K = K,
                     .gelu = true,
                     .aux = aux.data(),
                     .ld_aux = N};
  const cuda::LinearStats s0 = cuda::linear_stats();
  ASSERT_TRUE(cuda::linear_gelu(a)) << "cuBLASLt took no GELU epilogue for f32 out and bias";
  EXPECT_EQ(cuda::linear_stats().gelu_epilogue, s0.gelu_epilogue + 1);
  const Tensor y = out.to(Device::CPU), z = aux.to(Device::CPU);
  const Tensor x32 = to_f32(x), w32 = to_f32(w);
  double z_err = 0, z_max = 0, tanh_err = 0, erf_err = 0, z_lo = 0, z_hi = 0;
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      double want = b.data<const float>()[n];
      for (int64_t k = 0; k < K; ++k) {
        want += static_cast<double>(x32.data<const float>()[m * K + k]) *
                w32.data<const float>()[n * K + k];
      }
      const double zz = z.data<const float>()[m * N + n], yy = y.data<const float>()[m * N + n];
      z_err = std::max(z_err, std::abs(zz - want));
      z_max = std::max(z_max, std::abs(want));
      z_lo = std::min(z_lo, zz);
      z_hi = std::max(z_hi, zz);
      const double t =
          0.5 * zz * (1 + std::tanh(0.7978845608028654 * (zz + 0.044715 * zz * zz * zz)));
      const double e = 0.5 * zz * (1 + std::erf(zz / std::sqrt(2.0)));
      tanh_err = std::max(tanh_err, std::abs(yy - t));
      erf_err = std::max(erf_err, std::abs(yy - e));
    }
  }
  std::printf(
      "  pre-activation in [%.2f, %.2f], max error %.2e; output against tanh GELU %.2e, "
      "against erf GELU %.2e\n",
      z_lo, z_hi, z_err, tanh_err, erf_err);
  EXPECT_LE(z_err, 1e-5 * std::max(1.0, z_max));
  EXPECT_LT(z_lo, -3.0);  // the inputs reach where the two forms differ most
  EXPECT_GT(z_hi, 3.0);
  EXPECT_LE(tanh_err, 2e-5);
  EXPECT_GE(erf_err, 5e-5);
  // Not taken: a bias of the other dtype (it would have to be added before the activation).
  const Tensor b16 = random_bf16({N}, rng, 1.0f).to(Device::CUDA);
  a.bias = b16.data();
  a.bias_dtype = DType::BF16;
  EXPECT_FALSE(cuda::linear_gelu(a));
  cuda::synchronize();
}

TEST_F(Linear, EmptyProblems) {
  Rng rng(7);
  // K = 0: out = bias (or zeros), written in full.
  const Tensor x = Tensor::empty({3, 0}, DType::BF16, Device::CUDA);
  const Tensor w = Tensor::empty({5, 0}, DType::BF16, Device::CUDA);
  const Tensor b_host = random_bf16({5}, rng, 1.0f);
  const Tensor b = b_host.to(Device::CUDA);
  for (DType out_dtype : {DType::BF16, DType::F32}) {
    Tensor out = poisoned_cuda({3, 5}, out_dtype);
    ops::linear(out, x, w, &b);
    const Tensor got = to_f32(out.to(Device::CPU));
    const Tensor want = to_f32(b_host);
    for (int64_t m = 0; m < 3; ++m) {
      for (int64_t n = 0; n < 5; ++n)
        EXPECT_EQ(got.data<float>()[m * 5 + n], want.data<float>()[n]);
    }
    Tensor zeros = poisoned_cuda({3, 5}, out_dtype);
    ops::linear(zeros, x, w);
    const Tensor z = to_f32(zeros.to(Device::CPU));
    for (int64_t i = 0; i < z.numel(); ++i) EXPECT_EQ(z.data<float>()[i], 0.0f);
  }
  // M = 0: nothing to do.
  Tensor none = Tensor::empty({0, 5}, DType::BF16, Device::CUDA);
  const Tensor x0 = Tensor::empty({0, 8}, DType::BF16, Device::CUDA);
  const Tensor w8 = random_bf16({5, 8}, rng, 1.0f).to(Device::CUDA);
  EXPECT_NO_THROW(ops::linear(none, x0, w8));
  cuda::synchronize();
}

TEST_F(Linear, SteadyStateCallsNeitherPlanNorAllocate) {
  Rng rng(11);
  const Tensor x = random_bf16({3, 320}, rng, 1.0f).to(Device::CUDA);
  const Tensor w = random_bf16({192, 320}, rng, 0.05f).to(Device::CUDA);
  const Tensor b = random_bf16({192}, rng, 0.5f).to(Device::CUDA);
  Tensor out = Tensor::empty({3, 192}, DType::BF16, Device::CUDA);
  ops::linear(out, x, w, &b);  // first sight: plans
  const cuda::LinearStats s0 = cuda::linear_stats();
  const cuda::AllocatorStats a0 = cuda::allocator().stats();
  for (int i = 0; i < 5; ++i) ops::linear(out, x, w, &b);
  const cuda::LinearStats s1 = cuda::linear_stats();
  const cuda::AllocatorStats a1 = cuda::allocator().stats();
  EXPECT_EQ(s1.plans, s0.plans);
  EXPECT_EQ(s1.calls, s0.calls + 5);
  EXPECT_EQ(a1.num_allocs, a0.num_allocs);
  EXPECT_EQ(a1.num_device_allocs, a0.num_device_allocs);
  cuda::synchronize();
}

// The backward's operands: x stored [K, M] and w stored [K, N] (x_trans, w_trans), each way,
// against the CPU product of the untransposed matrices.
TEST_F(Linear, TransposedOperandsMatchTheCpu) {
  Rng rng(17);
  const int64_t M = 37, N = 70, K = 130;
  const Tensor x = random_bf16({M, K}, rng, 1.0f), w = random_bf16({N, K}, rng, 0.1f);
  // Host transposes (bf16 bits copied).
  auto transposed = [](const Tensor& t) {
    Tensor r = Tensor::empty({t.dim(1), t.dim(0)}, DType::BF16);
    for (int64_t i = 0; i < t.dim(0); ++i)
      for (int64_t j = 0; j < t.dim(1); ++j)
        r.data<uint16_t>()[j * t.dim(0) + i] = t.data<const uint16_t>()[i * t.dim(1) + j];
    return r;
  };
  Tensor ref = Tensor::empty({M, N}, DType::F32);
  ops::linear(ref, to_f32(x), to_f32(w));
  const Tensor xt = transposed(x).to(Device::CUDA), wt = transposed(w).to(Device::CUDA);
  const Tensor xd = x.to(Device::CUDA), wd = w.to(Device::CUDA);
  for (const bool xtr : {false, true}) {
    for (const bool wtr : {false, true}) {
      Tensor out = poisoned_cuda({M, N}, DType::F32);
      cuda::LinearArgs a;
      a.out = out.data();
      a.out_dtype = DType::F32;
      a.ldo = N;
      a.x = (xtr ? xt : xd).data();
      a.x_trans = xtr;
      a.ldx = xtr ? M : K;
      a.w = (wtr ? wt : wd).data();
      a.w_trans = wtr;
      a.ldw = wtr ? N : K;
      a.M = M;
      a.N = N;
      a.K = K;
      cuda::linear(a);
      expect_within(compare(to_f32(out.to(Device::CPU)), ref), tolerance_for(DType::F32),
                    fmt::format("x_trans {} w_trans {}", xtr, wtr));
    }
  }
}

// Two threads, each on a stream of its own, run the same products at once (each stream has its
// own workspace): the results are the bits one stream alone gives.
TEST_F(Linear, StreamsRunningAtOnceGiveOneStreamsBits) {
  Rng rng(19);
  const int64_t M = 512, N = 4096, K = 4096;
  const Tensor x = random_bf16({M, K}, rng, 1.0f).to(Device::CUDA);
  const Tensor w = random_bf16({N, K}, rng, 1.0f / 64).to(Device::CUDA);
  Tensor want = Tensor::empty({M, N}, DType::BF16, Device::CUDA);
  ops::linear(want, x, w);
  const Tensor want_host = want.to(Device::CPU);
  Tensor outs[2] = {Tensor::empty({M, N}, DType::BF16, Device::CUDA),
                    Tensor::empty({M, N}, DType::BF16, Device::CUDA)};
  cudaStream_t streams[2];
  for (cudaStream_t& st : streams)
    LLMK_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  auto work = [&](int i) {
    cuda::StreamGuard guard(streams[i]);
    for (int r = 0; r < 20; ++r) ops::linear(outs[i], x, w);
    LLMK_CUDA_CHECK(cudaStreamSynchronize(streams[i]));
  };
  std::thread other(work, 1);
  work(0);
  other.join();
  for (int i = 0; i < 2; ++i) {
    const Tensor got = outs[i].to(Device::CPU);
    EXPECT_EQ(std::memcmp(got.data(), want_host.data(), static_cast<size_t>(got.nbytes())), 0)
        << "stream " << i;
  }
  for (cudaStream_t st : streams) LLMK_CUDA_CHECK(cudaStreamDestroy(st));
}

// Ends a stream capture left open by an exception, so later tests see a usable stream.
struct CaptureGuard {
  cudaStream_t stream;
  bool open = true;
  ~CaptureGuard() {
    if (!open) return;
    cudaGraph_t g = nullptr;
    (void)cudaStreamEndCapture(stream, &g);
    if (g) (void)cudaGraphDestroy(g);
    (void)cudaGetLastError();
  }
};

TEST_F(Linear, TwoCallsCapturedInAGraphReplayOnNewInputs) {
  Rng rng(21);
  constexpr int64_t M = 5, K = 896, H = 1536, V = 640;  // shapes no other test uses
  // h = x @ w1^T + b1 (bf16); logits = h @ w2^T (f32): the second reads the first's output.
  const Tensor w1_host = random_bf16({H, K}, rng, 1.0f / std::sqrt(static_cast<float>(K)));
  const Tensor b1_host = random_bf16({H}, rng, 0.5f);
  const Tensor w2_host = random_bf16({V, H}, rng, 1.0f / std::sqrt(static_cast<float>(H)));
  const Tensor w1 = w1_host.to(Device::CUDA), b1 = b1_host.to(Device::CUDA);
  const Tensor w2 = w2_host.to(Device::CUDA);
  Tensor x = Tensor::empty({M, K}, DType::BF16, Device::CUDA);
  Tensor h = Tensor::empty({M, H}, DType::BF16, Device::CUDA);
  Tensor logits = Tensor::empty({M, V}, DType::F32, Device::CUDA);

  {  // the workspace exists before capture (as after any eager step)
    Tensor warm = Tensor::empty({1, 8}, DType::BF16, Device::CUDA);
    const Tensor xw = random_bf16({1, 16}, rng, 1.0f).to(Device::CUDA);
    const Tensor ww = random_bf16({8, 16}, rng, 1.0f).to(Device::CUDA);
    ops::linear(warm, xw, ww);
    cuda::synchronize();
  }
  const cuda::LinearStats s0 = cuda::linear_stats();
  const cuda::AllocatorStats a0 = cuda::allocator().stats();

  const cudaStream_t stream = cuda::current_stream();
  cudaGraph_t graph = nullptr;
  {
    LLMK_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    CaptureGuard guard{stream};
    ops::linear(h, x, w1, &b1);
    ops::linear(logits, h, w2);
    guard.open = false;
    LLMK_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  }
  cudaGraphExec_t exec = nullptr;
  LLMK_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  const cuda::LinearStats s1 = cuda::linear_stats();
  EXPECT_EQ(s1.plans, s0.plans + 2);  // both planned during capture
  EXPECT_EQ(s1.calls, s0.calls + 2);

  const Tensor w1_32 = to_f32(w1_host), b1_32 = to_f32(b1_host), w2_32 = to_f32(w2_host);
  for (int replay = 0; replay < 3; ++replay) {
    const Tensor x_host = random_bf16({M, K}, rng, 1.0f);  // new inputs, same buffer
    cuda::memcpy_sync(x.data(), x_host.data(), static_cast<size_t>(x_host.nbytes()),
                      cudaMemcpyHostToDevice);
    LLMK_CUDA_CHECK(cudaMemsetAsync(h.data(), 0xFF, static_cast<size_t>(h.nbytes()), stream));
    LLMK_CUDA_CHECK(
        cudaMemsetAsync(logits.data(), 0xFF, static_cast<size_t>(logits.nbytes()), stream));
    LLMK_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    cuda::synchronize();

    Tensor h_ref = Tensor::empty({M, H}, DType::F32);
    ops::linear(h_ref, to_f32(x_host), w1_32, &b1_32);
    expect_within(compare(h.to(Device::CPU), h_ref), tolerance_for(DType::BF16),
                  fmt::format("replay {}: h", replay));
    // The second product's reference starts from the GPU's own bf16 h, as the GPU did.
    Tensor logits_ref = Tensor::empty({M, V}, DType::F32);
    ops::linear(logits_ref, to_f32(h.to(Device::CPU)), w2_32);
    expect_within(compare(logits.to(Device::CPU), logits_ref), tolerance_for(DType::F32),
                  fmt::format("replay {}: logits", replay));
  }
  const cuda::AllocatorStats a1 = cuda::allocator().stats();
  EXPECT_EQ(a1.num_device_allocs, a0.num_device_allocs);
  EXPECT_EQ(cuda::linear_stats().plans, s1.plans);
  LLMK_CUDA_CHECK(cudaGraphExecDestroy(exec));
  LLMK_CUDA_CHECK(cudaGraphDestroy(graph));
}

// Tuning: the first problem of 64 rows or more in a bucket (M rounded up to a power of two),
// met outside graph capture, times the heuristic's candidates once (and still matches the CPU);
// the bucket's later problems reuse the choice without timing; fewer rows, a first sight inside
// a capture, or tuning switched off take the heuristic's first without timing. Shapes no other
// test uses.
TEST_F(Linear, NewProblemsOf64RowsOrMoreAreTunedOncePerBucketOutsideCapture) {
  Rng rng(31);
  constexpr int64_t N = 768, K = 640;
  const Tensor w_host = random_bf16({N, K}, rng, 1.0f / std::sqrt(static_cast<float>(K)));
  const Tensor w = w_host.to(Device::CUDA), w32 = to_f32(w_host);
  const auto run = [&](int64_t M, const std::string& what) {
    const Tensor x_host = random_bf16({M, K}, rng, 1.0f);
    Tensor out = poisoned_cuda({M, N}, DType::BF16);
    ops::linear(out, x_host.to(Device::CUDA), w);
    Tensor ref = Tensor::empty({M, N}, DType::F32);
    ops::linear(ref, to_f32(x_host), w32);
    expect_within(compare(out.to(Device::CPU), ref), tolerance_for(DType::BF16), what);
  };
  const cuda::LinearStats s0 = cuda::linear_stats();
  run(160, "M=160, first sight");
  const cuda::LinearStats s1 = cuda::linear_stats();
  EXPECT_EQ(s1.plans, s0.plans + 1);
  EXPECT_EQ(s1.tuned, s0.tuned + 1) << "a new 160-row problem was not tuned";
  run(160, "M=160, planned");
  run(255, "M=255, same bucket");
  run(63, "M=63");
  const cuda::LinearStats s2 = cuda::linear_stats();
  EXPECT_EQ(s2.plans, s1.plans + 2);
  EXPECT_EQ(s2.tuned, s1.tuned) << "a plan was tuned again, or its bucket, or a 63-row one";
  run(257, "M=257, next bucket");
  EXPECT_EQ(cuda::linear_stats().tuned, s2.tuned + 1) << "the next bucket was not tuned";

  cuda::set_linear_tuning(false);
  run(96, "M=96, tuning off");
  cuda::set_linear_tuning(true);
  const cuda::LinearStats s3 = cuda::linear_stats();
  EXPECT_EQ(s3.plans, s2.plans + 2);
  EXPECT_EQ(s3.tuned, s2.tuned + 1) << "tuning switched off still tuned";

  // First sight inside a capture, in a bucket never tuned: planned without timing; the replay
  // computes the product.
  constexpr int64_t M = 100;
  const Tensor x_host = random_bf16({M, K}, rng, 1.0f);
  const Tensor x = x_host.to(Device::CUDA);
  Tensor out = poisoned_cuda({M, N}, DType::BF16);
  cuda::synchronize();
  const cudaStream_t stream = cuda::current_stream();
  cudaGraph_t graph = nullptr;
  {
    LLMK_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    CaptureGuard guard{stream};
    ops::linear(out, x, w);
    guard.open = false;
    LLMK_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  }
  const cuda::LinearStats s4 = cuda::linear_stats();
  EXPECT_EQ(s4.plans, s3.plans + 1);
  EXPECT_EQ(s4.tuned, s3.tuned) << "a plan made inside a capture was tuned";
  cudaGraphExec_t exec = nullptr;
  LLMK_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  LLMK_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  cuda::synchronize();
  Tensor ref = Tensor::empty({M, N}, DType::F32);
  ops::linear(ref, to_f32(x_host), w32);
  expect_within(compare(out.to(Device::CPU), ref), tolerance_for(DType::BF16), "M=100, captured");
  LLMK_CUDA_CHECK(cudaGraphExecDestroy(exec));
  LLMK_CUDA_CHECK(cudaGraphDestroy(graph));
}

// linear_add: out += x @ w^T (+ bias), the sum in cuBLASLt's epilogue and rounded once. Against
// the CPU's f32 out + linear, at one row (cuBLASLt, not the one-row kernel), a few rows, and a
// first sight of 96 rows, whose tuning times its candidates into a scratch matrix: had they
// written out, what it adds to would be lost.
TEST_F(Linear, AddAccumulatesIntoOut) {
  Rng rng(41);
  constexpr int64_t N = 200, K = 328;
  const Tensor w_host = random_bf16({N, K}, rng, 1.0f / std::sqrt(static_cast<float>(K)));
  const Tensor b_host = random_bf16({N}, rng, 0.5f);
  const Tensor w = w_host.to(Device::CUDA), b = b_host.to(Device::CUDA);
  const Tensor w32 = to_f32(w_host), b32 = to_f32(b_host);
  for (DType out_dtype : {DType::BF16, DType::F32}) {
    for (int64_t M : {1, 7, 96}) {
      for (bool bias : {false, true}) {
        const std::string what = fmt::format("M={} out {} bias {}", M, dtype_name(out_dtype), bias);
        const Tensor x_host = random_bf16({M, K}, rng, 1.0f);
        const Tensor start_host = out_dtype == DType::BF16 ? random_bf16({M, N}, rng, 4.0f)
                                                           : random_f32({M, N}, rng, 4.0f);
        Tensor out = start_host.to(Device::CUDA);
        const cuda::LinearStats s0 = cuda::linear_stats();
        ops::linear_add(out, x_host.to(Device::CUDA), w, bias ? &b : nullptr);
        const cuda::LinearStats s1 = cuda::linear_stats();
        EXPECT_EQ(s1.gemv, s0.gemv) << what << ": the one-row kernel does not add to out";
        if (M == 96 && out_dtype == DType::BF16 && !bias) {
          EXPECT_EQ(s1.tuned, s0.tuned + 1) << what << ": the first sight was not tuned";
        }
        Tensor ref = to_f32(start_host);
        ops::linear_add(ref, to_f32(x_host), w32, bias ? &b32 : nullptr);
        expect_within(compare(out.to(Device::CPU), ref), tolerance_for(out_dtype), what);
      }
    }
  }
  // K = 0: out += bias, or stays as it was.
  const Tensor x0 = Tensor::empty({3, 0}, DType::BF16, Device::CUDA);
  const Tensor w0 = Tensor::empty({N, 0}, DType::BF16, Device::CUDA);
  const Tensor start_host = random_bf16({3, N}, rng, 1.0f);
  Tensor same = start_host.to(Device::CUDA);
  ops::linear_add(same, x0, w0);
  expect_within(compare(same.to(Device::CPU), to_f32(start_host)), Tolerance{0, 0}, "K=0");
  Tensor plus = start_host.to(Device::CUDA);
  ops::linear_add(plus, x0, w0, &b);
  Tensor ref = to_f32(start_host);
  ops::linear_add(ref, Tensor::empty({3, 0}, DType::F32), Tensor::empty({N, 0}, DType::F32), &b32);
  expect_within(compare(plus.to(Device::CPU), ref), tolerance_for(DType::BF16), "K=0, bias");
}

// Under ops::BatchInvariance a row's output is the same bits whatever the other rows and their
// count (M = 1 takes cuBLASLt too, with the algorithm every M takes); with a bias in the
// epilogue, f32 out (the LM head's), and added to out (the residual).
TEST_F(Linear, BatchInvariantRowsDoNotDependOnM) {
  Rng rng(41);
  const ops::BatchInvariance invariant(true);
  for (const auto& [N, K] : {std::pair<int64_t, int64_t>{576, 576}, {1536, 576}, {4096, 1024}}) {
    const int64_t big = 77;
    const Tensor x = random_bf16({big, K}, rng, 1.0f).to(Device::CUDA);
    const Tensor w = random_bf16({N, K}, rng, 1.0f / 16).to(Device::CUDA);
    const Tensor b = random_bf16({N}, rng, 0.5f).to(Device::CUDA);
    for (const DType out_t : {DType::BF16, DType::F32}) {
      for (const bool add : {false, true}) {
        const std::string what = "N=" + std::to_string(N) + " K=" + std::to_string(K) + " out " +
                                 std::string(dtype_name(out_t)) + (add ? " added" : "");
        const Tensor base = random_bf16({big, N}, rng, 1.0f);
        Tensor all = Tensor::empty({big, N}, out_t);
        ops::copy(all, base);
        all = all.to(Device::CUDA);
        std::vector<Tensor> rows;
        for (const int64_t m : {int64_t{1}, int64_t{3}, int64_t{16}, big}) {
          Tensor fresh = Tensor::empty({m, N}, out_t, Device::CUDA);
          ops::copy(fresh, all.slice(0, 0, m));
          if (add) {
            ops::linear_add(fresh, x.slice(0, 0, m), w, &b);
          } else {
            ops::linear(fresh, x.slice(0, 0, m), w, &b);
          }
          rows.push_back(fresh.slice(0, 0, 1).to(Device::CPU));
        }
        const int64_t bytes = rows[0].nbytes();
        for (size_t i = 1; i < rows.size(); ++i) {
          EXPECT_EQ(std::memcmp(rows[0].data(), rows[i].data(), static_cast<size_t>(bytes)), 0)
              << what << ": row 0 of M=1 differs from row 0 of the " << i << "th M";
        }
      }
    }
  }
}

TEST_F(Linear, ArgumentErrors) {
  Rng rng(31);
  const Tensor x = random_bf16({3, 64}, rng, 1.0f).to(Device::CUDA);
  const Tensor w = random_bf16({10, 64}, rng, 1.0f).to(Device::CUDA);
  Tensor out = Tensor::empty({3, 10}, DType::BF16, Device::CUDA);

  // A block type the GPU kernels do not read (qlinear_test.cpp has the ones they do).
  const Tensor wq = Tensor::empty({10, 256}, DType::Q3_K, Device::CUDA);
  const Tensor x256 = random_bf16({3, 256}, rng, 1.0f).to(Device::CUDA);
  std::string msg = error_message([&] { ops::linear(out, x256, wq); });
  EXPECT_NE(msg.find("ops::linear: w is q3_k"), std::string::npos) << msg;
  EXPECT_NE(msg.find("dequantise the others at load"), std::string::npos) << msg;

  // x and w share one dtype (bf16, f16 or f32); out may be any of the three.
  const Tensor x_f32 = Tensor::empty({3, 64}, DType::F32, Device::CUDA);
  msg = error_message([&] { ops::linear(out, x_f32, w); });
  EXPECT_NE(msg.find("ops::linear: w is bf16[10, 64]@cuda but x is f32[3, 64]@cuda: they must "
                     "share one dtype"),
            std::string::npos)
      << msg;

  Tensor out_i32 = Tensor::empty({3, 10}, DType::I32, Device::CUDA);
  msg = error_message([&] { ops::linear(out_i32, x, w); });
  EXPECT_NE(msg.find("out is i32[3, 10]@cuda but must be bf16, f16 or f32 on CUDA"),
            std::string::npos)
      << msg;

  const Tensor b_bad = Tensor::empty({11}, DType::BF16, Device::CUDA);
  msg = error_message([&] { ops::linear(out, x, w, &b_bad); });
  EXPECT_NE(msg.find("bias"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[10]"), std::string::npos) << msg;

  const Tensor b_i32 = Tensor::empty({10}, DType::I32, Device::CUDA);
  msg = error_message([&] { ops::linear(out, x, w, &b_i32); });
  EXPECT_NE(msg.find("bias is i32[10]@cuda but must be bf16, f16 or f32"), std::string::npos)
      << msg;

  const Tensor x_cpu = Tensor::empty({3, 64}, DType::BF16);
  msg = error_message([&] { ops::linear(out, x_cpu, w); });
  EXPECT_NE(msg.find("one device"), std::string::npos) << msg;

  Tensor out_bad = Tensor::empty({3, 11}, DType::BF16, Device::CUDA);
  msg = error_message([&] { ops::linear(out_bad, x, w); });
  EXPECT_NE(msg.find("out"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[3, 10]"), std::string::npos) << msg;

  const Tensor xt = Tensor::empty({64, 3}, DType::BF16, Device::CUDA).transpose(0, 1);
  msg = error_message([&] { ops::linear(out, xt, w); });
  EXPECT_NE(msg.find("contiguous last dimension"), std::string::npos) << msg;

  Tensor xy = Tensor::empty({3, 74}, DType::BF16, Device::CUDA);
  Tensor xa = xy.slice(1, 0, 64), ya = xy.slice(1, 60, 70);  // columns 60..63 in both
  msg = error_message([&] { ops::linear(ya, xa, w); });
  EXPECT_NE(msg.find("overlaps"), std::string::npos) << msg;
}

}  // namespace
}  // namespace llmk
