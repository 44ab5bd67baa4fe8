// Pre-tokenizer splits against Hugging Face tokenizers (tests/fixtures/tokenizer/
// pretokenize.json), and the byte alphabet and UTF-8 helpers underneath.
#include "tokenizer/pre_tokenizer.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/utf8.h"
#include "tokenizer_test_util.h"

namespace llmk {
namespace {

std::vector<size_t> piece_lengths(const PreTokenizer& p, std::string_view text) {
  std::vector<std::string_view> pieces;
  p.split(text, pieces);
  std::vector<size_t> lengths;
  const char* at = text.data();
  for (std::string_view piece : pieces) {
    EXPECT_EQ(piece.data(), at) << "pieces must tile the text in order";
    at += piece.size();
    lengths.push_back(piece.size());
  }
  return lengths;
}

TEST(PreTokenizer, MatchesHuggingFaceOnTheFixtureCorpus) {
  const nlohmann::json fx = test::load_fixture("pretokenize.json");
  const auto& texts = fx.at("texts");
  ASSERT_GT(texts.size(), 200u);
  for (const auto& [name, splits] : fx.at("splits").items()) {
    const PreTokenizer p = PreTokenizer::create(name);
    ASSERT_EQ(splits.size(), texts.size());
    int mismatches = 0;
    for (size_t i = 0; i < texts.size(); ++i) {
      const std::string text = texts[i].get<std::string>();
      const auto expected = splits[i].get<std::vector<size_t>>();
      const auto got = piece_lengths(p, text);
      if (got != expected && ++mismatches <= 5) {
        ADD_FAILURE() << name << ": pieces of " << testing::PrintToString(text) << " are "
                      << testing::PrintToString(got) << ", expected "
                      << testing::PrintToString(expected);
      }
    }
    EXPECT_EQ(mismatches, 0) << name;
  }
}

TEST(PreTokenizer, SmollmSplitsEveryDigitAndTheWhitespaceBeforeIt) {
  const PreTokenizer p = PreTokenizer::create("smollm");
  EXPECT_EQ(piece_lengths(p, "a   12"), (std::vector<size_t>{1, 3, 1, 1}));
  EXPECT_EQ(piece_lengths(PreTokenizer::create("gpt2"), "a   12"), (std::vector<size_t>{1, 2, 3}));
}

TEST(PreTokenizer, LongRunsDoNotExhaustTheRegexStack) {
  const PreTokenizer p = PreTokenizer::create("smollm");
  for (const std::string& s : {std::string(1 << 20, ' '), std::string(1 << 20, 'x'),
                               std::string(1 << 18, '!') + "a", std::string(1 << 18, '\n') + "1"}) {
    std::vector<std::string_view> pieces;
    p.split(s, pieces);
    size_t total = 0;
    for (auto piece : pieces) total += piece.size();
    EXPECT_EQ(total, s.size());
  }
}

TEST(PreTokenizer, UnknownNameThrowsListingTheSupportedOnes) {
  try {
    PreTokenizer::create("deepseek-coder");
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'deepseek-coder'"), std::string::npos) << what;
    EXPECT_NE(what.find("smollm"), std::string::npos) << what;
  }
}

TEST(ByteLevel, AlphabetIsGpt2s) {
  std::set<std::string> seen;
  for (int b = 0; b < 256; ++b) seen.emplace(byte_level::spell(static_cast<unsigned char>(b)));
  EXPECT_EQ(seen.size(), 256u);
  EXPECT_EQ(byte_level::spell(' '), "Ġ");
  EXPECT_EQ(byte_level::spell('\n'), "Ċ");
  EXPECT_EQ(byte_level::spell('\t'), "ĉ");
  EXPECT_EQ(byte_level::spell(0), "Ā");
  EXPECT_EQ(byte_level::spell('A'), "A");
  EXPECT_EQ(byte_level::spell(0xAD), "Ń");  // soft hyphen is not printable: remapped
  EXPECT_EQ(byte_level::spell(0xFF), "ÿ");

  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  EXPECT_EQ(byte_level::decode(byte_level::encode(all)), all);
  EXPECT_EQ(byte_level::decode("ĠtheĊ"), " the\n");
  EXPECT_EQ(byte_level::decode("€"), std::nullopt);         // outside the alphabet
  EXPECT_EQ(byte_level::decode("\xC4"), std::nullopt);      // truncated
  EXPECT_EQ(byte_level::decode("\xC0\xA1"), std::nullopt);  // overlong '!'
}

TEST(Utf8, ValidityAndCompletePrefixes) {
  EXPECT_TRUE(utf8::is_valid("h\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"));
  EXPECT_FALSE(utf8::is_valid("\xC3"));
  EXPECT_FALSE(utf8::is_valid("\xC0\x80"));          // overlong
  EXPECT_FALSE(utf8::is_valid("\xED\xA0\x80"));      // surrogate
  EXPECT_FALSE(utf8::is_valid("\xF4\x90\x80\x80"));  // above U+10FFFF
  EXPECT_EQ(utf8::valid_prefix("ab\x80"
                               "c"),
            2u);
  EXPECT_EQ(utf8::complete_prefix("a\xE2\x82"), 1u);
  EXPECT_EQ(utf8::complete_prefix("a\xE2\x82\xAC"), 4u);
  EXPECT_EQ(utf8::complete_prefix("\xF0\x9F\x98"), 0u);
  EXPECT_EQ(utf8::complete_prefix("ab"), 2u);
  EXPECT_EQ(utf8::complete_prefix(""), 0u);
  EXPECT_EQ(utf8::complete_prefix("a\xF8"), 2u);  // never a lead byte: complete as it is
  EXPECT_EQ(utf8::complete_prefix("a\xFF"), 2u);
}

}  // namespace
}  // namespace llmk
