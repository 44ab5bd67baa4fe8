// Where tests find the repository's fixtures and the fetched models.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>

namespace llmk::test {

// The repository: $LLMK_SOURCE_DIR when set (test binaries carried to another machine), else
// where the tests were built from.
inline std::string source_path(const std::string& rel) {
  const char* env = std::getenv("LLMK_SOURCE_DIR");
  return std::string(env && *env ? env : LLMK_SOURCE_DIR) + "/" + rel;
}

// A model of models/ that scripts/fetch-models.sh fetches (not committed): its file name and
// the script's argument that fetches it.
struct TestModel {
  const char* file;
  const char* fetch;
};
inline constexpr TestModel kSmolLM2{"SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2"};
inline constexpr TestModel kGemma3{"gemma-3-270m-q4_k_m.gguf", "gemma3"};

// What a missing test model throws. Not an llmk::Error, so that no test expecting the library
// to refuse something mistakes it for that refusal.
class MissingTestModel : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// "<path> is missing: run scripts/fetch-models.sh <name>".
inline std::string missing_model_message(const std::string& path, const TestModel& m) {
  return path + " is missing: run scripts/fetch-models.sh " + m.fetch;
}

// The path of a test model. One rule for every test that needs one: a missing file is a
// failure with the fetch command in the message, never a skip or a pass. It throws
// MissingTestModel, which fails the test wherever it is called (a test body, SetUp, a helper
// returning a value), and gtest prints the message.
inline std::string model_path(const TestModel& m) {
  const std::string p = source_path(std::string("models/") + m.file);
  if (!std::filesystem::exists(p)) throw MissingTestModel(missing_model_message(p, m));
  return p;
}
inline std::string smollm2_path() { return model_path(kSmolLM2); }

}  // namespace llmk::test
