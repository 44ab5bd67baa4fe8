// Careless or hostile input to the `llmk` command line: model files whose text would drive the
// terminal. Each gives exactly one "llmk: error: ..." line and exit code 1,
// or, for inspect, output with the file's text escaped. Models are the small family fixtures
// (tests/fixtures/families), so no test here needs scripts/fetch-models.sh.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "apps/cli_util.h"
#include "model/family_fixtures.h"

namespace {

namespace fs = std::filesystem;
using llmk::test::expect_clean_error;
using Result = llmk::test::CliResult;

class BadInputCli : public ::testing::Test {
 protected:
  Result llmk(const std::string& args, const std::string& input = "") {
    return llmk::test::run_llmk(args, dir_.path(), input);
  }
  const std::string model_ = llmk::test::family_dir("llama3");
  llmk::test::ScratchDir dir_;
};

// A GGUF file with one string key and one tensor, `value` and `tensor_name` as given (format:
// github.com/ggml-org/ggml docs/gguf.md, version 3; little-endian, data aligned to 32 bytes).
std::string tiny_gguf(const std::string& key, const std::string& value,
                      const std::string& tensor_name) {
  std::string b;
  const auto u32 = [&](uint32_t v) { b.append(reinterpret_cast<const char*>(&v), 4); };
  const auto u64 = [&](uint64_t v) { b.append(reinterpret_cast<const char*>(&v), 8); };
  const auto str = [&](const std::string& s) {
    u64(s.size());
    b += s;
  };
  b += "GGUF";
  u32(3);  // version
  u64(1);  // tensors
  u64(1);  // metadata keys
  str(key);
  u32(8);  // string
  str(value);
  str(tensor_name);
  u32(1);  // dimensions
  u64(1);  // [1]
  u32(0);  // F32
  u64(0);  // offset in the data section
  b.resize((b.size() + 31) / 32 * 32, '\0');
  b.append(4, '\0');  // the tensor's one float
  return b;
}

// inspect shows text from the file with control characters escaped (a file must not be able to
// clear the screen or set the window title) and long values cut, saying how long they were.
TEST_F(BadInputCli, InspectEscapesAndCutsFileText) {
  const std::string evil = "\x1b]0;owned\x07\x1b[2J";
  const std::string path = dir_.path() + "/evil.gguf", long_value = evil + std::string(5000, 'a');
  llmk::test::write_text(path, tiny_gguf("general.name", long_value, "tensor\x1b[31m.weight"));
  const Result r = llmk("inspect " + path);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.find('\x1b'), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find('\x07'), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\\x1b]0;owned\\x07\\x1b[2J"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(fmt::format("... ({} bytes)", long_value.size())), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("tensor\\x1b[31m.weight"), std::string::npos) << r.out;

  const std::string folder = dir_.copy_family("llama3", "evil");
  llmk::test::edit_config(folder, [&](auto& j) {
    j["evil_key\x1b[2J"] = evil;
    j["long_list"] = std::vector<int>(1000, 7);
  });
  const Result f = llmk("inspect " + folder);
  ASSERT_EQ(f.code, 0) << f.err;
  EXPECT_EQ(f.out.find('\x1b'), std::string::npos) << f.out;
  EXPECT_NE(f.out.find("evil_key\\x1b[2J"), std::string::npos) << f.out;
  // [7,7,...,7]: 1000 digits, 999 commas, 2 brackets.
  EXPECT_NE(f.out.find("... (2001 bytes)"), std::string::npos) << f.out;
}

// inspect on a Hugging Face folder: config.json's keys, the model llmk reads from them, and the
// tensors of every shard (qwen2's fixture has two).
TEST_F(BadInputCli, InspectReadsHuggingFaceFolders) {
  const std::string folder = llmk::test::family_dir("qwen2");
  const auto config = nlohmann::json::parse(llmk::test::read_text(folder + "/config.json"));
  const auto index =
      nlohmann::json::parse(llmk::test::read_text(folder + "/model.safetensors.index.json"));
  const Result r = llmk("inspect " + folder);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  for (const std::string& s :
       {fmt::format("config.json ({} keys)", config.size()),
        fmt::format("{:<44} {}", "num_hidden_layers", config.at("num_hidden_layers").get<int>()),
        std::string("model: unnamed (qwen2)"),
        fmt::format("tensors ({} in 2 files)", index.at("weight_map").size()),
        std::string("model.embed_tokens.weight"),
        std::string("model-00002-of-00002.safetensors")}) {
    EXPECT_NE(r.out.find(s), std::string::npos) << s << " in:\n" << r.out;
  }
  const Result meta = llmk("inspect --no-tensors " + folder);
  ASSERT_EQ(meta.code, 0) << meta.err;
  EXPECT_EQ(meta.out.find("model.embed_tokens.weight"), std::string::npos);
  expect_clean_error(llmk("inspect " + dir_.path()), {dir_.path(), "config.json"});
}

}  // namespace
