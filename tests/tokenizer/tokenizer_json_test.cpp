// Tokenizer::from_hf_json against tokenizers: small byte-level BPEs trained with the
// pre-tokenizers of Llama 3, Qwen2 (with its NFC normalizer) and GPT-2, and SmolLM2's own
// tokenizer.json (which must also agree with the GGUF). Malformed files give errors naming the
// file and the key. Fixtures: tests/fixtures/tokenizer/make_hf_json.py.
//
// The round trip: decode(encode(s)) == s for tokenizers without a normalizer; with NFC it is
// NFC(s) (checked against both tokenizers' decode and llmk's own unicode::nfc).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/text.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer_test_util.h"

namespace llmk {
namespace {

using nlohmann::json;

std::string fixture_dir(const std::string& name) {
  return std::string(LLMK_SOURCE_DIR) + "/tests/fixtures/tokenizer/hf_json/" + name;
}

std::vector<int32_t> ids_of(const json& v) { return v.get<std::vector<int32_t>>(); }

std::string same(const std::string& text) { return text; }
std::string nfc(const std::string& text) { return unicode::nfc(text); }

class HfJsonTrained : public testing::TestWithParam<std::string> {};

TEST_P(HfJsonTrained, IdsMatchTokenizers) {
  const std::string name = GetParam();
  const json fixture = test::load_fixture("hf_json/cases.json")["tokenizers"][name];
  const Tokenizer tok = Tokenizer::from_hf_json(fixture_dir(name));
  EXPECT_EQ(tok.vocab_size(), fixture["vocab_size"].get<int32_t>());
  const size_t checked =
      test::check_hf_cases(tok, fixture["cases"], name, name == "qwen2" ? nfc : same);
  EXPECT_GE(checked, 300u);
}

TEST_P(HfJsonTrained, FileAndFolderGiveTheSameTokenizer) {
  const std::string name = GetParam();
  const Tokenizer a = Tokenizer::from_hf_json(fixture_dir(name));
  const Tokenizer b = Tokenizer::from_hf_json(fixture_dir(name) + "/tokenizer.json");
  EXPECT_EQ(a.vocab_size(), b.vocab_size());
  EXPECT_EQ(a.pre_tokenizer(), b.pre_tokenizer());
  EXPECT_EQ(a.encode("Hello  world 12345", false, true),
            b.encode("Hello  world 12345", false, true));
}

INSTANTIATE_TEST_SUITE_P(Json, HfJsonTrained, testing::Values("llama3", "qwen2", "gpt2"),
                         [](const auto& param_info) { return param_info.param; });

TEST(TokenizerJson, Llama3Config) {
  const Tokenizer tok = Tokenizer::from_hf_json(fixture_dir("llama3"));
  EXPECT_EQ(tok.pre_tokenizer(), "llama3");
  ASSERT_GE(tok.bos_id(), 0);
  EXPECT_EQ(tok.token_text(tok.bos_id()), "<|begin_of_text|>");  // an AddedToken object
  EXPECT_TRUE(tok.add_bos());  // from the TemplateProcessing post-processor
  ASSERT_GE(tok.eos_id(), 0);
  EXPECT_EQ(tok.token_text(tok.eos_id()), "<|eot_id|>");
  EXPECT_EQ(tok.token_type(tok.eos_id()), TokenType::Control);
  EXPECT_NE(tok.chat_template().find("<|start_header_id|>"), std::string::npos);
  const std::vector<int32_t> ids = tok.encode("Hi", true, false);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids[0], tok.bos_id());
}

TEST(TokenizerJson, Qwen2Config) {
  const Tokenizer tok = Tokenizer::from_hf_json(fixture_dir("qwen2"));
  EXPECT_EQ(tok.pre_tokenizer(), "qwen2");
  EXPECT_EQ(tok.bos_id(), -1);  // "bos_token": null
  EXPECT_FALSE(tok.add_bos());
  ASSERT_GE(tok.eos_id(), 0);
  EXPECT_EQ(tok.token_text(tok.eos_id()), "<|im_end|>");
  ASSERT_GE(tok.pad_id(), 0);
  EXPECT_EQ(tok.token_text(tok.pad_id()), "<|endoftext|>");
  EXPECT_NE(tok.chat_template().find("<|im_start|>"), std::string::npos);
}

// Qwen2 declares NFC like the real files: text that is not NFC gives the ids of its NFC form,
// and the corpus holds such text (so the normalizer cannot be a no-op and pass).
TEST(TokenizerJson, Qwen2NormalizesToNfc) {
  const Tokenizer tok = Tokenizer::from_hf_json(fixture_dir("qwen2"));
  const std::string decomposed = "Cafe\u0301 \u1112\u1161\u11ab";  // e + acute, Hangul jamo
  const std::string composed = "Caf\u00e9 \ud55c";
  ASSERT_NE(decomposed, composed);
  EXPECT_EQ(unicode::nfc(decomposed), composed);
  EXPECT_EQ(tok.encode(decomposed, false, true), tok.encode(composed, false, true));
  EXPECT_EQ(tok.decode(tok.encode(decomposed, false, true)), composed);
  const json cases = test::load_fixture("hf_json/cases.json")["tokenizers"]["qwen2"]["cases"];
  size_t changed = 0;
  for (const json& c : cases) changed += c.contains("decoded");
  EXPECT_GE(changed, 15u);
  // The byte-level tokenizers without a normalizer keep such text as it is.
  const Tokenizer llama3 = Tokenizer::from_hf_json(fixture_dir("llama3"));
  EXPECT_EQ(llama3.decode(llama3.encode(decomposed, false, true)), decomposed);
}

TEST(TokenizerJson, NfcKeepsInvalidBytes) {
  EXPECT_EQ(unicode::nfc("e\u0301\xff"
                         "e\u0301"),
            "\u00e9\xff"
            "\u00e9");
  EXPECT_EQ(unicode::nfc(""), "");
  EXPECT_EQ(unicode::nfc("\xe2\x96"), "\xe2\x96");    // a truncated character
  EXPECT_EQ(unicode::nfc("\u212b"), "\u00c5");        // a singleton: Angstrom sign -> A ring
  EXPECT_EQ(unicode::nfc("\u0958"), "\u0915\u093c");  // a composition exclusion stays apart
}

// White_Space as lstrip / rstrip take it along (Rust's char::is_whitespace).
TEST(TokenizerJson, WhitespaceRuns) {
  EXPECT_EQ(unicode::whitespace_prefix(" \t\u3000x "), 5u);
  EXPECT_EQ(unicode::whitespace_prefix("\u200bx"), 0u);  // zero width space: not White_Space
  EXPECT_EQ(unicode::whitespace_prefix("\xa0"), 0u);     // a stray byte, not U+00A0
  EXPECT_EQ(unicode::whitespace_suffix("x \u2003\u00a0"), 6u);
  EXPECT_EQ(unicode::whitespace_suffix("x\u200b"), 0u);
  EXPECT_EQ(unicode::whitespace_suffix("\xff "), 1u);
  EXPECT_EQ(unicode::whitespace_suffix("\x80\x80"), 0u);
  EXPECT_EQ(unicode::whitespace_suffix(""), 0u);
}

TEST(TokenizerJson, Gpt2UserDefinedToken) {
  const Tokenizer tok = Tokenizer::from_hf_json(fixture_dir("gpt2"));
  EXPECT_EQ(tok.pre_tokenizer(), "gpt2");
  const std::optional<int32_t> user = tok.find_token("<custom_user>");
  ASSERT_TRUE(user.has_value());
  EXPECT_EQ(tok.token_type(*user), TokenType::UserDefined);
  EXPECT_EQ(tok.encode("<custom_user>", false, false), std::vector<int32_t>{*user});
  const std::optional<int32_t> eot = tok.find_token("<|endoftext|>");
  ASSERT_TRUE(eot.has_value());
  EXPECT_EQ(tok.token_type(*eot), TokenType::Control);
  EXPECT_EQ(tok.unk_id(), *eot);
  EXPECT_EQ(tok.bos_id(), *eot);
  EXPECT_FALSE(tok.add_bos());  // no add_bos_token, no post-processor
}

TEST(TokenizerJson, SmolLM2MatchesReferenceIds) {
  const Tokenizer tok = Tokenizer::from_hf_json(fixture_dir("smollm2"));
  EXPECT_EQ(tok.pre_tokenizer(), "smollm");
  const json fixture = test::load_fixture("smollm2.json");
  EXPECT_EQ(tok.vocab_size(), fixture["vocab_size"].get<int32_t>());
  EXPECT_EQ(tok.bos_id(), fixture["bos_id"].get<int32_t>());
  EXPECT_EQ(tok.eos_id(), fixture["eos_id"].get<int32_t>());
  EXPECT_EQ(tok.chat_template(), fixture["chat_template"].get<std::string>());
  size_t checked = 0;
  for (const json& c : fixture["cases"]) {
    const std::string text = c["text"].get<std::string>();
    const std::vector<int32_t> ids = ids_of(c["ids"]);
    const std::vector<int32_t> plain = c.contains("ids_plain") ? ids_of(c["ids_plain"]) : ids;
    EXPECT_EQ(tok.encode(text, false, true), ids) << testing::PrintToString(text);
    EXPECT_EQ(tok.encode(text, false, false), plain) << testing::PrintToString(text);
    ++checked;
  }
  EXPECT_GE(checked, 300u);
}

TEST(TokenizerJson, SmolLM2MatchesGguf) {
  LLMK_REQUIRE_SMOLLM2(gguf_tok);
  const Tokenizer tok = Tokenizer::from_hf_json(fixture_dir("smollm2"));
  ASSERT_EQ(tok.vocab_size(), gguf_tok->vocab_size());
  size_t differ = 0;
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    differ += tok.token_text(id) != gguf_tok->token_text(id);
    differ += tok.token_type(id) != gguf_tok->token_type(id);
  }
  EXPECT_EQ(differ, 0u);
  EXPECT_EQ(tok.pre_tokenizer(), gguf_tok->pre_tokenizer());
  EXPECT_EQ(tok.bos_id(), gguf_tok->bos_id());
  EXPECT_EQ(tok.eos_id(), gguf_tok->eos_id());
  EXPECT_EQ(tok.add_bos(), gguf_tok->add_bos());
  EXPECT_EQ(tok.chat_template(), gguf_tok->chat_template());
  const json cases = test::load_fixture("hf_json/cases.json")["tokenizers"]["llama3"]["cases"];
  for (const json& c : cases) {
    const std::string text = c["text"].get<std::string>();
    for (bool special : {false, true}) {
      EXPECT_EQ(tok.encode(text, false, special), gguf_tok->encode(text, false, special))
          << testing::PrintToString(text);
    }
  }
}

