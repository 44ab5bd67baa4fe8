// Broken Hugging Face folders (altered copies of the family fixtures): Model::load throws one
// llmk::Error line naming the file and the key or tensor.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <initializer_list>
#include <string_view>

#include "core/error.h"
#include "formats/gguf_writer.h"
#include "model/config.h"
#include "model/family_fixtures.h"
#include "model/model.h"

namespace llmk {
namespace {

using test::ScratchDir;

// Loads `folder`, expecting llmk::Error with every phrase in a single-line message.
std::string expect_load_error(const std::string& folder,
                              std::initializer_list<std::string_view> phrases) {
  try {
    Model::load(folder, LoadOptions{.context = 64});
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (std::string_view p : phrases) {
      EXPECT_NE(msg.find(p), std::string::npos) << "lacks '" << p << "': " << msg;
    }
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    return msg;
  }
  ADD_FAILURE() << folder << " loaded; expected an error with " << *phrases.begin();
  return "";
}

// Replaces the first `"dtype":"F32"` in the safetensors header of `file` with `dtype` (same
// length); returns the name of the tensor it belonged to.
std::string patch_first_dtype(const std::string& file, const std::string& dtype) {
  std::string bytes = test::read_text(file);
  const std::string from = "{\"dtype\":\"F32\"";
  const size_t at = bytes.find(from);
  EXPECT_NE(at, std::string::npos);
  EXPECT_LT(at, 8 + 100000u);  // inside the header
  bytes.replace(at, from.size(), "{\"dtype\":\"" + dtype + "\"");
  test::write_text(file, bytes);
  // The header reads ..."<name>":{"dtype":...
  const size_t key_end = at - 2;
  const size_t key_start = bytes.rfind('"', key_end - 1) + 1;
  return bytes.substr(key_start, key_end - key_start);
}

TEST(BadModel, MissingShardNamesTheShardAndTheIndex) {
  ScratchDir dir;
  const std::string folder = dir.copy_family("qwen2", "qwen2");
  std::filesystem::remove(folder + "/model-00002-of-00002.safetensors");
  expect_load_error(folder, {"model-00002-of-00002.safetensors", "shard file is missing",
                             "model.safetensors.index.json"});
}

TEST(BadModel, ShapeDisagreeingWithConfigNamesTensorFileAndConfig) {
  ScratchDir dir;
  const std::string folder = dir.copy_family("llama3", "llama3");
  test::edit_config(folder, [](auto& j) { j["intermediate_size"] = 96; });
  expect_load_error(folder, {folder + "/model.safetensors: ",
                             "tensor 'model.layers.0.mlp.gate_proj.weight' has shape [192, 128]",
                             folder + "/config.json", "needs [96, 128]"});
}

TEST(BadModel, FusedShapeDisagreeingWithConfigNamesTheFusedTensor) {
  ScratchDir dir;
  const std::string folder = dir.copy_family("phi3", "phi3");
  test::edit_config(folder, [](auto& j) { j["num_key_value_heads"] = 2; });
  expect_load_error(folder, {"tensor 'model.layers.0.self_attn.qkv_proj.weight' has shape "
                             "[256, 128]",
                             "needs [384, 128]"});
}

TEST(BadModel, UnknownRopeScalingTypeNamesConfigAndKey) {
  ScratchDir dir;
  const std::string folder = dir.copy_family("llama3", "llama3");
  test::edit_config(folder, [](auto& j) { j["rope_parameters"]["rope_type"] = "yarn"; });
  expect_load_error(
      folder, {folder + "/config.json: ", "rope_parameters.rope_type 'yarn' is not supported"});
}

TEST(BadModel, TransformersFourRopeScalingTypeNamesTheKey) {
  ScratchDir dir;
  const std::string folder = dir.copy_family("phi3", "phi3");
  test::edit_config(folder, [](auto& j) {
    j.erase("rope_parameters");
    j["rope_scaling"] = {{"type", "longrope"}, {"long_factor", {1.0}}, {"short_factor", {1.0}}};
  });
  expect_load_error(folder, {"config.json: ", "rope_scaling.type 'longrope' is not supported"});
}

TEST(BadModel, Llama3ScalingWithoutItsKeysNamesTheKey) {
  ScratchDir dir;
  const std::string folder = dir.copy_family("llama3", "llama3");
  test::edit_config(folder, [](auto& j) { j["rope_parameters"].erase("low_freq_factor"); });
  expect_load_error(folder, {"config.json: ", "rope_parameters.low_freq_factor"});
}

TEST(BadModel, Gemma3UnknownLayerTypeNamesTheItem) {
  ScratchDir dir;
  const std::string folder = dir.copy_family("gemma3", "gemma3");
  test::edit_config(folder, [](auto& j) { j["layer_types"][2] = "chunked_attention"; });
  expect_load_error(folder, {"config.json: ", "layer_types item 2", "chunked_attention"});
}

TEST(BadModel, Gemma3FinalLogitSoftcappingIsRefused) {
  ScratchDir dir;
  const std::string folder = dir.copy_family("gemma3", "gemma3");
  test::edit_config(folder, [](auto& j) { j["final_logit_softcapping"] = 30.0; });
  expect_load_error(folder, {"config.json: ", "final_logit_softcapping"});
}

TEST(BadModel, UnsupportedSafetensorsDtypeNamesFileAndTensor) {
  ScratchDir dir;
  const std::string folder = dir.copy_family("llama3", "llama3");
  const std::string tensor = patch_first_dtype(folder + "/model.safetensors", "F64");
  ASSERT_FALSE(tensor.empty());
  expect_load_error(folder,
                    {folder + "/model.safetensors", "unsupported dtype F64", "'" + tensor + "'"});
}

TEST(BadModel, IntegerWeightsNameFileAndTensor) {
  ScratchDir dir;
  const std::string folder = dir.copy_family("gemma3", "gemma3");
  const std::string tensor = patch_first_dtype(folder + "/model.safetensors", "I32");
  ASSERT_FALSE(tensor.empty());
  expect_load_error(folder, {folder + "/model.safetensors: ", "'" + tensor + "'",
                             "has dtype i32, which is not a weight type"});
}

TEST(BadModel, MissingTensorNamesIt) {
  ScratchDir dir;
  const std::string folder = dir.copy_family("gemma3", "gemma3");
  // Gemma 3 folders describe the norms with their own names; ask for a layer more than stored.
  test::edit_config(folder, [](auto& j) {
    j["num_hidden_layers"] = 8;
    j["layer_types"].push_back("sliding_attention");
  });
  expect_load_error(folder, {"missing tensor 'model.layers.7.input_layernorm.weight'"});
}

// A name in the safetensors header of `file` replaced by another of the same length (so the
// header stays valid): the file then lacks the tensor `from`.
void rename_tensor(const std::string& file, const std::string& from, const std::string& to) {
  ASSERT_EQ(from.size(), to.size());
  std::string bytes = test::read_text(file);
  const size_t at = bytes.find("\"" + from + "\"");
  ASSERT_NE(at, std::string::npos) << from;
  bytes.replace(at + 1, from.size(), to);
  test::write_text(file, bytes);
}

TEST(BadModel, HugeHeadDimFailsAtOnceNamingIt) {
  // Used to loop 2^30 times in the llama3 rope-factor code before any size was checked.
  ScratchDir dir;
  const std::string folder = dir.copy_family("llama3", "llama3");
  test::edit_config(folder, [](auto& j) { j["head_dim"] = int64_t{1} << 31; });
  const auto t0 = std::chrono::steady_clock::now();
  expect_load_error(folder, {"config.json: ", "head dim 2147483648 is out of range"});
  // Without the early check: 36 s and a 4 GB vector before the same message.
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
}

TEST(BadModel, HugeSizesAreRefusedBeforeUse) {
  ScratchDir dir;
  const std::string folder = dir.copy_family("qwen2", "qwen2");
  test::edit_config(folder, [](auto& j) { j["vocab_size"] = int64_t{1} << 40; });
  expect_load_error(folder, {"config.json: ", "vocabulary size 1099511627776 is out of range"});
  test::edit_config(folder, [](auto& j) {
    j["vocab_size"] = 512;
    j["max_position_embeddings"] = int64_t{1} << 33;
  });
  expect_load_error(folder, {"config.json: ", "context length 8589934592 is out of range"});
}

TEST(BadModel, MissingLmHeadWithUntiedEmbeddingsIsAnError) {
  // tie_word_embeddings is false: the embeddings must not stand in for the missing head.
  ScratchDir dir;
  const std::string folder = dir.copy_family("llama3", "llama3");
  rename_tensor(folder + "/model.safetensors", "lm_head.weight", "lm_head.weighX");
  expect_load_error(folder, {folder, "missing tensor 'lm_head.weight'"});
}

TEST(BadModel, FewerLayersInTheConfigThanInTheFileIsAnError) {
  // The file holds 3 layers; a config that says 2 must not run a truncated model.
  ScratchDir dir;
  const std::string folder = dir.copy_family("llama3", "llama3");
  test::edit_config(folder, [](auto& j) { j["num_hidden_layers"] = 2; });
  expect_load_error(folder, {"tensor 'model.layers.2.", "belongs to layer 2",
                             folder + "/config.json says the model has 2 layers"});
}

TEST(BadModel, RopeThetaAndEpsOutOfRangeNameTheKey) {
  ScratchDir dir;
  const std::string folder = dir.copy_family("qwen2", "qwen2");
  test::edit_config(folder, [](auto& j) {
    j.erase("rope_parameters");
    j["rope_theta"] = 0.5;
  });
  expect_load_error(folder, {"config.json: rope_theta = 0.5 must be a finite number > 1"});
  test::edit_config(folder, [](auto& j) {
    j["rope_theta"] = 10000.0;
    j["rms_norm_eps"] = -1e-6;
  });
  expect_load_error(folder, {"config.json: rms_norm_eps = -1e-06 must be in [0, 1)"});
  const std::string gemma = dir.copy_family("gemma3", "gemma3");
  test::edit_config(
      gemma, [](auto& j) { j["rope_parameters"]["sliding_attention"]["rope_theta"] = -3.0; });
  expect_load_error(gemma, {"config.json: rope_parameters.sliding_attention.rope_theta = -3"});
}

TEST(BadModel, UnsupportedModelTypeNamesIt) {
  ScratchDir dir;
  const std::string folder = dir.copy_family("llama3", "llama3");
  test::edit_config(folder, [](auto& j) { j["model_type"] = "mamba"; });
  expect_load_error(folder, {"config.json: unsupported model_type 'mamba'"});
}

// Names read from the file reach the message escaped (found by fuzz/gguf.cpp: a GGUF
// general.architecture holding a newline; tests/fixtures/bad/fuzz/gguf-architecture-newline).
TEST(BadModel, NamesFromTheFileAreQuotedEscaped) {
  const std::string bad = "x\n\x1b[2J";
  const std::string quoted = "'x\\n\\x1b[2J'";
  struct Case {
    const char* family;
    void (*edit)(nlohmann::ordered_json&, const std::string&);
    const char* key;
  };
  const Case cases[] = {
      {"llama3", [](auto& j, const std::string& v) { j["model_type"] = v; }, "model_type "},
      {"llama3", [](auto& j, const std::string& v) { j["hidden_act"] = v; }, "hidden_act "},
      {"llama3", [](auto& j, const std::string& v) { j["rope_parameters"]["rope_type"] = v; },
       "rope_type "},
      {"gemma3", [](auto& j, const std::string& v) { j["hidden_activation"] = v; },
       "hidden_activation "},
  };
  for (const Case& c : cases) {
    ScratchDir dir;
    const std::string folder = dir.copy_family(c.family, c.family);
    test::edit_config(folder, [&](auto& j) { c.edit(j, bad); });
    expect_load_error(folder, {c.key, quoted});
  }
  ScratchDir dir;
  const std::string path = dir.path() + "/arch.gguf";
  gguf::testkit::GgufBuilder b;
  b.kv("general.architecture", gguf::testkit::string_value(bad));
  const std::vector<uint8_t> bytes = b.build().bytes;
  test::write_text(path, std::string(bytes.begin(), bytes.end()));
  try {
    ModelConfig::from_gguf(gguf::File::open(path));
    ADD_FAILURE() << "no error for an unknown architecture";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unsupported architecture " + quoted), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace llmk
