// SmolLM2-135M-Instruct (GGUF Q4_1) on the CPU against Hugging Face transformers' float32 run
// of the same file (tests/fixtures/smollm2_reference.json, written by scripts/make-fixtures.py).
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>

#include "engine/generator.h"
#include "model/model.h"
#include "test_paths.h"
#include "tokenizer/tokenizer.h"

namespace llmk {
namespace {

// Largest |llmk - transformers| allowed over the reference's top-20 logits at any position.
// Both sides dequantise the same GGUF blocks exactly (bit-exact against the gguf package) and
// compute in float32, so what differs is float32 rounding in another summation order (blocked
// and vectorised dot products, another attention loop), amplified through 30 layers onto logits
// of magnitude 10-30. Measured on 2026-11-21: 5.9e-5. The bound keeps ~8x headroom for other
// CPUs and thread counts; it cannot approach 1e-6 without reproducing PyTorch's exact order
// of additions. It is still 20x smaller than the smallest top-1/top-2 gap in the fixture
// (0.010), so it also guarantees the top-1 agreement checked below is not a near-tie accident.
constexpr double kMaxLogitDiff = 5e-4;

struct Reference {
  nlohmann::json data;
  static const Reference& get() {
    static const Reference r = [] {
      std::ifstream in(test::source_path("tests/fixtures/smollm2_reference.json"));
      EXPECT_TRUE(in.good()) << "missing fixture tests/fixtures/smollm2_reference.json";
      Reference ref;
      in >> ref.data;
      return ref;
    }();
    return r;
  }
};

class SmolLM2Reference : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = Model::load(test::smollm2_path(), LoadOptions{.context = 256}).release();
    tok_ = new Tokenizer(Tokenizer::from_gguf(*model_->gguf()));
  }
  static void TearDownTestSuite() {
    delete model_;
    delete tok_;
  }
  static Model* model_;
  static Tokenizer* tok_;
};
Model* SmolLM2Reference::model_ = nullptr;
Tokenizer* SmolLM2Reference::tok_ = nullptr;

TEST_F(SmolLM2Reference, FixtureIsNotTrivial) {
  const auto& cases = Reference::get().data.at("cases");
  ASSERT_GE(cases.size(), 5u);
  for (const auto& c : cases) {
    ASSERT_FALSE(c.at("ids").empty());
    ASSERT_EQ(c.at("continuation").size(), 32u);
    ASSERT_EQ(c.at("top_ids").size(), c.at("ids").size() + 32);
  }
}

TEST_F(SmolLM2Reference, TokenIdsMatch) {
  for (const auto& c : Reference::get().data.at("cases")) {
    const auto want = c.at("ids").get<std::vector<int32_t>>();
    EXPECT_EQ(tok_->encode(c.at("text").get<std::string>(), false, true), want)
        << "text: " << c.at("text");
  }
}

TEST_F(SmolLM2Reference, LogitsMatchAtEveryPosition) {
  double worst = 0;
  for (const auto& c : Reference::get().data.at("cases")) {
    std::vector<int32_t> seq = c.at("ids").get<std::vector<int32_t>>();
    const auto cont = c.at("continuation").get<std::vector<int32_t>>();
    seq.insert(seq.end(), cont.begin(), cont.end());
    const Tensor logits = model_->forward(seq, 0, /*all_logits=*/true);
    ASSERT_EQ(logits.dim(0), static_cast<int64_t>(seq.size()));
    const int64_t vocab = logits.dim(1);
    const auto& top_ids = c.at("top_ids");
    const auto& top_logits = c.at("top_logits");
    for (size_t p = 0; p < seq.size(); ++p) {
      const float* row = logits.data<float>() + static_cast<int64_t>(p) * vocab;
      const auto argmax = static_cast<int32_t>(std::max_element(row, row + vocab) - row);
      EXPECT_EQ(argmax, top_ids[p][0].get<int32_t>()) << "position " << p << " of " << c.at("text");
      for (size_t j = 0; j < top_ids[p].size(); ++j) {
        const double d =
            std::abs(row[top_ids[p][j].get<int32_t>()] - top_logits[p][j].get<double>());
        worst = std::max(worst, d);
      }
    }
  }
  std::printf("largest top-20 logit difference vs transformers: %.6f\n", worst);
  EXPECT_LE(worst, kMaxLogitDiff);
  EXPECT_GT(worst, 0.0)
      << "identical to the last bit is implausible: is the fixture being compared?";
}

TEST_F(SmolLM2Reference, GreedyContinuationsMatch) {
  for (const auto& c : Reference::get().data.at("cases")) {
    const auto prompt = c.at("ids").get<std::vector<int32_t>>();
    GenerateOptions opts;
    opts.max_tokens = 32;
    opts.sampler.temperature = 0;
    opts.stop_at_eog = false;
    std::vector<int32_t> got;
    generate(*model_, *tok_, prompt, opts, [&](int32_t id, const std::string&) {
      got.push_back(id);
      return true;
    });
    EXPECT_EQ(got, c.at("continuation").get<std::vector<int32_t>>()) << "prompt: " << c.at("text");
  }
}

}  // namespace
}  // namespace llmk
