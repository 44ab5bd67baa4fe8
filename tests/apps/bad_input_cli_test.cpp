// Careless or hostile input to the `llmk` command line: options out of range, files that never
// end, token-id files with a bad element, outputs that cannot be written, and model files whose
// text would drive the terminal. Each gives exactly one "llmk: error: ..." line and exit code 1,
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

std::string bad_input(const std::string& name) {
  return std::string(LLMK_SOURCE_DIR) + "/tests/fixtures/bad/cli/" + name;
}

class BadInputCli : public ::testing::Test {
 protected:
  Result llmk(const std::string& args, const std::string& input = "") {
    return llmk::test::run_llmk(args, dir_.path(), input);
  }
  Result llmk_io(const std::string& args, const std::string& stdin_path,
                 const std::string& stdout_path = "") {
    return llmk::test::run_llmk_io(args, dir_.path(), stdin_path, stdout_path);
  }
  // `llmk logits` on the llama3 fixture over the ids in `ids_file`.
  Result logits(const std::string& ids_file, const std::string& out = "") {
    return llmk("logits -t 1 -m " + model_ + " --ids " + ids_file + " --out " +
                (out.empty() ? dir_.path() + "/logits.f32" : out));
  }

  const std::string model_ = llmk::test::family_dir("llama3");
  llmk::test::ScratchDir dir_;
};

// Every integer option's range error is one short line naming the option and the value. CLI11's
// own checks printed the bounds as doubles: "... not in range 0.000000 to 17976931348623157...",
// 309 digits of DBL_MAX.
TEST_F(BadInputCli, RangeErrorsAreShort) {
  const std::string m = " -m " + model_;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"run" + m + " -p hi --ctx -5", "--ctx: -5 is less than 0"},
      {"run" + m + " -p hi -n -1", "--n-predict: -1 is less than 0"},
      {"run" + m + " -p hi --top-k -3", "--top-k: -3 is less than 0"},
      {"run" + m + " -p hi --repeat-last-n -1", "--repeat-last-n: -1 is less than 0"},
      {"run" + m + " -p hi --seed -2", "--seed: -2 is less than -1"},
      {"run" + m + " -p hi --ctx 1e9", "--ctx: '1e9' is not an integer"},
      {"run" + m + " -p hi -n 99999999999", "--n-predict: 99999999999 is more than 2147483647"},
      {"chat" + m + " -n 0", "--n-predict: 0 is less than 1"},
      {"bench" + m + " --prompt-tokens 0", "--prompt-tokens: 0 is less than 1"},
      {"bench" + m + " --gen-tokens 0", "--gen-tokens: 0 is less than 1"},
      {"bench" + m + " --batch 2000", "--batch: 2000 is more than 1024"},
      {"bench" + m + " --reps -1", "--reps: -1 is less than 1"},
      {"logits" + m + " --ids x --out y --prefill -1", "--prefill: -1 is less than 0"},
  };
  for (const auto& [args, needle] : cases) {
    const Result r = llmk(args);
    expect_clean_error(r, {needle});
    EXPECT_LT(r.err.size(), 100u) << args << ": " << r.err;
  }
}

// --system only has a place in the chat template: without --chat it used to be dropped silently.
TEST_F(BadInputCli, SystemNeedsChat) {
  expect_clean_error(llmk("run -m " + model_ + " -p hi --system 'Be brief'"),
                     {"--system needs --chat"});
}

// --threads is capped at the machine's hardware threads: a pool's workers spin for work, so
// 1,000 threads on 2 cores only take the cores from each other.
TEST_F(BadInputCli, ThreadsBeyondTheHardwareAreRejected) {
  const unsigned hw = std::thread::hardware_concurrency();
  ASSERT_GT(hw, 0u) << "the system does not say how many hardware threads it has";
  const std::string over = std::to_string(hw + 1);
  expect_clean_error(llmk("run -m " + model_ + " -p hi -n 1 -t " + over),
                     {"--threads: " + over + " is more than " + std::to_string(hw)});
  expect_clean_error(llmk("bench -m " + model_ + " -t 1000"), {"--threads: 1000 is more than"});
  const Result ok = llmk("run -m " + model_ + " -p hi -n 1 --temp 0 -t " + std::to_string(hw));
  EXPECT_EQ(ok.code, 0) << ok.err;
}