// Errors: small files written to a temporary folder.
class TokenizerJsonErrors : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("llmk_tokenizer_json_" + std::to_string(::getpid()) + "_" +
            testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // A minimal valid tokenizer.json: "a" "b" and their merge "ab".
  static json minimal() {
    return json::parse(R"({
      "version": "1.0", "added_tokens": [
        {"id": 3, "content": "<|end|>", "special": true, "lstrip": false, "rstrip": false,
         "single_word": false, "normalized": false}],
      "normalizer": null,
      "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
                        "use_regex": true},
      "post_processor": null,
      "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true,
                  "use_regex": true},
      "model": {"type": "BPE", "dropout": null, "unk_token": null,
                "continuing_subword_prefix": "", "end_of_word_suffix": "", "fuse_unk": false,
                "byte_fallback": false, "ignore_merges": false,
                "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": [["a", "b"]]}})");
  }
  // A minimal SentencePiece-style file (Llama 2 / Phi-3 shape): <unk> <s> </s>, the 256 byte
  // tokens, then "▁" "a" "b" "▁a" "ab" with merges (▁, a) and (a, b).
  static json minimal_byte_fallback() {
    json j = json::parse(R"({
      "version": "1.0", "added_tokens": [
        {"id": 1, "content": "<s>", "special": true, "lstrip": false, "rstrip": false,
         "single_word": false, "normalized": false}],
      "normalizer": {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "\u2581"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
      "pre_tokenizer": null, "post_processor": null,
      "decoder": {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
      "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>",
                "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": true,
                "byte_fallback": true, "ignore_merges": false,
                "vocab": {"<unk>": 0, "<s>": 1, "</s>": 2}, "merges": [["\u2581", "a"], ["a", "b"]]}})");
    json& vocab = j["model"]["vocab"];
    for (int b = 0; b < 256; ++b) vocab[fmt::format("<0x{:02X}>", b)] = 3 + b;
    int id = 259;
    for (const char* t : {"\u2581", "a", "b", "\u2581a", "ab"}) vocab[t] = id++;
    return j;
  }

  std::string write(const std::string& name, const std::string& text) const {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  std::string write(const json& j) const { return write("tokenizer.json", j.dump()); }

  // The message of the llmk::Error from_hf_json throws for `path` ("" when none).
  static std::string error_of(const std::string& path) {
    try {
      Tokenizer::from_hf_json(path);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  // Expects an error for `path` naming `file` (by default `path`) and holding each of `parts`.
  static void expect_error(const std::string& path, const std::vector<std::string>& parts,
                           const std::string& file = "") {
    const std::string message = error_of(path);
    ASSERT_FALSE(message.empty()) << "no error for " << path;
    EXPECT_EQ(message.find('\n'), std::string::npos) << "not one line: " << message;
    EXPECT_NE(message.find(file.empty() ? path : file), std::string::npos) << message;
    for (const std::string& part : parts)
      EXPECT_NE(message.find(part), std::string::npos) << message;
  }

  std::filesystem::path dir_;
};

TEST_F(TokenizerJsonErrors, MinimalFileLoadsInBothMergeFormats) {
  json j = minimal();
  const Tokenizer pairs = Tokenizer::from_hf_json(write(j));
  EXPECT_EQ(pairs.encode("ab<|end|>", false, true), (std::vector<int32_t>{2, 3}));
  j["model"]["merges"] = json::array({"a b"});
  const Tokenizer strings = Tokenizer::from_hf_json(write(j));
  EXPECT_EQ(strings.encode("abab", false, true), (std::vector<int32_t>{2, 2}));
  EXPECT_EQ(strings.token_type(3), TokenType::Control);
}

// Ids worked out by hand from minimal_byte_fallback() (▁ 259, a 260, b 261, ▁a 262, ab 263):
// "ab a" is normalized to "▁ab▁a"; merge (▁, a) ranks before (a, b), so both ▁a form first and
// "b" stays alone. "c" has no token and becomes its byte token <0x63>.
TEST_F(TokenizerJsonErrors, MinimalByteFallbackFileLoads) {
  const Tokenizer tok = Tokenizer::from_hf_json(write(minimal_byte_fallback()));
  const int32_t space_a = 262, b = 261, ab = 263, byte_c = 3 + 0x63, bos = 1;
  EXPECT_EQ(tok.encode("ab a", false, true), (std::vector<int32_t>{space_a, b, space_a}));
  EXPECT_EQ(tok.encode("<s>ab", false, true), (std::vector<int32_t>{bos, space_a, b}));
  EXPECT_EQ(tok.encode("c", false, true), (std::vector<int32_t>{259, byte_c}));  // "▁" "c"
  EXPECT_EQ(tok.decode(std::vector<int32_t>{space_a, b, space_a}), "ab a");      // Strip
  EXPECT_EQ(tok.decode(std::vector<int32_t>{ab}), "ab");
  EXPECT_EQ(tok.token_type(byte_c), TokenType::Byte);
  EXPECT_EQ(tok.token_bytes(byte_c), "c");
  EXPECT_EQ(tok.unk_id(), 0);
}

TEST_F(TokenizerJsonErrors, ByteFallbackErrors) {
  json j = minimal_byte_fallback();
  j["model"]["vocab"].erase("<0x80>");
  expect_error(write(j), {"model.vocab", "<0x80>"});
  j = minimal_byte_fallback();
  j["model"]["byte_fallback"] = "yes";
  expect_error(write(j), {"model.byte_fallback", "expected a boolean"});
  j = minimal_byte_fallback();
  j["normalizer"] = nullptr;
  expect_error(write(j), {"normalizer", "Replace"});
  j = minimal_byte_fallback();
  j["normalizer"]["normalizers"][0]["prepend"] = "x";
  expect_error(write(j), {"normalizer.normalizers[0].prepend", "'x'"});
  j = minimal_byte_fallback();
  j["normalizer"]["normalizers"][1]["pattern"] = json::parse(R"({"Regex": " +"})");
  expect_error(write(j), {"normalizer.normalizers[1]", "Replace"});
  j = minimal_byte_fallback();
  j["pre_tokenizer"] = json::parse(R"({"type": "Metaspace", "replacement": "\u2581",
                                        "prepend_scheme": "first", "split": true})");
  expect_error(write(j), {"pre_tokenizer.split"});
  j["pre_tokenizer"]["split"] = false;
  j["pre_tokenizer"]["prepend_scheme"] = "sometimes";
  expect_error(write(j), {"pre_tokenizer.prepend_scheme", "sometimes"});
  j["pre_tokenizer"] = json::parse(R"({"type": "Whitespace"})");
  expect_error(write(j), {"pre_tokenizer", "Whitespace"});
  j = minimal_byte_fallback();
  j["decoder"]["decoders"].erase(1);  // no ByteFallback
  expect_error(write(j), {"decoder.decoders[1].type", "Fuse"});
  j = minimal_byte_fallback();
  j["decoder"]["decoders"][3]["start"] = 2;
  expect_error(write(j), {"decoder.decoders[3]", "Strip"});
  j = minimal_byte_fallback();
  j["decoder"] = json::parse(R"({"type": "ByteLevel"})");
  expect_error(write(j), {"decoder.type", "ByteLevel"});
  j = minimal_byte_fallback();
  j["model"]["ignore_merges"] = true;
  expect_error(write(j), {"model.ignore_merges"});
  j = minimal_byte_fallback();
  j["added_tokens"][0]["normalized"] = 1;
  expect_error(write(j), {"added_tokens[0].normalized", "expected a boolean"});
  j = minimal_byte_fallback();
  j["model"]["merges"] = json::array({json::array({"\u2581", "z"})});
  expect_error(write(j), {"merge 0", "'z'"});
}

TEST_F(TokenizerJsonErrors, MissingModel) {
  json j = minimal();
  j.erase("model");
  expect_error(write(j), {"model", "missing"});
}

TEST_F(TokenizerJsonErrors, BadMerges) {
  json j = minimal();
  j["model"]["merges"] = json::array({json::array({"a", 1})});
  expect_error(write(j), {"model.merges[0]"});
  j["model"]["merges"] = "a b";
  expect_error(write(j), {"model.merges", "expected an array"});
  j["model"]["merges"] = json::array({"a c"});  // token 'c' is not in the vocabulary
  expect_error(write(j), {"merge 0", "'c'"});
  j["model"].erase("merges");
  expect_error(write(j), {"model.merges", "missing"});
}

TEST_F(TokenizerJsonErrors, UnknownPreTokenizer) {
  json j = minimal();
  j["pre_tokenizer"] = json::parse(R"({"type": "Sequence", "pretokenizers": [
      {"type": "Split", "pattern": {"Regex": "\\p{L}+"}, "behavior": "Isolated", "invert": false},
      {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}]})");
  expect_error(write(j), {"pre_tokenizer", "unsupported pre-tokenizer", "\\p{L}+"});
  j["pre_tokenizer"] = json::parse(R"({"type": "Whitespace"})");
  expect_error(write(j), {"pre_tokenizer.type", "Whitespace"});
  j["pre_tokenizer"] = nullptr;
  expect_error(write(j), {"pre_tokenizer", "null"});
  j["pre_tokenizer"] = json::parse(R"({"type": "ByteLevel", "add_prefix_space": true})");
  expect_error(write(j), {"pre_tokenizer.add_prefix_space"});
}

