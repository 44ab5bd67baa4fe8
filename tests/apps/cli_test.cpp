// The `llmk` binary end to end: real generation, and bad input giving one clear line on stderr
// and a non-zero exit. Corrupt models are byte-patched copies of the real test model.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "apps/cli_util.h"
#include "test_paths.h"

namespace {

namespace fs = std::filesystem;

using llmk::test::CliResult;
using Result = CliResult;
using llmk::test::slurp;

class Cli : public ::testing::Test {
 protected:
  static fs::path tmp() {
    static const fs::path dir = [] {
      fs::path d = fs::temp_directory_path() / ("llmk_cli_test_" + std::to_string(::getpid()));
      fs::create_directories(d);
      return d;
    }();
    return dir;
  }
  static void TearDownTestSuite() { fs::remove_all(tmp()); }

  static std::string model() { return llmk::test::model_path(llmk::test::kSmolLM2); }

  // Runs `llmk <args>` with stdout and stderr captured separately.
  static Result llmk(const std::string& args, const std::string& input = "") {
    return llmk::test::run_llmk(args, tmp(), input);
  }

  // A copy of the real model with `from` replaced by `to` (same length) at its first occurrence.
  static std::string patched(const std::string& name, const std::string& from,
                             const std::string& to) {
    EXPECT_EQ(from.size(), to.size());
    std::string bytes = slurp(model());
    const size_t at = bytes.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    bytes.replace(at, from.size(), to);
    const fs::path p = tmp() / name;
    std::ofstream(p, std::ios::binary)
        .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return p.string();
  }

  // Exit code 1, nothing on stdout, and exactly one stderr line holding `needle`.
  static void expect_clean_error(const Result& r, const std::string& needle) {
    llmk::test::expect_clean_error(r, {needle});
  }
};

TEST_F(Cli, GreedyCapitalOfFranceIsParis) {
  const Result r = llmk("run -m " + model() + " -p 'The capital of France is' --temp 0 -n 8 -t 2");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.rfind(" Paris", 0), 0u) << r.out;
  EXPECT_NE(r.err.find("tokens/s"), std::string::npos) << r.err;
}

// --stats: on the CPU every attention call runs the CPU kernel, one per layer per forward pass.
TEST_F(Cli, StatsCountAttentionCalls) {
  const Result r =
      llmk("run -m " + model() + " -p 'The capital of France is' --temp 0 -n 4 -t 2 --stats");
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string key = "attention calls: prefill 0, decode 0, chunked 0, fallback 0, cpu ";
  const size_t at = r.err.find(key);
  ASSERT_NE(at, std::string::npos) << r.err;
  EXPECT_GT(std::stoll(r.err.substr(at + key.size())), 0) << r.err;
}

// bench: the JSON holds both phases; --gen-tokens 1 times the prefill alone.
TEST_F(Cli, BenchPrefillAndDecode) {
  const fs::path json = tmp() / "bench.json";
  for (const int gen : {3, 1}) {
    const Result r = llmk("bench -m " + model() + " --prompt-tokens 8 --gen-tokens " +
                          std::to_string(gen) + " --reps 1 -t 2 --json " + json.string());
    ASSERT_EQ(r.code, 0) << r.err;
    const auto j = nlohmann::json::parse(slurp(json.string()));
    EXPECT_GT(j.at("prefill_tokens_per_s").get<double>(), 0);
    if (gen == 1) {
      EXPECT_TRUE(j.at("decode_tokens_per_s").is_null()) << j.dump();
      EXPECT_NE(r.out.find("decode:  none"), std::string::npos) << r.out;
    } else {
      EXPECT_GT(j.at("decode_tokens_per_s").get<double>(), 0);
      EXPECT_NE(r.out.find("median of 2 steps"), std::string::npos) << r.out;
    }
  }
}

