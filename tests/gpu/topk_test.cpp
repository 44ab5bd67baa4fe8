// ops::topk_lse on CUDA against the same op on the CPU (tests/kernels/topk_test.cpp checks that
// one against a sorted reference): ids and values must match bit for bit, lse within 1e-6 of
// max(1, |lse|). Over the awkward cases of kernels/topk_cases.h (ties straddling the k-th place,
// -inf, NaN, +inf, k up to 1024, strides that reach both the 16-byte and the element-by-element
// loads) and a teacher-sized one: 300 rows of 262144 normal logits times 3, k = 64. Outputs are
// poisoned first (ids -1, values and lse all-ones NaN), so an element left unwritten fails.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/topk_cases.h"
#include "ops_gpu_util.h"

namespace llmk::gpu_test {
namespace {

constexpr uint32_t kPoisonBits = 0xFFFFFFFFu;  // what poisoned_cuda leaves in each 4 bytes

// Runs the op on the device and on the host over logits [rows, ld] (the first vocab columns) and
// compares.
void expect_matches_cpu(const std::vector<float>& x, int64_t rows, int64_t vocab, int64_t ld, int k,
                        const std::string& what, const std::vector<float>* lse_scale = nullptr) {
  Tensor host_buf = Tensor::borrow(const_cast<float*>(x.data()), {rows, ld}, DType::F32);
  const Tensor host = host_buf.slice(1, 0, vocab);
  const Tensor dev_buf = host_buf.to(Device::CUDA);
  const Tensor dev = dev_buf.slice(1, 0, vocab);

  Tensor ids_dev = poisoned_cuda({rows, k}, DType::I32);
  Tensor values_dev = poisoned_cuda({rows, k}, DType::F32);
  Tensor lse_dev = poisoned_cuda({rows}, DType::F32);
  Tensor scale_host =
      lse_scale ? Tensor::borrow(const_cast<float*>(lse_scale->data()), {rows}, DType::F32)
                : Tensor();
  const Tensor scale_dev = lse_scale ? scale_host.to(Device::CUDA) : Tensor();
  ops::topk_lse(ids_dev, values_dev, lse_dev, dev, lse_scale ? &scale_dev : nullptr);
  const Tensor ids = ids_dev.to(Device::CPU), values = values_dev.to(Device::CPU),
               lse = lse_dev.to(Device::CPU);

  Tensor ids_ref = Tensor::empty({rows, k}, DType::I32);
  Tensor values_ref = Tensor::empty({rows, k}, DType::F32);
  Tensor lse_ref = Tensor::empty({rows}, DType::F32);
  ops::topk_lse(ids_ref, values_ref, lse_ref, host, lse_scale ? &scale_host : nullptr);

  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = r * k; j < (r + 1) * k; ++j) {
      ASSERT_EQ(ids.data<int32_t>()[j], ids_ref.data<int32_t>()[j])
          << what << " row " << r << " place " << j - r * k;
      ASSERT_EQ(values.data<uint32_t>()[j], values_ref.data<uint32_t>()[j])
          << what << " row " << r << " place " << j - r * k << ": " << values.data<float>()[j]
          << " vs " << values_ref.data<float>()[j];
    }
    const float got = lse.data<float>()[r], want = lse_ref.data<float>()[r];
    ASSERT_NE(std::bit_cast<uint32_t>(got), kPoisonBits) << what << " row " << r << ": no lse";
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << what << " row " << r << ": lse " << got;
    } else if (std::isinf(want)) {
      EXPECT_EQ(got, want) << what << " row " << r;
    } else {
      EXPECT_NEAR(got, want, 1e-6 * std::max(1.0f, std::abs(want))) << what << " row " << r;
    }
  }
}

using CudaOpTopkLse = CudaOpTest;

TEST_F(CudaOpTopkLse, AwkwardCasesMatchCpuExactly) {
  uint32_t seed = 100;
  for (const test::TopkCase& c : test::topk_cases()) {
    const std::vector<float> x = test::topk_logits(c, seed++);
    expect_matches_cpu(x, c.rows, c.vocab, c.ld, c.k, c.label());
    if (HasFatalFailure()) return;
  }
}

TEST_F(CudaOpTopkLse, TeacherSizedRowsMatchCpuExactly) {
  const int64_t rows = 300, vocab = 262144;
  std::vector<float> x(static_cast<size_t>(rows * vocab));
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (float& v : x) v = normal(rng);
  expect_matches_cpu(x, rows, vocab, vocab, 64, "rows=300 vocab=262144 k=64");
}

// A sampler's normaliser at per-row temperatures (lse_scale: 1 / T), the awkward cases too.
TEST_F(CudaOpTopkLse, ScaledLseMatchesCpu) {
  uint32_t seed = 300;
  for (const test::TopkCase& c : test::topk_cases()) {
    const std::vector<float> x = test::topk_logits(c, seed++);
    std::vector<float> scale(static_cast<size_t>(c.rows));
    for (size_t r = 0; r < scale.size(); ++r) scale[r] = 1.0f / (0.3f + 0.4f * (r % 4));
    expect_matches_cpu(x, c.rows, c.vocab, c.ld, c.k, c.label() + " scaled", &scale);
    if (HasFatalFailure()) return;
  }
}

TEST_F(CudaOpTopkLse, ArgumentErrors) {
  const Tensor logits = poisoned_cuda({2, 8}, DType::F32);
  Tensor ids = poisoned_cuda({2, 9}, DType::I32), values = poisoned_cuda({2, 9}, DType::F32);
  Tensor lse = poisoned_cuda({2}, DType::F32);
  EXPECT_NE(error_message([&] { ops::topk_lse(ids, values, lse, logits); }).find("k = 9"),
            std::string::npos);
  Tensor lse_host = Tensor::empty({2}, DType::F32);
  Tensor ids2 = poisoned_cuda({2, 2}, DType::I32), values2 = poisoned_cuda({2, 2}, DType::F32);
  EXPECT_NE(
      error_message([&] { ops::topk_lse(ids2, values2, lse_host, logits); }).find("one device"),
      std::string::npos);
}

}  // namespace
}  // namespace llmk::gpu_test
