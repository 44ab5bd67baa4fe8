// The tokenizers of the tiny family models (tests/fixtures/families/<family>/tokenizer.json,
// tests/fixtures/families/make_tokenizers.py): Llama 3 and Qwen2 (byte-level BPE, Qwen2 with NFC),
// Phi-3 and Gemma 3 (SentencePiece-style BPE with byte fallback, as transformers' converters
// write them), each trained with the tokenizers library, at most 512 tokens. Every corpus string
// must give tokenizers' ids with and without special tokens parsed, and its decode.
//
// The round trip decode(encode(s)) == s (special tokens not parsed) holds with two exceptions
// that the tokenizers library shares: Qwen2 gives NFC(s), and the SentencePiece-style ones read
// a "▁" (U+2581) in s as a space, since that is how they write spaces.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tokenizer/normalizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer_test_util.h"

namespace llmk {
namespace {

using nlohmann::json;

constexpr int32_t kModelVocab = 512;  // the families' config.json vocab_size

std::string family_dir(const std::string& name) {
  return std::string(LLMK_SOURCE_DIR) + "/tests/fixtures/families/" + name;
}

std::string spaces_for_marks(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size();) {
    if (text.compare(i, 3, "\xE2\x96\x81") == 0) {
      out += ' ';
      i += 3;
    } else {
      out += text[i++];
    }
  }
  return out;
}

std::function<std::string(const std::string&)> round_trip_of(const std::string& name) {
  if (name == "qwen2") return [](const std::string& s) { return unicode::nfc(s); };
  if (name == "phi3" || name == "gemma3") return spaces_for_marks;
  return [](const std::string& s) { return s; };
}

class FamilyTokenizer : public testing::TestWithParam<std::string> {};

TEST_P(FamilyTokenizer, IdsAndDecodeMatchTokenizers) {
  const std::string name = GetParam();
  const json fixture = test::load_fixture("families.json")["tokenizers"][name];
  const Tokenizer tok = Tokenizer::from_hf_json(family_dir(name));
  EXPECT_EQ(tok.vocab_size(), fixture["vocab_size"].get<int32_t>());
  EXPECT_LE(tok.vocab_size(), kModelVocab);
  const size_t checked = test::check_hf_cases(tok, fixture["cases"], name, round_trip_of(name));
  EXPECT_GE(checked, 300u);
}

TEST_P(FamilyTokenizer, SpecialTokensParsedOrNot) {
  const std::string name = GetParam();
  const Tokenizer tok = Tokenizer::from_hf_json(family_dir(name));
  const std::vector<int32_t> eog = tok.end_of_generation_ids();
  ASSERT_FALSE(eog.empty());
  for (const int32_t id : eog) {
    const std::string& text = tok.token_text(id);
    EXPECT_EQ(tok.token_type(id), TokenType::Control) << text;
    EXPECT_EQ(tok.encode(text, false, true), std::vector<int32_t>{id}) << text;
    const std::vector<int32_t> plain = tok.encode(text, false, false);
    EXPECT_GT(plain.size(), 1u) << text;
    EXPECT_EQ(std::find(plain.begin(), plain.end(), id), plain.end()) << text;
    EXPECT_EQ(tok.decode(std::vector<int32_t>{id}, true), "") << text;
  }
}

INSTANTIATE_TEST_SUITE_P(Families, FamilyTokenizer,
                         testing::Values("llama3", "qwen2", "phi3", "gemma3"),
                         [](const auto& param_info) { return param_info.param; });

// Phi-3's vocabulary in the shape transformers 5's LlamaTokenizer writes: no normalizer, a
// Metaspace pre-tokenizer (prepend_scheme first or always, split false), decoder with Strip;
// and with added tokens that take whitespace along (lstrip, rstrip). Their round trip is
// tokenizers' own (Strip drops the space of a text that starts with one; lstrip and rstrip
// drop whitespace).
class MetaspaceTokenizer : public testing::TestWithParam<std::string> {};

TEST_P(MetaspaceTokenizer, IdsAndDecodeMatchTokenizers) {
  const std::string name = GetParam();
  const json fixture = test::load_fixture("families.json")["tokenizers"][name];
  const Tokenizer tok = Tokenizer::from_hf_json(std::string(LLMK_SOURCE_DIR) +
                                                "/tests/fixtures/tokenizer/hf_json/" + name);
  EXPECT_EQ(tok.vocab_size(), fixture["vocab_size"].get<int32_t>());
  const size_t checked = test::check_hf_cases(tok, fixture["cases"], name, nullptr);
  EXPECT_GE(checked, 300u);
}

// first: "▁" only before the stretch that starts the text; always: before every stretch.
TEST(MetaspaceTokenizerSchemes, PrefixAfterSpecialToken) {
  const std::string dir = std::string(LLMK_SOURCE_DIR) + "/tests/fixtures/tokenizer/hf_json/";
  const Tokenizer first = Tokenizer::from_hf_json(dir + "metaspace_first");
  const Tokenizer always = Tokenizer::from_hf_json(dir + "metaspace_always");
  const int32_t space = *first.find_token("\xE2\x96\x81");
  const int32_t bos = *first.find_token("<s>");
  const std::vector<int32_t> a = first.encode("<s>x", false, true);
  const std::vector<int32_t> b = always.encode("<s>x", false, true);
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[0], bos);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(std::vector<int32_t>(b.begin(), b.begin() + 2), (std::vector<int32_t>{bos, space}));
  EXPECT_EQ(b[2], a[1]);
}

