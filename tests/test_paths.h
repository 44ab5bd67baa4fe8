// Where tests find the repository's fixtures and the fetched models.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace llmk::test {

// The repository: $LLMK_SOURCE_DIR when set (test binaries carried to another machine), else
// where the tests were built from.
inline std::string source_path(const std::string& rel) {
  const char* env = std::getenv("LLMK_SOURCE_DIR");
  return std::string(env && *env ? env : LLMK_SOURCE_DIR) + "/" + rel;
}

// The SmolLM2 test model. A missing file is a failure with the fix in the message, not a skip:
// the test command fetches it.
inline std::string smollm2_path() {
  const std::string p = source_path("models/SmolLM2-135M-Instruct.Q4_1.gguf");
  EXPECT_TRUE(std::filesystem::exists(p)) << p << " is missing: run scripts/fetch-models.sh";
  return p;
}

}  // namespace llmk::test
