// The prefill kernel through ops::attention_varlen (bf16 and fp16) against the CPU op (f32) on
// the same, rounded, inputs: fresh random q, k, v per case; outputs and LSE poisoned (NaN)
// before the launch; k and v rows past the batch's last key hold NaN, so a read past a
// sequence's keys shows up. Cases cover lengths 1, 17, 127, 1000 and 4099, causal (bottom-right
// when queries and keys differ in number, including sequences with more queries than keys,
// whose first rows see nothing) and not, GQA and MQA, head dims 64/80/96/112/128/256, sliding
// windows, softcap, mixed-length batches (empty sequences too), alone and combined.
//
// Tolerance as in attention_test.cpp, gpu_test::kAttentionOut: relative L2 error <= 1e-2 and
// max |error| <= 1e-2 max |ref| on outputs (the kernel rounds the softmax weights to 16 bits for
// the tensor cores, and the output is rounded). The LSE is computed from fp32 dot products of
// exactly representable inputs (the CPU reference in double): |error| <= 1e-3.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/cuda/check.h"
#include "core/cuda/device.h"
#include "core/cuda/stream.h"
#include "core/error.h"
#include "core/half.h"
#include "core/tensor.h"
#include "kernels/cuda/attention/attention.h"
#include "ops/ops.h"
#include "ops_gpu_util.h"

