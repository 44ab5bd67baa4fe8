// `llmk run --chat`, a two-turn `llmk chat` and `llmk tokenize` on the Hugging Face folders of
// every family fixture (tests/fixtures/families: random weights, so the text is noise; what is
// checked is that each family's tokenizer.json and chat template are found and used, and that
// the second chat turn reuses the first turn's KV cache).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <cctype>
#include <cstdio>
#include <utility>
#include <vector>
#include <string>

#include "apps/cli_util.h"

namespace {

namespace fs = std::filesystem;
using llmk::test::CliResult;
using llmk::test::run_llmk;

class FamilyCli : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("llmk_family_cli_" + std::to_string(::getpid()) + "_" + GetParam());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string folder() const {
    return std::string(LLMK_SOURCE_DIR) + "/tests/fixtures/families/" + GetParam();
  }
  fs::path dir_;
};

TEST_P(FamilyCli, RunWithTheChatTemplate) {
  const CliResult r =
      run_llmk("run -m " + folder() + " -p 'Hello there' --chat -n 6 --temp 0 -t 2 --device cpu",
               dir_);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("generation 6 tokens"), std::string::npos) << r.err;
}

TEST_P(FamilyCli, ChatTurnTwoReusesTurnOne) {
  const CliResult r = run_llmk("chat -m " + folder() + " -n 4 --temp 0 -t 2 --device cpu", dir_,
                               "Hi!\nAnd again?\n");
  ASSERT_EQ(r.code, 0) << r.err;
  // One stats line per turn: "[llmk] N new prompt tokens (R reused), ...". (No std::regex:
  // GCC 12 warns falsely inside it under ASan, and warnings are errors.)
  std::vector<std::pair<int, int>> turns;  // (new, reused)
  for (size_t at = r.err.find("[llmk] "); at != std::string::npos;
       at = r.err.find("[llmk] ", at + 1)) {
    int fresh = -1, reused = -1;
    if (std::sscanf(r.err.c_str() + at, "[llmk] %d new prompt tokens (%d reused)", &fresh,
                    &reused) == 2) {
      turns.emplace_back(fresh, reused);
    }
  }
  ASSERT_EQ(turns.size(), 2u) << r.err;
  EXPECT_EQ(turns[0].second, 0) << r.err;
  // At least the whole first prompt is reused (the reply may re-tokenize differently).
  EXPECT_GE(turns[1].second, turns[0].first) << r.err;
}

TEST_P(FamilyCli, TokenizeFromTheFolder) {
  const CliResult r = run_llmk("tokenize -m " + folder() + " --ids-only 'The cat sat.'", dir_);
  ASSERT_EQ(r.code, 0) << r.err;
  // Ids separated by single spaces, one line.
  ASSERT_FALSE(r.out.empty());
  EXPECT_EQ(r.out.back(), '\n') << r.out;
  EXPECT_TRUE(std::isdigit(static_cast<unsigned char>(r.out.front()))) << r.out;
  EXPECT_EQ(r.out.find_first_not_of("0123456789 \n"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("  "), std::string::npos) << r.out;
}

INSTANTIATE_TEST_SUITE_P(Families, FamilyCli,
                         ::testing::Values("llama3", "qwen2", "phi3", "gemma3"));

}  // namespace
