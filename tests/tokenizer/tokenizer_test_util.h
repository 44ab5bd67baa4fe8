// Shared helpers for the tokenizer tests: fixture files and the SmolLM2 model's tokenizer.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

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
  if (!in) throw Error("cannot open fixture " + path + " (tests/fixtures/tokenizer/make_*.py)");
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

// Checks every case of a cases file for one tokenizer: ids with and without special tokens
// parsed, and decode against tokenizers' decode (`decoded`, `decoded_plain`: present where it
// is not the text itself). `round_trip(text)` is what decode(encode(text)) must give without
// special tokens parsed (nullptr: tokenizers' decoded_plain). Returns how many cases were
// checked.
inline size_t check_hf_cases(const Tokenizer& tok, const nlohmann::json& cases,
                             const std::string& name,
                             const std::function<std::string(const std::string&)>& round_trip) {
  size_t checked = 0;
  const auto ids_of = [](const nlohmann::json& v) { return v.get<std::vector<int32_t>>(); };
  for (const nlohmann::json& c : cases) {
    const std::string text = c["text"].get<std::string>();
    const std::vector<int32_t> ids = ids_of(c["ids"]);
    const std::vector<int32_t> plain = c.contains("ids_plain") ? ids_of(c["ids_plain"]) : ids;
    EXPECT_EQ(tok.encode(text, false, true), ids) << name << ": " << testing::PrintToString(text);
    EXPECT_EQ(tok.encode(text, false, false), plain)
        << name << " (special tokens not parsed): " << testing::PrintToString(text);
    EXPECT_EQ(tok.decode(ids), c.value("decoded", text))
        << name << ": " << testing::PrintToString(text);
    EXPECT_EQ(tok.decode(plain), c.value("decoded_plain", text))
        << name << " (special tokens not parsed): " << testing::PrintToString(text);
    EXPECT_EQ(tok.decode(tok.encode(text, false, false)),
              round_trip ? round_trip(text) : c.value("decoded_plain", text))
        << name << ": " << testing::PrintToString(text);
    ++checked;
  }
  return checked;
}

// A reproducer of bad input under tests/fixtures/bad/tokenizer/ (see its README).
inline std::string bad_fixture(const std::string& name) {
  return std::string(LLMK_SOURCE_DIR) + "/tests/fixtures/bad/tokenizer/" + name;
}

// Expects an error message fit for a terminal: one line of printable bytes, not much longer than
// its fixed text (a name from the file is quoted in part), with the quoted name's escape byte
// written out.
inline void expect_short_printable(const std::string& message) {
  EXPECT_LT(message.size(), 400u) << message;
  for (char c : message) {
    const auto u = static_cast<unsigned char>(c);
    ASSERT_TRUE(u >= 0x20 && u != 0x7f) << "control byte " << int{u} << " in: " << message;
  }
  EXPECT_NE(message.find("\\x1b"), std::string::npos) << message;
}

#define LLMK_REQUIRE_SMOLLM2(tok)                                        \
  std::string smollm2_error_;                                            \
  const ::llmk::Tokenizer* tok = ::llmk::test::smollm2(&smollm2_error_); \
  ASSERT_NE(tok, nullptr) << smollm2_error_

}  // namespace llmk::test