namespace llmk {
namespace {

using gpu_test::error_message;
using gpu_test::i32_host;
using gpu_test::poisoned_cuda;
using gpu_test::random_host;
using gpu_test::to_f32;

constexpr double kMaxLseAbs = 1e-3;

// Every test runs once per prefill kernel: kAuto (the wgmma kernel on an sm_90 device) and the
// portable mma.sync kernel.
class AttentionPrefillGpu : public ::testing::TestWithParam<cuda::PrefillKernel> {
 protected:
  void SetUp() override {
    cuda::init();
    cuda::set_prefill_kernel(GetParam());
  }
  void TearDown() override { cuda::set_prefill_kernel(cuda::PrefillKernel::kAuto); }
};

struct VarlenCase {
  std::vector<std::pair<int, int>> seqs;  // (queries, keys) per sequence
  int64_t Hq, Hkv, D;
  bool causal = true;
  int window = 0;
  float softcap = 0.0f;
  DType dtype = DType::BF16;
  bool lse = true;
};

std::string describe(const VarlenCase& c) {
  std::string s = "seqs=";
  char buf[160];
  for (const auto& [nq, nk] : c.seqs) {
    std::snprintf(buf, sizeof buf, "(%d,%d)", nq, nk);
    s.append(buf);
  }
  std::snprintf(buf, sizeof buf, " Hq/Hkv=%lld/%lld D=%lld causal=%d window=%d softcap=%g %s",
                static_cast<long long>(c.Hq), static_cast<long long>(c.Hkv),
                static_cast<long long>(c.D), c.causal ? 1 : 0, c.window,
                static_cast<double>(c.softcap), c.dtype == DType::F16 ? "f16" : "bf16");
  s.append(buf);
  return s;
}

// Host tensor of dtype whose rows [from, rows) hold NaN.
void nan_rows(Tensor& host, int64_t from) {
  const uint16_t nan = host.dtype() == DType::F16 ? 0x7e00 : 0x7fc0;
  const int64_t row = host.numel() / host.dim(0);
  std::fill(host.data<uint16_t>() + from * row, host.data<uint16_t>() + host.numel(), nan);
}

struct Result {
  std::vector<float> out, lse;
};

Result run_gpu(const VarlenCase& c, const Tensor& q, const Tensor& k, const Tensor& v,
               const Tensor& cu_q, const Tensor& cu_k, const ops::AttentionVarlenParams& p) {
  const Tensor qg = q.to(Device::CUDA), kg = k.to(Device::CUDA), vg = v.to(Device::CUDA);
  const Tensor cqg = cu_q.to(Device::CUDA), ckg = cu_k.to(Device::CUDA);
  Tensor out = poisoned_cuda(q.shape(), c.dtype);
  Tensor lse = poisoned_cuda({c.Hq, q.dim(0)}, DType::F32);
  const uint64_t prefill_before = ops::attention_stats().prefill;
  ops::attention_varlen(out, qg, kg, vg, cqg, ckg, p, c.lse ? &lse : nullptr);
  cuda::synchronize();
  EXPECT_EQ(ops::attention_stats().prefill, prefill_before + 1) << "the prefill call is counted";
  Result r;
  const Tensor o = to_f32(out.to(Device::CPU));
  r.out.assign(o.data<float>(), o.data<float>() + o.numel());
  const Tensor l = lse.to(Device::CPU);
  r.lse.assign(l.data<float>(), l.data<float>() + l.numel());
  return r;
}

void run_case(const VarlenCase& c, uint32_t seed) {
  SCOPED_TRACE(describe(c));
  std::vector<int32_t> cq{0}, ck{0};
  for (const auto& [nq, nk] : c.seqs) {
    cq.push_back(cq.back() + nq);
    ck.push_back(ck.back() + nk);
  }
  const int64_t Tq = cq.back(), Tk = ck.back(), spare = 7;
  const float qa = c.softcap > 0.0f ? 8.0f : 3.0f;
  const Tensor q = random_host({Tq, c.Hq, c.D}, c.dtype, seed, -qa, qa);
  Tensor k = random_host({Tk + spare, c.Hkv, c.D}, c.dtype, seed + 1);
  Tensor v = random_host({Tk + spare, c.Hkv, c.D}, c.dtype, seed + 2);
  nan_rows(k, Tk);
  nan_rows(v, Tk);
  const Tensor cu_q = i32_host(cq), cu_k = i32_host(ck);
  ops::AttentionVarlenParams p;
  p.causal = c.causal;
  p.window = c.window;
  p.softcap = c.softcap;

  Tensor ref = Tensor::empty({Tq, c.Hq, c.D}, DType::F32);
  Tensor ref_lse = Tensor::empty({c.Hq, Tq}, DType::F32);
  ops::attention_varlen(ref, to_f32(q), to_f32(k), to_f32(v), cu_q, cu_k, p,
                        c.lse ? &ref_lse : nullptr);

  const Result got = run_gpu(c, q, k, v, cu_q, cu_k, p);
  gpu_test::DiffAccumulator diff;
  for (size_t i = 0; i < got.out.size(); ++i) diff.add(got.out[i], ref.data<float>()[i]);
  const gpu_test::Diff err = diff.result();
  ASSERT_EQ(err.nonfinite, 0) << "non-finite outputs, the first at element " << err.first_nonfinite;
  ASSERT_GT(err.max_ref, 0.0) << "reference output is all zeros: the test would pass vacuously";
  gpu_test::expect_within(err, gpu_test::kAttentionOut, "attention output");

  if (c.lse) {
    double lse_err = 0;
    for (size_t i = 0; i < got.lse.size(); ++i) {
      const float g = got.lse[i], e = ref_lse.data<float>()[i];
      if (std::isinf(e)) {
        ASSERT_TRUE(std::isinf(g) && g < 0) << "lse element " << i << ": " << g << ", want -inf";
        continue;
      }
      ASSERT_TRUE(std::isfinite(g)) << "lse element " << i << " is " << g;
      lse_err = std::max(lse_err, std::abs(static_cast<double>(g) - e));
    }
    EXPECT_LE(lse_err, kMaxLseAbs) << "max lse error";
  }
}

TEST_P(AttentionPrefillGpu, SingleSequencesMatchCpu) {
  const VarlenCase cases[] = {
      {.seqs = {{1, 1}}, .Hq = 8, .Hkv = 8, .D = 64},
      {.seqs = {{17, 17}}, .Hq = 32, .Hkv = 8, .D = 128},
      {.seqs = {{127, 127}}, .Hq = 9, .Hkv = 3, .D = 256, .softcap = 30.0f},
      {.seqs = {{1000, 1000}}, .Hq = 14, .Hkv = 2, .D = 128, .window = 300},
      {.seqs = {{4099, 4099}}, .Hq = 8, .Hkv = 1, .D = 64, .lse = false},  // MQA
      {.seqs = {{4099, 4099}}, .Hq = 4, .Hkv = 2, .D = 128, .causal = false, .lse = false},
      {.seqs = {{1000, 1000}}, .Hq = 4, .Hkv = 4, .D = 256, .causal = false},
      {.seqs = {{127, 127}}, .Hq = 8, .Hkv = 2, .D = 64, .window = 1},
      // Bottom-right causal: fewer queries than keys, and more (the first rows see nothing).
      {.seqs = {{17, 1000}}, .Hq = 32, .Hkv = 8, .D = 128},
      {.seqs = {{127, 4099}}, .Hq = 8, .Hkv = 8, .D = 256, .window = 1000, .softcap = 50.0f},
      {.seqs = {{1000, 127}}, .Hq = 6, .Hkv = 3, .D = 64},
      {.seqs = {{17, 1}}, .Hq = 8, .Hkv = 4, .D = 128, .softcap = 5.0f},
      // Head dim 96 (Phi-3: 32 query heads, no GQA): two panels, the second half used.
      {.seqs = {{4099, 4099}}, .Hq = 4, .Hkv = 4, .D = 96},
      {.seqs = {{127, 1000}}, .Hq = 6, .Hkv = 2, .D = 96, .window = 300, .softcap = 30.0f},
      {.seqs = {{1000, 1000}}, .Hq = 3, .Hkv = 1, .D = 96, .causal = false, .lse = false},
      // ... and its tiling for many work items (prefill_d96.cu: 2 warpgroups where 128-row
      // tiles give every SM's two block slots one; here 288 and 264 on an H100's 132 SMs).
      {.seqs = {{1031, 1031}}, .Hq = 32, .Hkv = 32, .D = 96, .window = 300, .softcap = 30.0f},
      {.seqs = {{1000, 1000}, {127, 1000}, {1, 1}}, .Hq = 24, .Hkv = 8, .D = 96},
      // Grids resident at once in two rounds of one block per SM, the second round's work in
      // reverse (AttentionArgs::resident_rounds): Phi-3-mini's 512-token prompt (256 blocks of
      // 64 rows on an H100), and the case above (264 blocks of 128 rows, three sequences).
      {.seqs = {{512, 512}}, .Hq = 32, .Hkv = 32, .D = 96},
      // Head dims 80 and 112: the second panel a quarter and seven eighths used.
      {.seqs = {{1031, 1031}}, .Hq = 8, .Hkv = 2, .D = 80},
      {.seqs = {{127, 1000}}, .Hq = 4, .Hkv = 4, .D = 80, .window = 300, .softcap = 30.0f},
      {.seqs = {{1000, 1000}}, .Hq = 4, .Hkv = 1, .D = 112},
      {.seqs = {{513, 2049}}, .Hq = 2, .Hkv = 2, .D = 112, .causal = false, .lse = false},
  };
  uint32_t seed = 1000;
  for (const VarlenCase& c : cases) {
    run_case(c, seed += 10);
    if (HasFatalFailure()) return;
  }
}

TEST_P(AttentionPrefillGpu, MixedBatchesMatchCpu) {
  const std::vector<std::pair<int, int>> mixed = {{1, 1}, {17, 17}, {127, 300}, {1000, 1000},
                                                  {0, 5}, {33, 0},  {200, 129}, {5, 4099}};
  const VarlenCase cases[] = {
      {.seqs = mixed, .Hq = 32, .Hkv = 8, .D = 128},
      {.seqs = mixed, .Hq = 8, .Hkv = 1, .D = 64, .window = 64},
      {.seqs = mixed, .Hq = 9, .Hkv = 3, .D = 256, .softcap = 30.0f},
      {.seqs = mixed, .Hq = 14, .Hkv = 2, .D = 128, .window = 100, .softcap = 20.0f},
      {.seqs = {{17, 17}, {1000, 1000}, {1, 300}, {127, 127}},
       .Hq = 8,
       .Hkv = 2,
       .D = 64,
       .causal = false,
       .softcap = 10.0f},
      {.seqs = {{4099, 4099}, {1, 1}, {300, 4099}}, .Hq = 4, .Hkv = 2, .D = 128, .lse = false},
      {.seqs = {{1, 1}, {1, 1}, {1, 7}, {2, 3}}, .Hq = 4, .Hkv = 4, .D = 256},
      {.seqs = mixed, .Hq = 8, .Hkv = 8, .D = 96, .window = 100},
  };
  uint32_t seed = 2000;
  for (const VarlenCase& c : cases) {
    run_case(c, seed += 10);
    if (HasFatalFailure()) return;
  }
}

TEST_P(AttentionPrefillGpu, Fp16MatchesCpu) {
  const std::vector<std::pair<int, int>> mixed = {{1, 1}, {17, 17}, {127, 127}, {1000, 1300}};
  const VarlenCase cases[] = {
      {.seqs = mixed, .Hq = 8, .Hkv = 8, .D = 64, .dtype = DType::F16},
      {.seqs = mixed, .Hq = 32, .Hkv = 8, .D = 128, .window = 200, .dtype = DType::F16},
      {.seqs = mixed, .Hq = 6, .Hkv = 2, .D = 256, .softcap = 30.0f, .dtype = DType::F16},
      {.seqs = mixed, .Hq = 4, .Hkv = 2, .D = 96, .dtype = DType::F16},
      {.seqs = mixed, .Hq = 4, .Hkv = 4, .D = 112, .dtype = DType::F16},
      {.seqs = mixed, .Hq = 8, .Hkv = 8, .D = 80, .window = 100},
      {.seqs = {{1000, 1000}, {17, 4099}},
       .Hq = 4,
       .Hkv = 1,
       .D = 128,
       .causal = false,
       .dtype = DType::F16},
  };
  uint32_t seed = 3000;
  for (const VarlenCase& c : cases) {
    run_case(c, seed += 10);
    if (HasFatalFailure()) return;
  }
}

// The same inputs twice give the same bits: no race between the K/V stages and the readers.
TEST_P(AttentionPrefillGpu, RepeatableBitForBit) {
  const VarlenCase c{.seqs = {{1000, 1000}, {127, 2000}, {33, 33}}, .Hq = 16, .Hkv = 4, .D = 128};
  std::vector<int32_t> cq{0, 1000, 1127, 1160}, ck{0, 1000, 3000, 3033};
  const Tensor q = random_host({1160, 16, 128}, DType::BF16, 1, -3, 3);
  const Tensor k = random_host({3033, 4, 128}, DType::BF16, 2);
  const Tensor v = random_host({3033, 4, 128}, DType::BF16, 3);
  const ops::AttentionVarlenParams p;
  const Result a = run_gpu(c, q, k, v, i32_host(cq), i32_host(ck), p);
  const Result b = run_gpu(c, q, k, v, i32_host(cq), i32_host(ck), p);
  for (size_t i = 0; i < a.out.size(); ++i) {
    ASSERT_EQ(float_to_bits(a.out[i]), float_to_bits(b.out[i])) << "out element " << i;
  }
  for (size_t i = 0; i < a.lse.size(); ++i) {
    ASSERT_EQ(float_to_bits(a.lse[i]), float_to_bits(b.lse[i])) << "lse element " << i;
  }
}

TEST_P(AttentionPrefillGpu, ArgumentErrors) {
  const Tensor cq = i32_host({0, 4}).to(Device::CUDA), ck = i32_host({0, 8}).to(Device::CUDA);
  const Tensor q = random_host({4, 4, 64}, DType::BF16, 1).to(Device::CUDA);
  const Tensor k = random_host({8, 2, 64}, DType::BF16, 2).to(Device::CUDA);
  Tensor out = poisoned_cuda({4, 4, 64}, DType::BF16);

  const Tensor k16 = random_host({8, 2, 64}, DType::F16, 2).to(Device::CUDA);
  const std::string mixed =
      error_message([&] { ops::attention_varlen(out, q, k16, k16, cq, ck, {}); });
  EXPECT_NE(mixed.find("ops::attention_varlen: k"), std::string::npos) << mixed;

  ops::AttentionVarlenParams nc;
  nc.causal = false;
  nc.window = 16;
  const std::string win = error_message([&] { ops::attention_varlen(out, q, k, k, cq, ck, nc); });
  EXPECT_NE(win.find("causal"), std::string::npos) << win;

  // A head dim the tensor-core kernels are not built for (the fallback kernel takes it in
  // ops::attention, not here).
  const Tensor q72 = random_host({4, 4, 72}, DType::BF16, 1).to(Device::CUDA);
  const Tensor k72 = random_host({8, 2, 72}, DType::BF16, 2).to(Device::CUDA);
  Tensor out72 = poisoned_cuda({4, 4, 72}, DType::BF16);
  const std::string d72 =
      error_message([&] { ops::attention_varlen(out72, q72, k72, k72, cq, ck, {}); });
  EXPECT_NE(d72.find("head dim 72"), std::string::npos) << d72;
  EXPECT_NE(d72.find("64, 80, 96, 112, 128 or 256"), std::string::npos) << d72;

  const std::string host_cu = error_message([&] {
    ops::attention_varlen(out, q, k, k, i32_host({0, 4}), ck, {});
  });
  EXPECT_NE(host_cu.find("cu_q"), std::string::npos) << host_cu;

  Tensor lse_bad = poisoned_cuda({4, 5}, DType::F32);
  const std::string lse =
      error_message([&] { ops::attention_varlen(out, q, k, k, cq, ck, {}, &lse_bad); });
  EXPECT_NE(lse.find("lse"), std::string::npos) << lse;
}

INSTANTIATE_TEST_SUITE_P(Kernels, AttentionPrefillGpu,
                         ::testing::Values(cuda::PrefillKernel::kAuto, cuda::PrefillKernel::kWgmma,
                                           cuda::PrefillKernel::kMmaSync),
                         [](const ::testing::TestParamInfo<cuda::PrefillKernel>& p) {
                           return std::string(p.param == cuda::PrefillKernel::kAuto    ? "Auto"
                                              : p.param == cuda::PrefillKernel::kWgmma ? "Wgmma"
                                                                                       : "MmaSync");
                         });

}  // namespace
}  // namespace llmk