INSTANTIATE_TEST_SUITE_P(Json, MetaspaceTokenizer,
                         testing::Values("metaspace_first", "metaspace_always", "phi3_strip"),
                         [](const auto& param_info) { return param_info.param; });

// bos/eos/add_bos and the chat template as tokenizer_config.json (or the post-processor) gives
// them.
TEST(FamilyTokenizerConfig, Llama3) {
  const Tokenizer tok = Tokenizer::from_hf_json(family_dir("llama3"));
  EXPECT_EQ(tok.pre_tokenizer(), "llama3");
  EXPECT_EQ(tok.token_text(tok.bos_id()), "<|begin_of_text|>");
  EXPECT_TRUE(tok.add_bos());  // from the TemplateProcessing post-processor
  EXPECT_EQ(tok.token_text(tok.eos_id()), "<|eot_id|>");
  EXPECT_NE(tok.chat_template().find("Cutting Knowledge Date"), std::string::npos);
}

TEST(FamilyTokenizerConfig, Qwen2) {
  const Tokenizer tok = Tokenizer::from_hf_json(family_dir("qwen2"));
  EXPECT_EQ(tok.pre_tokenizer(), "qwen2");
  EXPECT_EQ(tok.bos_id(), -1);
  EXPECT_FALSE(tok.add_bos());
  EXPECT_EQ(tok.token_text(tok.eos_id()), "<|im_end|>");
  EXPECT_EQ(tok.token_text(tok.pad_id()), "<|endoftext|>");
  EXPECT_NE(tok.chat_template().find("You are Qwen"), std::string::npos);
  // <tool_call> is an added token that is not special: matched even when specials are not.
  const std::optional<int32_t> call = tok.find_token("<tool_call>");
  ASSERT_TRUE(call.has_value());
  EXPECT_EQ(tok.token_type(*call), TokenType::UserDefined);
  EXPECT_EQ(tok.encode("<tool_call>", false, false), std::vector<int32_t>{*call});
}

TEST(FamilyTokenizerConfig, Phi3) {
  const Tokenizer tok = Tokenizer::from_hf_json(family_dir("phi3"));
  EXPECT_EQ(tok.token_text(tok.bos_id()), "<s>");
  EXPECT_FALSE(tok.add_bos());  // add_bos_token: false wins over the post-processor
  EXPECT_EQ(tok.token_text(tok.eos_id()), "<|endoftext|>");
  EXPECT_EQ(tok.token_text(tok.unk_id()), "<unk>");
  EXPECT_NE(tok.chat_template().find("<|assistant|>"), std::string::npos);
  const std::vector<int32_t> eog = tok.end_of_generation_ids();
  EXPECT_NE(std::find(eog.begin(), eog.end(), *tok.find_token("<|end|>")), eog.end());
}

TEST(FamilyTokenizerConfig, Gemma3) {
  const Tokenizer tok = Tokenizer::from_hf_json(family_dir("gemma3"));
  EXPECT_EQ(tok.token_text(tok.bos_id()), "<bos>");
  EXPECT_TRUE(tok.add_bos());
  EXPECT_EQ(tok.token_text(tok.eos_id()), "<eos>");
  EXPECT_EQ(tok.token_text(tok.pad_id()), "<pad>");
  EXPECT_NE(tok.chat_template().find("<start_of_turn>"), std::string::npos);
  const std::vector<int32_t> ids = tok.encode("Hi", true, false);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids[0], tok.bos_id());
}

// Byte fallback: a character that is not a token becomes its byte tokens; bytes that are not
// UTF-8 (which tokenizers cannot take as input) do too, and come back unchanged.
TEST(FamilyTokenizerByteFallback, CharactersAndInvalidBytes) {
  for (const char* name : {"phi3", "gemma3"}) {
    const Tokenizer tok = Tokenizer::from_hf_json(family_dir(name));
    const std::string rare = "\xF0\x9F\xA6\x80";  // U+1F980, not in the training text
    ASSERT_FALSE(tok.find_token(rare).has_value()) << name;
    std::vector<int32_t> want;
    for (const char* b : {"<0xF0>", "<0x9F>", "<0xA6>", "<0x80>"}) {
      const std::optional<int32_t> id = tok.find_token(b);
      ASSERT_TRUE(id.has_value()) << name << " " << b;
      EXPECT_EQ(tok.token_type(*id), TokenType::Byte);
      want.push_back(*id);
    }
    const std::vector<int32_t> ids = tok.encode(rare, false, false);
    ASSERT_GE(ids.size(), 4u) << name;
    EXPECT_EQ(std::vector<int32_t>(ids.end() - 4, ids.end()), want) << name;
    const std::string invalid = "a\xFF\xC3(b\xE2\x96";
    EXPECT_EQ(tok.decode(tok.encode(invalid, false, false)), invalid) << name;
  }
}

}  // namespace
}  // namespace llmk
