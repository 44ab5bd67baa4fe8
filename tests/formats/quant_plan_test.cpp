// The type each tensor takes under `llmk quantize --type` (formats/quant_plan.h), and the Q4_K_M
// rule against a file llama.cpp's llama-quantize wrote: Gemma 3 270M Q4_K_M of
// scripts/fetch-models.sh (rows of 640 make it take the fallbacks too).
#include "formats/quant_plan.h"

#include <gtest/gtest.h>

#include "formats/gguf.h"
#include "test_paths.h"

namespace llmk::quant {
namespace {

const ModelShape kEightLayers{.n_layers = 8, .has_output = true};

DType type_of(Scheme s, const std::string& name, const Shape& shape,
              const ModelShape& m = kEightLayers) {
  return plan_tensor(s, name, shape, DType::BF16, m).dtype;
}

TEST(QuantPlan, ParsesTheTypeNames) {
  EXPECT_EQ(parse_scheme("q4_k_m"), Scheme::Q4_K_M);
  EXPECT_EQ(parse_scheme("Q8_0"), Scheme::Q8_0);
  EXPECT_EQ(parse_scheme("bf16"), Scheme::BF16);
  EXPECT_FALSE(parse_scheme("q3_k").has_value());
  EXPECT_FALSE(parse_scheme("").has_value());
  EXPECT_EQ(scheme_name(Scheme::Q5_K), "q5_k");
  EXPECT_EQ(llama_file_type(Scheme::Q4_K_M), 15u);
  EXPECT_EQ(llama_file_type(Scheme::Q8_0), 7u);
  EXPECT_NE(scheme_names().find("q4_0, q4_1"), std::string::npos);
}

TEST(QuantPlan, OneDimensionalTensorsBecomeF32AndNormsKeepTheirType) {
  for (const Scheme s : {Scheme::Q4_0, Scheme::Q4_K_M, Scheme::F16}) {
    EXPECT_EQ(type_of(s, "blk.0.attn_norm.weight", {256}), DType::F32);
    EXPECT_EQ(type_of(s, "blk.0.attn_q.bias", {256}), DType::F32);
    EXPECT_EQ(type_of(s, "rope_freqs.weight", {32}), DType::F32);
    EXPECT_EQ(type_of(s, "blk.0.some_norm.weight", {4, 256}), DType::BF16);
    EXPECT_EQ(type_of(s, "blk.0.not_a_weight", {4, 256}), DType::BF16);
  }
  EXPECT_EQ(plan_tensor(Scheme::Q8_0, "output_norm.weight", {576}, DType::BF16, kEightLayers).why,
            "1-D");
}

TEST(QuantPlan, SingleTypesQuantiseEveryMatrixEmbeddingsIncluded) {
  EXPECT_EQ(type_of(Scheme::Q8_0, "token_embd.weight", {512, 256}), DType::Q8_0);
  EXPECT_EQ(type_of(Scheme::Q8_0, "output.weight", {512, 256}), DType::Q8_0);
  EXPECT_EQ(type_of(Scheme::Q4_1, "blk.3.ffn_down.weight", {256, 512}), DType::Q4_1);
  EXPECT_EQ(type_of(Scheme::Q6_K, "blk.3.attn_v.weight", {64, 256}), DType::Q6_K);
  EXPECT_EQ(type_of(Scheme::F16, "blk.3.attn_v.weight", {64, 256}), DType::F16);
}

TEST(QuantPlan, Q4KMFollowsLlamaCppsRule) {
  // 8 layers: use_more_bits is true for 0 (< 8/8), 7 (>= 56/8), 3 and 6 ((i - 1) % 3 == 2).
  for (int layer = 0; layer < 8; ++layer) {
    const std::string b = "blk." + std::to_string(layer) + ".";
    const DType more =
        layer == 0 || layer == 3 || layer == 6 || layer == 7 ? DType::Q6_K : DType::Q4_K;
    EXPECT_EQ(type_of(Scheme::Q4_K_M, b + "attn_v.weight", {64, 256}), more) << layer;
    EXPECT_EQ(type_of(Scheme::Q4_K_M, b + "ffn_down.weight", {256, 512}), more) << layer;
    EXPECT_EQ(type_of(Scheme::Q4_K_M, b + "attn_k.weight", {64, 256}), DType::Q4_K) << layer;
    EXPECT_EQ(type_of(Scheme::Q4_K_M, b + "attn_qkv.weight", {384, 256}), DType::Q5_K) << layer;
  }
  EXPECT_EQ(type_of(Scheme::Q4_K_M, "output.weight", {512, 256}), DType::Q6_K);
  EXPECT_EQ(type_of(Scheme::Q4_K_M, "token_embd.weight", {512, 256}), DType::Q4_K);
  const ModelShape tied{.n_layers = 8, .has_output = false};
  EXPECT_EQ(type_of(Scheme::Q4_K_M, "token_embd.weight", {512, 256}, tied), DType::Q6_K);
}

TEST(QuantPlan, RowsThatAreNotWholeBlocksFallBackAsLlamaCppDoes) {
  EXPECT_EQ(type_of(Scheme::Q4_K, "blk.0.attn_q.weight", {640, 640}), DType::Q5_0);
  EXPECT_EQ(type_of(Scheme::Q5_K, "blk.0.attn_q.weight", {640, 640}), DType::Q5_1);
  EXPECT_EQ(type_of(Scheme::Q6_K, "blk.0.attn_q.weight", {640, 640}), DType::Q8_0);
  EXPECT_EQ(type_of(Scheme::Q4_K_M, "output.weight", {512, 640}), DType::Q8_0);
  // Not even 32-blocks: the float type stays.
  EXPECT_EQ(type_of(Scheme::Q4_K, "blk.0.attn_q.weight", {640, 200}), DType::BF16);
  EXPECT_EQ(type_of(Scheme::Q8_0, "blk.0.attn_q.weight", {640, 200}), DType::BF16);
  const TensorPlan p = plan_tensor(Scheme::Q8_0, "x.weight", {4, 200}, DType::F16, kEightLayers);
  EXPECT_EQ(p.dtype, DType::F16);
  EXPECT_EQ(p.why, "row of 200 is not whole q8_0 blocks");
}

TEST(QuantPlan, Q4KMMatchesLlamaQuantizeOnGemma3) {
  const gguf::File f = gguf::File::open(test::model_path(test::kGemma3));
  ModelShape m{.n_layers = f.get_int("gemma3.block_count"), .has_output = false};
  m.has_output = f.find_tensor("output.weight") != nullptr;
  int checked = 0;
  for (const gguf::TensorInfo& t : f.tensors()) {
    EXPECT_EQ(plan_tensor(Scheme::Q4_K_M, t.name, t.shape, DType::BF16, m).dtype, t.dtype)
        << t.name;
    ++checked;
  }
  EXPECT_GT(checked, 200);
}

}  // namespace
}  // namespace llmk::quant