TEST_F(TokenizerJsonErrors, UnknownModelType) {
  for (const char* type : {"Unigram", "WordPiece", "WordLevel"}) {
    json j = minimal();
    j["model"]["type"] = type;
    expect_error(write(j), {"model.type", type});
  }
}

TEST_F(TokenizerJsonErrors, BrokenJson) {
  const std::string path = write("tokenizer.json", R"({"model": {"type": "BPE",, }})");
  expect_error(path, {"malformed JSON", "line 1"});
  expect_error(write("tokenizer.json", "[1, 2]"), {"(top level)", "expected an object"});
}

TEST_F(TokenizerJsonErrors, UnsupportedOptions) {
  json j = minimal();
  j["normalizer"] = json::parse(R"({"type": "NFC"})");
  EXPECT_EQ(Tokenizer::from_hf_json(write(j)).encode("ab", false, false), std::vector<int32_t>{2});
  j["normalizer"] = json::parse(R"({"type": "Lowercase"})");
  expect_error(write(j), {"normalizer.type", "Lowercase"});
  j["normalizer"] = json::parse(R"({"type": "Sequence", "normalizers": [{"type": "NFC"},
                                     {"type": "NFKC"}]})");
  expect_error(write(j), {"normalizer.normalizers[1].type", "NFKC"});
  j["normalizer"] = json::parse(R"({"type": "Sequence", "normalizers": [{"type": "NFC"},
                                     {"type": "NFC"}]})");
  expect_error(write(j), {"normalizer.normalizers[1]", "twice"});
  j["normalizer"] = json::parse(R"({"type": "Replace", "pattern": {"String": " "},
                                     "content": "\u2581"})");
  expect_error(write(j), {"normalizer", "byte_fallback"});  // not for byte-level BPE
  j["normalizer"] = json::parse(R"({"type": "NFC", "x": 1})");
  j["normalizer"].erase("type");
  expect_error(write(j), {"normalizer.type", "missing"});
  j = minimal();
  j["decoder"] = json::parse(R"({"type": "WordPiece"})");
  expect_error(write(j), {"decoder.type", "WordPiece"});
  j = minimal();
  j["model"]["byte_fallback"] = true;  // a byte-level file: ByteLevel pre-tokenizer
  expect_error(write(j), {"pre_tokenizer", "ByteLevel", "byte_fallback"});
  j["pre_tokenizer"] = nullptr;  // and no Replace normalizer
  expect_error(write(j), {"normalizer", "model.byte_fallback", "Replace"});
  j = minimal();
  j["model"]["ignore_merges"] = true;  // only the llama3 pre-tokenizer ignores merges
  expect_error(write(j), {"model.ignore_merges", "gpt2"});
  j = minimal();
  j["added_tokens"][0]["single_word"] = true;
  expect_error(write(j), {"added_tokens[0].single_word"});
  j = minimal();
  j["added_tokens"][0]["rstrip"] = "yes";
  expect_error(write(j), {"added_tokens[0].rstrip", "expected a boolean"});
}

