// Shared helpers for the tokenizer tests: fixture files and the SmolLM2 model's tokenizer.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>

#include "core/error.h"
#include "formats/gguf.h"
#include "tokenizer/tokenizer.h"

namespace llmk::test {

inline std::string smollm2_path() {
  return std::string(LLMK_SOURCE_DIR) + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

inline nlohmann::json load_fixture(const std::string& name) {
  const std::string path = std::string(LLMK_SOURCE_DIR) + "/tests/fixtures/tokenizer/" + name;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot open fixture " + path + " (scripts/make-tokenizer-fixtures.py)");
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str());
}

// SmolLM2's tokenizer, loaded once; nullptr (with `why` set) when the model file is missing or
// does not load. Tests that need it fail with that message.
inline const Tokenizer* smollm2(std::string* why) {
  static std::string error;
  static const std::optional<Tokenizer> tok = []() -> std::optional<Tokenizer> {
    const std::string path = smollm2_path();
    if (!std::ifstream(path).good()) {
      error = "missing " + path + ": run scripts/fetch-models.sh";
      return std::nullopt;
    }
    try {
      return Tokenizer::from_gguf(gguf::File::open(path));
    } catch (const std::exception& e) {
      error = std::string("loading the tokenizer of ") + path + ": " + e.what();
      return std::nullopt;
    }
  }();
  *why = error;
  return tok ? &*tok : nullptr;
}

#define LLMK_REQUIRE_SMOLLM2(tok)                                        \
  std::string smollm2_error_;                                            \
  const ::llmk::Tokenizer* tok = ::llmk::test::smollm2(&smollm2_error_); \
  ASSERT_NE(tok, nullptr) << smollm2_error_

}  // namespace llmk::test
