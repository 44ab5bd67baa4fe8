// Shared helpers for the tokenizer tests: fixture files and the SmolLM2 model's tokenizer.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/text.h"
#include "formats/gguf.h"
#include "test_paths.h"
#include "tokenizer/tokenizer.h"

namespace llmk::test {

inline nlohmann::json load_fixture(const std::string& name) {
  const std::string path = std::string(LLMK_SOURCE_DIR) + "/tests/fixtures/tokenizer/" + name;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot open fixture " + path + " (tests/fixtures/tokenizer/make_*.py)");
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str());
}

// SmolLM2's tokenizer, loaded once. A missing model throws test::MissingTestModel and a load
// error llmk::Error: either fails the test that asked, with the message.
inline const Tokenizer& smollm2() {
  static const Tokenizer tok = Tokenizer::from_gguf(gguf::File::open(model_path(kSmolLM2)));
  return tok;
}

// The ids a tokenizer fixture (smollm2.json, gemma3.json: Hugging Face's, its "source" says
// which version) records for `text` among its "cases". A text the fixture lacks throws, failing
// the test, so an id a test names always has the fixture as its source.
inline std::vector<int32_t> fixture_ids(const nlohmann::json& fixture, const std::string& text) {
  for (const nlohmann::json& c : fixture.at("cases")) {
    if (c.at("text").get<std::string>() == text) return c.at("ids").get<std::vector<int32_t>>();
  }
  throw std::runtime_error("no case " + testing::PrintToString(text) + " in the fixture");
}

// The one id the fixture records for `text`, a single token.
inline int32_t fixture_id(const nlohmann::json& fixture, const std::string& text) {
  const std::vector<int32_t> ids = fixture_ids(fixture, text);
  if (ids.size() != 1) {
    throw std::runtime_error("the fixture's " + testing::PrintToString(text) + " is " +
                             std::to_string(ids.size()) + " tokens, not one");
  }
  return ids[0];
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

#define LLMK_REQUIRE_SMOLLM2(tok) const ::llmk::Tokenizer* tok = &::llmk::test::smollm2()

}  // namespace llmk::test
