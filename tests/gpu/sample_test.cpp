// ops::sample_gumbel on CUDA against the CPU op on the same logits: the same token in every row,
// bit for bit (the noise and the keys are computed alike on both: kernels/gumbel.h), over
// temperatures, min-p floors, awkward widths, a vocabulary-sized row and strided rows.
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace llmk