TEST_F(Cli, SameSeedSameTextOtherSeedOtherText) {
  const std::string args =
      "run -m " + model() +
      " -p 'Write a short story about a cat.' --chat -n 24 --temp 1.0 -t 2 --seed ";
  const Result a = llmk(args + "7"), b = llmk(args + "7"), c = llmk(args + "8");
  ASSERT_EQ(a.code, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_NE(a.out, c.out);
}

// The expected ids are transformers' for the same prompt in the reference fixture.
TEST_F(Cli, TokenizeAndInspect) {
  const std::string text = "The capital of France is";
  const nlohmann::json reference = nlohmann::json::parse(
      slurp(llmk::test::source_path("tests/fixtures/smollm2_reference.json")));
  std::string ids;
  for (const nlohmann::json& c : reference.at("cases")) {
    if (c.at("text") != text) continue;
    for (const nlohmann::json& id : c.at("ids")) ids += std::to_string(id.get<int>()) + " ";
  }
  ASSERT_FALSE(ids.empty()) << "no case '" << text << "' in smollm2_reference.json";
  ids.back() = '\n';
  const Result t = llmk("tokenize -m " + model() + " --ids-only '" + text + "'");
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_EQ(t.out, ids);
  const Result i = llmk("inspect " + model());
  ASSERT_EQ(i.code, 0) << i.err;
  EXPECT_NE(i.out.find("general.architecture"), std::string::npos);
  EXPECT_NE(i.out.find("blk.29.ffn_down.weight"), std::string::npos);
}

TEST_F(Cli, ChatRemembersTheConversation) {
  const Result r = llmk("chat -m " + model() + " --temp 0 -n 40 -t 2",
                        "What is the capital of France?\nAnd of Italy?\n");
  ASSERT_EQ(r.code, 0) << r.err;
  const size_t nl = r.out.find('\n');
  ASSERT_NE(nl, std::string::npos) << r.out;
  EXPECT_NE(r.out.substr(0, nl).find("Paris"), std::string::npos) << r.out;
  // The second question only makes sense with the first one remembered.
  EXPECT_NE(r.out.substr(nl).find("Rome"), std::string::npos) << r.out;
  // The second turn reuses the cached first one.
  EXPECT_NE(r.err.find("(0 reused)"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("(0 reused)", r.err.find("(0 reused)") + 1), std::string::npos) << r.err;
}

TEST_F(Cli, HelpForEveryCommand) {
  for (const std::string c : {"", "run ", "chat ", "bench ", "logits ", "inspect ", "tokenize "}) {
    const Result r = llmk(c + "--help");
    EXPECT_EQ(r.code, 0) << c;
    EXPECT_NE(r.out.find("Usage"), std::string::npos) << c << r.out;
  }
}

TEST_F(Cli, UnreadablePaths) {
  expect_clean_error(llmk("run -m /no/such/model.gguf -p hi"), "/no/such/model.gguf");
  expect_clean_error(llmk("run -m " + tmp().string() + " -p hi"), tmp().string());
  expect_clean_error(llmk("inspect /no/such/file.gguf"), "/no/such/file.gguf");
}

TEST_F(Cli, CorruptModels) {
  expect_clean_error(llmk("run -p hi -m " + patched("magic.gguf", "GGUF", "GGML")), "magic");
  expect_clean_error(
      llmk("run -p hi -m " + patched("arch.gguf", std::string("\x05\0\0\0\0\0\0\0llama", 13),
                                     std::string("\x05\0\0\0\0\0\0\0mamba", 13))),
      "unsupported architecture 'mamba'");
  expect_clean_error(
      llmk("run -p hi -m " + patched("missing.gguf", "output_norm.weight", "output_norm.wexght")),
      "missing tensor 'output_norm.weight'");
  // llama.feed_forward_length is a u32 (type 4) of 1536 = 0x600; make it 1024 = 0x400.
  expect_clean_error(
      llmk("run -p hi -m " + patched("shape.gguf",
                                     std::string("feed_forward_length\x04\0\0\0\x00\x06", 25),
                                     std::string("feed_forward_length\x04\0\0\0\x00\x04", 25))),
      "tensor 'blk.0.ffn_gate.weight' has shape [1536, 576] but the model config needs [1024, "
      "576]");
  // llama.embedding_length 576 -> 512 makes the head dim 56, less than the rope dim.
  expect_clean_error(
      llmk("run -p hi -m " + patched("dims.gguf",
                                     std::string("embedding_length\x04\0\0\0\x40\x02", 22),
                                     std::string("embedding_length\x04\0\0\0\x00\x02", 22))),
      "rope dimension 64");
  // Truncated in the tensor data: the table names data past the end of the file.
  const std::string bytes = slurp(model());
  const fs::path cut = tmp() / "truncated.gguf";
  std::ofstream(cut, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size() / 2));
  expect_clean_error(llmk("run -p hi -m " + cut.string()), "past the end");
  std::ofstream(cut, std::ios::binary).write(bytes.data(), 1000);
  expect_clean_error(llmk("inspect " + cut.string()), "truncated");
}

TEST_F(Cli, BadArguments) {
  expect_clean_error(llmk("run -m " + model() +
                          " --ctx 16 -p 'one two three four five six seven eight nine ten eleven "
                          "twelve thirteen fourteen fifteen sixteen seventeen'"),
                     "context");
  expect_clean_error(llmk("run -m " + model() + " --top-p 0 -p hi"), "top-p");
  expect_clean_error(llmk("run -m " + model() + " -p hi -f /etc/hostname"), "not both");
  expect_clean_error(llmk("run -m " + model() + " -f /no/such/prompt.txt"), "/no/such/prompt.txt");
  expect_clean_error(llmk("run -m " + model() + " --ctx 100000 -p hi"), "exceeds");
  const Result r = llmk("run --bogus-flag");
  EXPECT_NE(r.code, 0);
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find("--bogus-flag"), std::string::npos) << r.err;
}

}  // namespace