TEST_F(TokenizerJsonErrors, BadIds) {
  json j = minimal();
  j["model"]["vocab"]["ab"] = 5;  // past the 4 entries
  expect_error(write(j), {"model.vocab['ab']", "id 5 is out of range", "4 entries"});
  // "b" listed again as an added token makes 5 entries: id 4 is in range but leaves id 2 empty.
  j["added_tokens"].push_back(json::parse(R"({"id": 1, "content": "b"})"));
  j["model"]["vocab"]["ab"] = 4;
  expect_error(write(j), {"model.vocab", "no token has id 2"});
  j = minimal();
  j["model"]["vocab"]["ab"] = "2";
  expect_error(write(j), {"model.vocab['ab']", "token id"});
  j = minimal();
  j["added_tokens"][0]["id"] = 1;  // id 1 is "b"
  expect_error(write(j), {"added_tokens[0]", "already 'b'"});
}

using test::bad_fixture;

// An id near 2^31 once sized the vocabulary to it (a 130-byte file asked for 2^31 tokens): ids
// must be below the number of entries, checked before any allocation.
TEST_F(TokenizerJsonErrors, IdBeyondTheEntriesIsRefusedBeforeAllocating) {
  expect_error(bad_fixture("vocab_id_huge.json"),
               {"model.vocab['a']", "id 2147483000 is out of range", "1 entries"});
  expect_error(bad_fixture("added_token_id_huge.json"),
               {"added_tokens[0].id", "id 2147483000 is out of range", "2 entries"});
}

