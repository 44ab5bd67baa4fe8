// ops::topk_lse on the CPU: a strided logits view gives what the kernel gives on a contiguous
// copy (tests/kernels/topk_test.cpp checks the kernel itself); argument errors.
#include "kernels/cpu/topk.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "ops/ops.h"
#include "ops/ops_test_util.h"

namespace llmk {
namespace {

using test::expect_error;
using test::random_tensor;

TEST(OpsTopkLse, StridedLogitsMatchTheKernel) {
  const int64_t rows = 5, vocab = 301;
  const int k = 9;
  Tensor buf = random_tensor({rows, vocab + 6}, 3, -4, 4);
  const Tensor logits = buf.slice(1, 2, 2 + vocab);
  Tensor ids = Tensor::empty({rows, k}, DType::I32);
  Tensor values = test::poisoned({rows, k});
  Tensor lse = test::poisoned({rows});
  ops::topk_lse(ids, values, lse, logits);

  const Tensor dense = logits.contiguous();
  std::vector<int32_t> want_ids(rows * k);
  std::vector<float> want_values(rows * k), want_lse(rows);
  cpu::topk_lse(want_ids.data(), want_values.data(), want_lse.data(), dense.data<const float>(),
                rows, vocab, vocab, k);
  for (int64_t i = 0; i < rows * k; ++i) {
    EXPECT_EQ(ids.data<int32_t>()[i], want_ids[static_cast<size_t>(i)]) << i;
    EXPECT_EQ(values.data<float>()[i], want_values[static_cast<size_t>(i)]) << i;
  }
  for (int64_t r = 0; r < rows; ++r) EXPECT_EQ(lse.data<float>()[r], want_lse[r]) << r;
  // Rows come out in descending order.
  for (int64_t r = 0; r < rows; ++r) {
    for (int j = 1; j < k; ++j) {
      EXPECT_GE(values.data<float>()[r * k + j - 1], values.data<float>()[r * k + j]);
    }
  }
}

// lse_scale: each row's log-sum-exp of its logits times its scale, against double sums; ids and
// values unchanged; a scale that is not finite and positive is refused.
TEST(OpsTopkLse, ScaledLseIsThatOfTheScaledRow) {
  const int64_t rows = 4, vocab = 1001;
  const int k = 5;
  const Tensor logits = random_tensor({rows, vocab}, 7, -6, 6);
  Tensor ids = Tensor::empty({rows, k}, DType::I32), ids1 = Tensor::empty({rows, k}, DType::I32);
  Tensor values = test::poisoned({rows, k}), values1 = test::poisoned({rows, k});
  Tensor lse = test::poisoned({rows}), lse1 = test::poisoned({rows});
  std::vector<float> s = {1.0f, 2.5f, 0.5f, 1.0f / 0.7f};
  const Tensor scale = Tensor::borrow(s.data(), {rows}, DType::F32);
  ops::topk_lse(ids, values, lse, logits, &scale);
  ops::topk_lse(ids1, values1, lse1, logits);
  for (int64_t r = 0; r < rows; ++r) {
    double m = -INFINITY, sum = 0;
    for (int64_t i = 0; i < vocab; ++i)
      m = std::max(m, double{logits.data<float>()[r * vocab + i] * s[r]});
    for (int64_t i = 0; i < vocab; ++i)
      sum += std::exp(double{logits.data<float>()[r * vocab + i] * s[r]} - m);
    EXPECT_NEAR(lse.data<float>()[r], m + std::log(sum), 1e-6 * std::abs(m + std::log(sum))) << r;
    if (r == 0) {
      EXPECT_EQ(lse.data<float>()[r], lse1.data<float>()[r]);  // scale 1: unchanged
    }
    for (int j = 0; j < k; ++j) {
      EXPECT_EQ(ids.data<int32_t>()[r * k + j], ids1.data<int32_t>()[r * k + j]);
      EXPECT_EQ(values.data<float>()[r * k + j], values1.data<float>()[r * k + j]);
    }
  }
  s[2] = 0.0f;
  expect_error([&] { ops::topk_lse(ids, values, lse, logits, &scale); },
               {"lse_scale[2] = 0 must be finite and > 0"});
  const Tensor short_scale = Tensor::borrow(s.data(), {rows - 1}, DType::F32);
  expect_error([&] { ops::topk_lse(ids, values, lse, logits, &short_scale); }, {"lse_scale"});
}

TEST(OpsTopkLse, NoRows) {
  const Tensor logits = Tensor::empty({0, 10}, DType::F32);
  Tensor ids = Tensor::empty({0, 3}, DType::I32);
  Tensor values = Tensor::empty({0, 3}, DType::F32);
  Tensor lse = Tensor::empty({0}, DType::F32);
  ops::topk_lse(ids, values, lse, logits);
}

TEST(OpsTopkLse, ArgumentErrors) {
  const Tensor logits = random_tensor({3, 10}, 1);
  Tensor ids = Tensor::empty({3, 4}, DType::I32);
  Tensor values = Tensor::empty({3, 4}, DType::F32);
  Tensor lse = Tensor::empty({3}, DType::F32);
  const auto call = [&](Tensor& i, Tensor& v, Tensor& l, const Tensor& x) {
    return [&] { ops::topk_lse(i, v, l, x); };
  };

  const Tensor logits16 = Tensor::zeros({3, 10}, DType::BF16);
  expect_error(call(ids, values, lse, logits16), {"ops::topk_lse", "logits", "f32"});
  const Tensor logits1 = random_tensor({10}, 1);
  expect_error(call(ids, values, lse, logits1), {"ops::topk_lse", "logits", "2 dimensions"});
  const Tensor logits_t = random_tensor({10, 3}, 1).transpose(0, 1);
  expect_error(call(ids, values, lse, logits_t),
               {"ops::topk_lse", "logits", "contiguous last dimension"});
  const Tensor logits0 = random_tensor({3, 0}, 1);
  expect_error(call(ids, values, lse, logits0), {"ops::topk_lse", "1 to 2^31 - 1"});

  Tensor ids_f = Tensor::empty({3, 4}, DType::F32);
  expect_error(call(ids_f, values, lse, logits), {"ops::topk_lse", "ids", "i32"});
  Tensor ids0 = Tensor::empty({3, 0}, DType::I32), values0 = Tensor::empty({3, 0}, DType::F32);
  expect_error(call(ids0, values0, lse, logits),
               {"ops::topk_lse", "k = 0", "[1, min(vocab = 10, 1024)]"});
  Tensor ids11 = Tensor::empty({3, 11}, DType::I32), values11 = Tensor::empty({3, 11}, DType::F32);
  expect_error(call(ids11, values11, lse, logits), {"ops::topk_lse", "k = 11", "vocab = 10"});
  const Tensor wide = random_tensor({1, 2000}, 1);
  Tensor ids_big = Tensor::empty({1, 1025}, DType::I32);
  Tensor values_big = Tensor::empty({1, 1025}, DType::F32), lse1 = Tensor::empty({1}, DType::F32);
  expect_error(call(ids_big, values_big, lse1, wide), {"ops::topk_lse", "k = 1025", "1024"});

  Tensor ids_rows = Tensor::empty({4, 4}, DType::I32);
  expect_error(call(ids_rows, values, lse, logits), {"ops::topk_lse", "ids", "[3, 4]"});
  Tensor values_k = Tensor::empty({3, 5}, DType::F32);
  expect_error(call(ids, values_k, lse, logits), {"ops::topk_lse", "values", "[3, 4]"});
  Tensor values_i = Tensor::empty({3, 4}, DType::I32);
  expect_error(call(ids, values_i, lse, logits), {"ops::topk_lse", "values", "f32"});
  Tensor lse4 = Tensor::empty({4}, DType::F32);
  expect_error(call(ids, values, lse4, logits), {"ops::topk_lse", "lse", "[3]"});

  Tensor ids_wide = Tensor::empty({3, 8}, DType::I32);
  Tensor ids_strided = ids_wide.slice(1, 0, 4);
  expect_error(call(ids_strided, values, lse, logits),
               {"ops::topk_lse", "ids", "must be contiguous"});
  // values and lse in one buffer, overlapping.
  Tensor shared = Tensor::empty({14}, DType::F32);
  Tensor values_s = shared.slice(0, 0, 12).view({3, 4}), lse_s = shared.slice(0, 11, 14);
  expect_error(call(ids, values_s, lse_s, logits), {"ops::topk_lse", "values", "lse", "overlaps"});
  // An output over the logits.
  Tensor logits_buf = random_tensor({3, 10}, 2);
  Tensor lse_over = Tensor::borrow(logits_buf.data(), {3}, DType::F32);
  expect_error(call(ids, values, lse_over, logits_buf),
               {"ops::topk_lse", "lse", "logits", "overlaps"});
}

TEST(OpsTopkLse, GpuTensorsNeedCuda) {
#ifdef LLMK_HAS_CUDA
  GTEST_SKIP() << "built with CUDA: GPU tensors are accepted (tests/gpu covers them)";
#else
  float dummy[40];
  const Tensor g = Tensor::borrow(dummy, {4, 10}, DType::F32, Device::CUDA);
  Tensor ids = Tensor::empty({4, 2}, DType::I32), values = Tensor::empty({4, 2}, DType::F32);
  Tensor lse = Tensor::empty({4}, DType::F32);
  expect_error([&] { ops::topk_lse(ids, values, lse, g); },
               {"ops::topk_lse", "logits", "not built with CUDA"});
#endif
}

}  // namespace
}  // namespace llmk
