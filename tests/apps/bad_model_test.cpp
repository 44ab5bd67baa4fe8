// The `llmk` binary on the family fixtures (tests/fixtures/families): `llmk logits` matches
// transformers, and broken Hugging Face folders give exactly one "llmk: error: ..." line naming
// the file and the key or tensor, with exit code 1.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "apps/cli_util.h"
#include "model/family_fixtures.h"

namespace {

namespace fs = std::filesystem;
using llmk::test::expect_clean_error;
using llmk::test::ScratchDir;

using Result = llmk::test::CliResult;

class BadModelCli : public ::testing::Test {
 protected:
  // `llmk logits` over `prompt` (default: the llama3 fixture's ids), to <dir>/logits.f32.
  Result logits(const std::string& model, const std::string& extra = "",
                std::vector<int32_t> prompt = {}) {
    const std::string ids = dir_.path() + "/ids.txt";
    if (prompt.empty()) prompt = llmk::test::FamilyReference::load("llama3").ids;
    std::string text;
    for (int32_t id : prompt) text += std::to_string(id) + " ";
    llmk::test::write_text(ids, text);
    return llmk::test::run_llmk("logits -m " + model + " --ids " + ids + " --out " + dir_.path() +
                                    "/logits.f32 -t 2 " + extra,
                                dir_.path());
  }

  ScratchDir dir_;
};

TEST_F(BadModelCli, LogitsOfEveryFamilyMatchTransformers) {
  for (const std::string& family : llmk::test::family_names()) {
    // 20 tokens as one prefill, the other 28 as decode steps.
    const auto ref = llmk::test::FamilyReference::load(family);
    const auto& ids = ref.ids;
    const Result r = logits(llmk::test::family_dir(family), "--prefill 20", ids);
    ASSERT_EQ(r.code, 0) << family << ": " << r.err;
    const std::string bytes = llmk::test::read_text(dir_.path() + "/logits.f32");
    ASSERT_EQ(bytes.size(), ids.size() * static_cast<size_t>(ref.vocab) * sizeof(float));
    const auto* got = reinterpret_cast<const float*>(bytes.data());
    for (size_t t = 0; t < ids.size(); ++t) {
      EXPECT_LE(llmk::test::row_rel_err(got + t * ref.vocab, ref.row(t), ref.vocab), 1e-4)
          << family << " position " << t;
    }
  }
}

TEST_F(BadModelCli, MissingShard) {
  const std::string folder = dir_.copy_family("qwen2", "qwen2");
  fs::remove(folder + "/model-00002-of-00002.safetensors");
  expect_clean_error(logits(folder), {"model-00002-of-00002.safetensors", "shard file is missing"});
}

TEST_F(BadModelCli, ShapeDisagreesWithConfig) {
  const std::string folder = dir_.copy_family("llama3", "llama3");
  llmk::test::edit_config(folder, [](auto& j) { j["num_key_value_heads"] = 2; });
  expect_clean_error(logits(folder),
                     {folder + "/model.safetensors: ",
                      "tensor 'model.layers.0.self_attn.k_proj.weight' has shape [64, 128]",
                      "needs [128, 128]", folder + "/config.json"});
}

TEST_F(BadModelCli, UnknownRopeScalingType) {
  const std::string folder = dir_.copy_family("llama3", "llama3");
  llmk::test::edit_config(folder, [](auto& j) { j["rope_parameters"]["rope_type"] = "dynamic"; });
  expect_clean_error(logits(folder), {folder + "/config.json: ",
                                      "rope_parameters.rope_type 'dynamic' is not supported"});
}

TEST_F(BadModelCli, UnsupportedDtype) {
  const std::string folder = dir_.copy_family("phi3", "phi3");
  const std::string file = folder + "/model.safetensors";
  std::string bytes = llmk::test::read_text(file);
  const size_t at = bytes.find("\"dtype\":\"F32\"");
  ASSERT_NE(at, std::string::npos);
  bytes.replace(at, 13, "\"dtype\":\"F64\"");
  llmk::test::write_text(file, bytes);
  expect_clean_error(logits(folder), {file + ": ", "unsupported dtype F64 for tensor '"});
}

}  // namespace