// The prompt file goes through formats::read_file: regular files only, at most 16 MiB. The old
// reader read /dev/zero until memory ran out.
TEST_F(BadInputCli, PromptFileMustBeARegularFileOfBoundedSize) {
  expect_clean_error(llmk("run -m " + model_ + " -f /dev/zero"), {"/dev/zero: not a regular file"});
  expect_clean_error(llmk("run -m " + model_ + " -f " + dir_.path()),
                     {dir_.path() + ": not a regular file"});
  const std::string big = dir_.path() + "/big.txt";
  {
    std::ofstream f(big, std::ios::binary);
    f << std::string((size_t{16} << 20) + 1, 'a');
  }
  expect_clean_error(llmk("run -m " + model_ + " -f " + big), {big, "larger than the 16777216"});
}

// A chat message (one stdin line) is at most 16 MiB; the old reader grew without limit on
// `chat < /dev/zero`. Here 16 MiB + 1 bytes without a newline, then the end of the input.
TEST_F(BadInputCli, ChatLineIsBounded) {
  const Result r =
      llmk("chat -t 1 -m " + model_ + " -n 2 --temp 0", std::string((size_t{16} << 20) + 1, 'a'));
  expect_clean_error(r, {"stdin line 1 is longer than 16777216 bytes"});
}

// Every element of an --ids file must be a token id; the old reader stopped at the first bad
// element and computed the logits of the ids before it.
TEST_F(BadInputCli, LogitsIdsAreParsedStrictly) {
  const std::string not_id = "is not a token id (an integer from 0 to 2147483647)";
  for (const auto& [file, element] : std::vector<std::pair<std::string, std::string>>{
           {"ids_not_integer.txt", "element 3 ('x')"},
           {"ids_too_large.txt", "element 3 ('99999999999')"},
           {"ids_negative.txt", "element 2 ('-2')"},
           {"ids_fraction.txt", "element 3 ('3.5')"}}) {
    expect_clean_error(logits(bad_input(file)), {bad_input(file) + ": " + element + " " + not_id});
  }
  expect_clean_error(logits(bad_input("ids_outside_vocab.txt")),
                     {bad_input("ids_outside_vocab.txt") +
                      ": element 3 (600) is outside the model's vocabulary of 512"});
  expect_clean_error(logits("/dev/zero"), {"/dev/zero: not a regular file"});
  EXPECT_FALSE(fs::exists(dir_.path() + "/logits.f32"));
}

// A write that fails (a full disk; /dev/full fails every write with ENOSPC) is an error naming
// the file, never a reported success: --out, --json, and stdout itself.
TEST_F(BadInputCli, FailedWritesAreErrors) {
  const std::string ids = dir_.path() + "/ids.txt";
  llmk::test::write_text(ids, "1 2 3 4\n");
  expect_clean_error(logits(ids, "/dev/full"),
                     {"/dev/full: cannot write: No space left on device"});
  expect_clean_error(logits(ids, dir_.path()), {dir_.path() + ": cannot write"});
  expect_clean_error(llmk("bench -t 1 -m " + model_ +
                          " --prompt-tokens 4 --gen-tokens 2 --reps 1 --json /dev/full"),
                     {"/dev/full: cannot write: No space left on device"});
  const Result r = llmk_io("inspect " + model_, "/dev/null", "/dev/full");
  expect_clean_error(r, {"stdout: cannot write: No space left on device"});
  const Result run =
      llmk_io("run -t 1 -m " + model_ + " -p hi -n 4 --temp 0", "/dev/null", "/dev/full");
  expect_clean_error(run, {"stdout: cannot write: No space left on device"});
  expect_clean_error(llmk_io("run --help", "/dev/null", "/dev/full"),
                     {"stdout: cannot write the help"});
}

// The prompt and generation together must fit the model's context, computed without int
// overflow: INT_MAX + INT_MAX + 1 used to wrap to a negative context.
TEST_F(BadInputCli, BenchSizesAreCheckedWithoutOverflow) {
  expect_clean_error(
      llmk("bench -m " + model_ + " --prompt-tokens 2147483647 --gen-tokens 2147483647"),
      {"a context of 4294967295 tokens exceeds the model's 256 tokens"});
  expect_clean_error(llmk("bench -m " + model_ + " --prompt-tokens 2147483648"),
                     {"--prompt-tokens: 2147483648 is more than 2147483647"});
}

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
  // A file of the folder names the folder to give instead ("not a GGUF file" before).
  expect_clean_error(llmk("inspect " + folder + "/model-00001-of-00002.safetensors"),
                     {"give the folder (" + folder + ")"});
}

}  // namespace
