// SmolLM2 end to end on CUDA (bf16 weights and activations, fp32 accumulation) against the CPU
// path (fp32) on the same GGUF: logits of a batched prefill and of graph-replayed decode steps.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>

#include "core/cuda/device.h"
#include "engine/generator.h"
#include "model/model.h"
#include "ops/ops.h"
#include "test_paths.h"

namespace llmk {
namespace {

// Relative L2 error of one position's logits. The CUDA path rounds weights (dequantised Q4_1)
// and every activation to bf16 (8-bit mantissa, relative rounding 2^-9 = 0.2%), about ten
// roundings per layer over 30 layers; independent roundings add up like a random walk, to a few
// percent at most. Bound: 5e-2. The measured figure is printed.
constexpr double kMaxRelErr = 5e-2;
// Positions whose CPU top-1 the CUDA path must reproduce; near-ties may flip under bf16.
constexpr double kMinTop1 = 0.95;

double rel_err(const float* a, const float* ref, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(a[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return std::sqrt(num / den);
}

int64_t argmax(const float* x, int64_t n) { return std::max_element(x, x + n) - x; }

TEST(SmolLM2Gpu, CudaLogitsMatchTheCpuPath) {
  cuda::init();
  std::ifstream in(test::source_path("tests/fixtures/smollm2_reference.json"));
  ASSERT_TRUE(in.good());
  nlohmann::json ref;
  in >> ref;
  auto cpu = Model::load(test::smollm2_path(), {.context = 128, .device = Device::CPU});
  auto gpu = Model::load(test::smollm2_path(), {.context = 128, .device = Device::CUDA});
  const int64_t vocab = cpu->config().vocab_size;
  double worst = 0;
  int64_t agree = 0, total = 0;
  for (const auto& c : ref.at("cases")) {
    std::vector<int32_t> seq = c.at("ids").get<std::vector<int32_t>>();
    const auto cont = c.at("continuation").get<std::vector<int32_t>>();
    const auto n_prompt = static_cast<int64_t>(seq.size());
    seq.insert(seq.end(), cont.begin(), cont.end());
    const auto n = static_cast<int64_t>(seq.size());
    // CPU: every position in one pass.
    const Tensor cpu_logits = cpu->forward(seq, 0, true);
    // CUDA: the prompt as one prefill, then each continuation token as a graph-replayed step.
    Tensor gpu_logits = Tensor::empty({n, vocab}, DType::F32);
    Tensor pre = gpu_logits.slice(0, 0, n_prompt);
    ops::transfer(pre, gpu->forward({seq.data(), static_cast<size_t>(n_prompt)}, 0, true));
    SamplerConfig greedy;
    greedy.temperature = 0;
    Decoder dec(*gpu, greedy, /*cuda_graph=*/true);
    for (int64_t p = n_prompt; p < n; ++p) {
      dec.step(seq[static_cast<size_t>(p)], p);
      Tensor row = gpu_logits.slice(0, p, p + 1);
      ops::transfer(row, dec.last_logits());
    }
    for (int64_t p = 0; p < n; ++p) {
      const float* g = gpu_logits.data<float>() + p * vocab;
      const float* r = cpu_logits.data<float>() + p * vocab;
      ASSERT_TRUE(std::isfinite(g[0]) && std::isfinite(g[vocab - 1])) << "position " << p;
      const double e = rel_err(g, r, vocab);
      worst = std::max(worst, e);
      EXPECT_LE(e, kMaxRelErr) << "position " << p << " of " << c.at("text");
      agree += argmax(g, vocab) == argmax(r, vocab);
      ++total;
    }
  }
  const double top1 = static_cast<double>(agree) / static_cast<double>(total);
  std::printf("SmolLM2 CUDA vs CPU: worst relative logit error %.4f, top-1 agreement %.3f over %ld "
              "positions\n",
              worst, top1, static_cast<long>(total));
  EXPECT_GE(top1, kMinTop1);
  EXPECT_GT(worst, 0.0);
}

}  // namespace
}  // namespace llmk
