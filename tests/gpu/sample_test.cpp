// ops::sample_gumbel on CUDA against the CPU op on the same logits: the same token in every row,
// bit for bit (the noise and the keys are computed alike on both: kernels/gumbel.h), over
// temperatures, min-p floors, awkward widths, a vocabulary-sized row and strided rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "core/cuda/device.h"
#include "ops/ops.h"

namespace llmk {
namespace {

TEST(SampleGumbelGpu, SameTokensAsTheCpu) {
  cuda::init();
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> logit(-8.0f, 8.0f);
  const float temps[] = {0.3f, 1.0f, 1.7f};
  const float min_ps[] = {0.0f, 0.05f, 0.5f};
  int compared = 0;
  for (const auto& [rows, N] :
       std::vector<std::pair<int64_t, int64_t>>{{300, 1000}, {64, 7}, {17, 4099}, {4, 151936}}) {
    Tensor wide = Tensor::empty({rows, N + 3}, DType::F32);  // rows N + 3 apart
    for (int64_t i = 0; i < wide.numel(); ++i) wide.data<float>()[i] = logit(rng);
    const Tensor x = wide.slice(1, 0, N);
    Tensor t = Tensor::empty({rows}, DType::F32), p = Tensor::empty({rows}, DType::F32);
    Tensor s = Tensor::empty({rows}, DType::I64);
    for (int64_t r = 0; r < rows; ++r) {
      t.data<float>()[r] = temps[r % 3];
      p.data<float>()[r] = min_ps[(r / 3) % 3];
      s.data<int64_t>()[r] = static_cast<int64_t>(rng()) << 20 | r;
    }
    Tensor cpu = Tensor::empty({rows}, DType::I32);
    ops::sample_gumbel(cpu, x, t, p, s);
    const Tensor wide_dev = wide.to(Device::CUDA);
    Tensor gpu = Tensor::empty({rows}, DType::I32, Device::CUDA);
    ops::sample_gumbel(gpu, wide_dev.slice(1, 0, N), t.to(Device::CUDA), p.to(Device::CUDA),
                       s.to(Device::CUDA));
    const Tensor got = gpu.to(Device::CPU);
    for (int64_t r = 0; r < rows; ++r) {
      EXPECT_EQ(got.data<int32_t>()[r], cpu.data<int32_t>()[r])
          << "rows " << rows << " N " << N << " row " << r;
      ++compared;
    }
  }
  EXPECT_EQ(compared, 385);
}

// ops::apply_penalties on CUDA: the same bits as the CPU op, over rows of a vocabulary's width
// with strided rows (the penalty arithmetic is shared: kernels/penalty.h).
TEST(ApplyPenaltiesGpu, SameBitsAsTheCpu) {
  cuda::init();
  std::mt19937 rng(8);
  std::uniform_real_distribution<float> logit(-8.0f, 8.0f);
  constexpr int64_t kRows = 37, kVocab = 32003;
  Tensor wide = Tensor::empty({kRows, kVocab + 5}, DType::F32);
  for (int64_t i = 0; i < wide.numel(); ++i) wide.data<float>()[i] = logit(rng);
  std::vector<int32_t> at;
  std::vector<float> by;
  for (int64_t r = 0; r < kRows; ++r) {
    std::vector<int32_t> ids;
    for (int k = 0; k < 1 + static_cast<int>(r * 7 % 90); ++k) ids.push_back(rng() % kVocab);
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    for (const int32_t id : ids) {
      at.insert(at.end(), {static_cast<int32_t>(r), id});
      by.insert(by.end(), {rng() % 2 ? 1.3f : 1.0f, static_cast<float>(rng() % 5) * 0.35f});
    }
  }
  const auto n = static_cast<int64_t>(by.size() / 2);
  const Tensor t_at = Tensor::borrow(at.data(), {n, 2}, DType::I32);
  const Tensor t_by = Tensor::borrow(by.data(), {n, 2}, DType::F32);
  Tensor dev = wide.to(Device::CUDA);
  Tensor dev_x = dev.slice(1, 0, kVocab);
  ops::apply_penalties(dev_x, t_at.to(Device::CUDA), t_by.to(Device::CUDA));
  Tensor cpu_x = wide.slice(1, 0, kVocab);
  ops::apply_penalties(cpu_x, t_at, t_by);
  const Tensor got = dev.to(Device::CPU);
  int64_t differ = 0;
  for (int64_t i = 0; i < wide.numel(); ++i) {
    differ += std::memcmp(got.data<float>() + i, wide.data<float>() + i, sizeof(float)) != 0;
  }
  EXPECT_EQ(differ, 0) << "of " << wide.numel() << " logits (" << n << " penalised)";
}

}  // namespace
}  // namespace llmk