// Sequences nested ten deep: the recursion stops at the ninth level with an error naming it.
TEST_F(TokenizerJsonErrors, DeepSequencesAreRefused) {
  std::string ninth = "normalizer";
  for (int level = 2; level <= 9; ++level) ninth += ".normalizers[0]";
  expect_error(bad_fixture("normalizer_nested.json"), {ninth + ":", "more than 8 deep"});
  ninth = "pre_tokenizer";
  for (int level = 2; level <= 9; ++level) ninth += ".pretokenizers[0]";
  expect_error(bad_fixture("pre_tokenizer_nested.json"), {ninth + ":", "more than 8 deep"});
}

// A post_processor of the wrong shape once escaped as nlohmann's type_error.302 ("internal
// error" in the CLI). It is read when tokenizer_config.json names a bos token but not
// add_bos_token.
TEST_F(TokenizerJsonErrors, MalformedPostProcessorIsAnError) {
  const std::string dir = bad_fixture("post_processor_type_number");
  expect_error(dir, {"post_processor.type", "an integer (1), expected a string"},
               dir + "/tokenizer.json");
  write("tokenizer_config.json", R"({"bos_token": "a"})");
  const json ok = json::parse(R"({"type": "TemplateProcessing", "single": [
                                  {"SpecialToken": {"id": "a", "type_id": 0}}]})");
  json j = minimal();
  j["post_processor"] = ok;
  EXPECT_TRUE(Tokenizer::from_hf_json(write(j)).add_bos());
  j["post_processor"] = {{"type", "Sequence"}, {"processors", json::array({ok})}};
  EXPECT_TRUE(Tokenizer::from_hf_json(write(j)).add_bos());
  j["post_processor"]["processors"][0]["type"] = false;
  expect_error(write(j), {"post_processor.processors[0].type", "expected a string"});
  j["post_processor"]["processors"] = "x";
  expect_error(write(j), {"post_processor.processors", "expected an array"});
  j["post_processor"] = ok;
  j["post_processor"]["single"][0]["SpecialToken"]["id"] = 0;
  expect_error(write(j), {"post_processor.single[0].SpecialToken.id", "expected a string"});
  j["post_processor"]["single"][0] = 7;
  expect_error(write(j), {"post_processor.single[0]", "expected an object"});
  j["post_processor"]["single"] = 7;
  expect_error(write(j), {"post_processor.single", "expected an array"});
  j["post_processor"] = 7;
  expect_error(write(j), {"post_processor", "expected an object"});
  j = minimal();
  j["model"]["unk_token"] = 0;
  expect_error(write(j), {"model.unk_token", "expected a string"});
}

// Names from the file (here 300 bytes after a terminal escape sequence) are quoted escaped and
// cut short.
TEST_F(TokenizerJsonErrors, NamesFromTheFileAreEscapedAndCut) {
  for (const char* name : {"merge_unknown_long.json", "split_behavior_long.json"}) {
    const std::string message = error_of(bad_fixture(name));
    ASSERT_FALSE(message.empty()) << name;
    test::expect_short_printable(message);
  }
  EXPECT_NE(error_of(bad_fixture("merge_unknown_long.json")).find("is not in the vocabulary"),
            std::string::npos);
  EXPECT_NE(error_of(bad_fixture("split_behavior_long.json")).find("pre_tokenizer.behavior"),
            std::string::npos);
}

TEST_F(TokenizerJsonErrors, BadConfig) {
  const std::string path = write(minimal());
  const std::string config = write("tokenizer_config.json", R"({"bos_token": "<s>"})");
  expect_error(path, {"bos_token", "'<s>'"}, config);
  write("tokenizer_config.json", R"({"eos_token": {"content": "<|end|>"}, "add_bos_token": 1})");
  expect_error(path, {"add_bos_token", "expected a boolean"}, config);
  write("tokenizer_config.json", R"({"eos_token": {"content": "<|end|>"}})");
  EXPECT_EQ(Tokenizer::from_hf_json(dir_.string()).eos_id(), 3);
  write("tokenizer_config.json", R"({"eos_token": "<|end|>",)");
  expect_error(path, {"malformed JSON"}, config);
}

TEST_F(TokenizerJsonErrors, MissingFile) {
  expect_error((dir_ / "nothing.json").string(), {"cannot open"});
  expect_error(dir_.string(), {"tokenizer.json", "cannot open"});
}

}  // namespace
}  // namespace llmk
