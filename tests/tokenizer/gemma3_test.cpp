// Gemma 3's tokenizer (SentencePiece-style BPE with byte fallback), loaded from
// models/gemma-3-270m-q4_k_m.gguf, against the ids of Hugging Face
// (tests/fixtures/tokenizer/gemma3.json, from tests/fixtures/tokenizer/make_gemma3.py).
#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "tokenizer/chat_template.h"
#include "tokenizer/spm_model.h"
#include "tokenizer_test_util.h"

namespace llmk {
namespace {

using Ids = std::vector<int32_t>;

const nlohmann::json& fixture() {
  static const nlohmann::json fx = test::load_fixture("gemma3.json");
  return fx;
}

std::string show(const std::string& s) { return testing::PrintToString(s); }

// Gemma 3's tokenizer, loaded once (the load time is printed). A missing model or a load error
// throws, failing the test that asked.
double gemma3_load_seconds = 0;
const Tokenizer& gemma3() {
  static const Tokenizer tok = [] {
    const std::string path = test::model_path(test::kGemma3);
    const auto t0 = std::chrono::steady_clock::now();
    Tokenizer t = Tokenizer::from_gguf(gguf::File::open(path));
    gemma3_load_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return t;
  }();
  return tok;
}

#define LLMK_REQUIRE_GEMMA3(tok) const ::llmk::Tokenizer* tok = &gemma3()

// The ids Hugging Face gives `text` (the fixture's case; see test::fixture_ids).
Ids hf_ids(const std::string& text) { return test::fixture_ids(fixture(), text); }
int32_t hf_id(const std::string& text) { return test::fixture_id(fixture(), text); }

Ids concat(std::initializer_list<Ids> parts) {
  Ids out;
  for (const Ids& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

// A literal U+2581 in the text is SentencePiece's space: it decodes as " " (as in Hugging Face).
std::string spaces_for_u2581(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const bool space = s.substr(i, 3) == "\u2581";
    out += space ? ' ' : s[i];
    i += space ? 3 : 1;
  }
  return out;
}

// Every id here is the one Hugging Face gives the token's text in the fixture.
TEST(Gemma3, Metadata) {
  LLMK_REQUIRE_GEMMA3(tok);
  std::printf("[ SPEED    ] Tokenizer::from_gguf (open + load, %d tokens): %.3f s\n",
              tok->vocab_size(), gemma3_load_seconds);
  EXPECT_EQ(tok->vocab_size(), 262144);
  EXPECT_EQ(tok->vocab_size(), fixture().at("vocab_size").get<int>());
  EXPECT_EQ(tok->bos_id(), fixture().at("bos_id").get<int>());
  EXPECT_EQ(tok->eos_id(), fixture().at("eos_id").get<int>());
  // The GGUF's tokenizer.ggml.unknown_token_id and padding_token_id name <unk> and <pad>.
  EXPECT_EQ(tok->unk_id(), hf_id("<unk>"));
  EXPECT_EQ(tok->pad_id(), hf_id("<pad>"));
  EXPECT_TRUE(tok->add_bos());
  EXPECT_EQ(tok->pre_tokenizer(), "default");
  EXPECT_EQ(tok->chat_template(), "");  // this GGUF carries none
  EXPECT_EQ(tok->end_of_generation_ids(), (Ids{hf_id("<eos>"), hf_id("<end_of_turn>")}));
  const int32_t start_of_turn = hf_id("<start_of_turn>");
  EXPECT_EQ(tok->find_token("<start_of_turn>"), start_of_turn);
  EXPECT_EQ(tok->token_type(start_of_turn), TokenType::Control);
  EXPECT_TRUE(tok->is_special(hf_id("<end_of_turn>")));
  const int32_t newline = hf_id("\n");
  EXPECT_EQ(tok->token_type(newline), TokenType::UserDefined);
  EXPECT_FALSE(tok->is_special(newline));
  EXPECT_EQ(tok->token_text(hf_id(" ")), "\u2581");
  EXPECT_EQ(tok->token_bytes(hf_id(" ")), " ");
  EXPECT_EQ(tok->token_bytes(hf_id(" hello")), " hello");
  // Hugging Face encodes NUL (no token of its own) as the byte token <0x00>; the 256 byte tokens
  // follow it in byte order.
  const int32_t byte0 = hf_ids(std::string("a\0b", 3)).at(1);
  EXPECT_EQ(tok->token_type(byte0), TokenType::Byte);
  EXPECT_EQ(tok->token_text(byte0), "<0x00>");
  EXPECT_EQ(tok->token_text(byte0 + 0x41), "<0x41>");
  EXPECT_EQ(tok->token_bytes(byte0 + 0x41), "A");
  EXPECT_EQ(tok->token_bytes(byte0 + 0xFF), "\xFF");
}

TEST(Gemma3, IdsMatchHuggingFace) {
  LLMK_REQUIRE_GEMMA3(tok);
  const auto& cases = fixture().at("cases");
  ASSERT_GE(cases.size(), 300u);
  int failures = 0, plain_checked = 0;
  for (const auto& c : cases) {
    const std::string text = c.at("text").get<std::string>();
    const Ids expected = c.at("ids").get<Ids>();
    const Ids got = tok->encode(text, false, true);
    if (got != expected && ++failures <= 10) {
      ADD_FAILURE() << "encode(" << show(text) << ")\n  got      " << testing::PrintToString(got)
                    << "\n  expected " << testing::PrintToString(expected);
    }
    const Ids expected_plain = c.contains("ids_plain") ? c.at("ids_plain").get<Ids>() : expected;
    plain_checked += c.contains("ids_plain");
    const Ids got_plain = tok->encode(text, false, false);
    if (got_plain != expected_plain && ++failures <= 10) {
      ADD_FAILURE() << "encode(" << show(text) << ", parse_special=false)\n  got      "
                    << testing::PrintToString(got_plain) << "\n  expected "
                    << testing::PrintToString(expected_plain);
    }
    for (int32_t id : got_plain) EXPECT_FALSE(tok->is_special(id)) << show(text);
  }
  EXPECT_EQ(failures, 0);
  EXPECT_GT(plain_checked, 20);
}

TEST(Gemma3, DecodeRestoresTheFixtureTexts) {
  LLMK_REQUIRE_GEMMA3(tok);
  for (const auto& c : fixture().at("cases")) {
    const std::string text = c.at("text").get<std::string>();
    const std::string expected = spaces_for_u2581(text);
    for (bool special : {true, false}) {
      const Ids ids = tok->encode(text, false, special);
      EXPECT_EQ(tok->decode(ids), expected) << show(text);
      std::string streamed;
      for (int32_t id : ids) streamed += tok->token_bytes(id);
      EXPECT_EQ(streamed, expected);
    }
  }
}

// Any bytes round-trip: characters without a token and invalid UTF-8 become byte tokens.
TEST(Gemma3, RandomTextRoundTrips) {
  LLMK_REQUIRE_GEMMA3(tok);
  std::mt19937 rng(11);
  const auto append_utf8 = [](std::string& s, uint32_t cp) {
    if (cp < 0x80) {
      s += static_cast<char>(cp);
    } else if (cp < 0x800) {
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      s += static_cast<char>(0xE0 | (cp >> 12));
      s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      s += static_cast<char>(0xF0 | (cp >> 18));
      s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
  };
  const uint32_t ranges[][2] = {{0x00, 0x7F},     {0x80, 0x7FF},      {0x800, 0xD7FF},
                                {0xE000, 0xFFFF}, {0x10000, 0x3FFFF}, {0xC0000, 0x10FFFF},
                                {0x20, 0x7E},     {0x4E00, 0x9FFF}};
  for (int trial = 0; trial < 400; ++trial) {
    std::string s;
    const int len = std::uniform_int_distribution<int>(0, 40)(rng);
    for (int i = 0; i < len; ++i) {
      if (trial % 4 == 3 && i % 7 == 0) {  // some invalid UTF-8: a lone byte
        s += static_cast<char>(std::uniform_int_distribution<int>(0x80, 0xFF)(rng));
        continue;
      }
      const auto& r = ranges[std::uniform_int_distribution<int>(0, 7)(rng)];
      uint32_t cp = std::uniform_int_distribution<uint32_t>(r[0], r[1])(rng);
      if (cp == 0x2581) cp = ' ';
      append_utf8(s, cp);
    }
    for (bool special : {true, false}) {
      if (tok->decode(tok->encode(s, false, special)) != s) {
        ADD_FAILURE() << "round trip of " << show(s);
        return;
      }
    }
  }
}

// The ids are Hugging Face's for the pieces of each text (fixture cases); what is tested is how
// llmk puts them together: special-token parsing and the single <bos>.
TEST(Gemma3, SpecialTokens) {
  LLMK_REQUIRE_GEMMA3(tok);
  const int32_t bos = fixture().at("bos_id").get<int32_t>();
  // Control tokens are plain text unless parse_special; user-defined ones ("\n", "<table>",
  // runs of spaces) always match, as in Hugging Face and llama.cpp.
  const Ids plain = tok->encode("<start_of_turn>user\n<table>a  b", false, false);
  for (int32_t id : plain) EXPECT_NE(id, hf_id("<start_of_turn>"));
  const Ids tail = concat({hf_ids("\n"), hf_ids("<table>"), hf_ids("a  b")});
  ASSERT_GE(plain.size(), tail.size());
  EXPECT_EQ(Ids(plain.end() - static_cast<ptrdiff_t>(tail.size()), plain.end()), tail);
  // add_bos: one <bos>, also when the text starts with one (Gemma's chat template writes it).
  const Ids hello = hf_ids("Hello");
  EXPECT_EQ(tok->encode("Hello", true, true), concat({{bos}, hello}));
  EXPECT_EQ(tok->encode("<bos>Hello", true, true), concat({{bos}, hello}));
  EXPECT_EQ(tok->encode("<bos>Hello", false, true), concat({{bos}, hello}));
  EXPECT_EQ(tok->encode("<bos><bos>Hello", true, true), concat({{bos, bos}, hello}));
  const Ids literal = tok->encode("<bos>Hello", true, false);
  EXPECT_EQ(literal.front(), bos);
  EXPECT_GT(literal.size(), 3u);
  EXPECT_EQ(tok->decode(literal, /*skip_special=*/true), "<bos>Hello");
  const std::string turn = "<bos><start_of_turn>user\nHello<end_of_turn>\n";
  EXPECT_EQ(tok->decode(hf_ids(turn), /*skip_special=*/true), "user\nHello\n");
  EXPECT_EQ(tok->decode(hf_ids(turn)), turn);
  EXPECT_TRUE(tok->encode("", false, true).empty());
  EXPECT_EQ(tok->encode("", true, true), (Ids{bos}));
}

TEST(Gemma3, ChatTemplateMatchesTransformers) {
  const nlohmann::json& fx = fixture();
  const ChatTemplate t = ChatTemplate::from_jinja(fx.at("chat_template").get<std::string>());
  EXPECT_EQ(t.family(), "gemma");
  EXPECT_EQ(t.default_system(), "");
  ASSERT_GE(fx.at("chat").size(), 20u);
  int errors = 0;
  for (const auto& c : fx.at("chat")) {
    std::vector<ChatMessage> messages;
    for (const auto& m : c.at("messages")) {
      messages.push_back({m.at("role").get<std::string>(), m.at("content").get<std::string>()});
    }
    const std::string name = c.at("name").get<std::string>();
    const bool gen = c.at("add_generation_prompt").get<bool>();
    if (c.contains("error")) {
      ++errors;
      EXPECT_THROW(t.apply(messages, gen), Error) << name;
      continue;
    }
    EXPECT_EQ(t.apply(messages, gen), c.at("text").get<std::string>()) << name;
  }
  EXPECT_GT(errors, 2);
}

// The rendered prompts tokenize as Hugging Face tokenizes them, with a single <bos> also when
// the model's add_bos is honoured.
TEST(Gemma3, ChatPromptIds) {
  LLMK_REQUIRE_GEMMA3(tok);
  for (const auto& c : fixture().at("chat")) {
    if (c.contains("error")) continue;
    const std::string text = c.at("text").get<std::string>();
    const Ids expected = c.at("ids").get<Ids>();
    ASSERT_EQ(expected.at(0), 2);
    EXPECT_EQ(tok->encode(text, false, true), expected) << show(text);
    EXPECT_EQ(tok->encode(text, tok->add_bos(), true), expected) << show(text);
  }
}

// Tokens per second on a long text (printed; the assertion is only a floor against accidents).
TEST(Gemma3, EncodeSpeed) {
  LLMK_REQUIRE_GEMMA3(tok);
  std::string text;
  const auto& cases = fixture().at("cases");
  while (text.size() < (1u << 20)) {
    for (const auto& c : cases) text += c.at("text").get<std::string>() + "\n";
  }
  for (bool special : {true, false}) {
    const auto t0 = std::chrono::steady_clock::now();
    const Ids ids = tok->encode(text, false, special);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf(
        "[ SPEED    ] encode (parse_special=%d): %zu bytes -> %zu tokens in %.3f s: %.2f M "
        "tokens/s, %.1f MB/s\n",
        special, text.size(), ids.size(), s, ids.size() / s / 1e6, text.size() / s / 1e6);
    EXPECT_EQ(tok->decode(ids), spaces_for_u2581(text));
    EXPECT_LT(s, 30.0);
  }
}

// The merge order on a toy vocabulary, no model needed: the highest-scoring merge first,
// leftmost among equals; a character without a token becomes its byte tokens and merges with
// nothing.
TEST(SpmModel, MergeOrderAndByteFallback) {
  std::vector<std::string> tokens = {"<unk>", "a",   "b",      "c",      "ab",
                                     "bc",    "abc", "\u2581", "\u2581a"};
  std::vector<float> scores = {0, -1, -1, -1, -5, -3, -2, -1, -4};
  std::vector<TokenType> types(tokens.size(), TokenType::Normal);
  types[0] = TokenType::Unknown;
  for (int b = 0; b < 256; ++b) {
    tokens.push_back(fmt::format("<0x{:02X}>", b));
    scores.push_back(0);
    types.push_back(TokenType::Byte);
  }
  const auto byte = [](int b) { return 9 + b; };
  const SpmModel spm(tokens, scores, types, 0);
  SpmModel::Scratch scratch;
  const auto encode = [&](std::string_view text) {
    Ids out;
    spm.encode(text, scratch, out);
    return out;
  };
  EXPECT_EQ(encode("abc"), (Ids{6}));  // bc (-3) before ab (-5), then a+bc
  EXPECT_EQ(encode("ab"), (Ids{4}));
  EXPECT_EQ(encode(" a"), (Ids{8}));
  EXPECT_EQ(encode("a a"), (Ids{1, 8}));
  EXPECT_EQ(encode("bb"), (Ids{2, 2}));
  EXPECT_EQ(encode("a\u00e9b"), (Ids{1, byte(0xC3), byte(0xA9), 2}));
  EXPECT_EQ(encode("\xFF"
                   "ab"),
            (Ids{byte(0xFF), 4}));
  EXPECT_EQ(encode(""), Ids{});
  EXPECT_EQ(SpmModel::token_bytes("\u2581a\u2581", TokenType::Normal), " a ");
  EXPECT_EQ(SpmModel::token_bytes("<0x0A>", TokenType::Byte), "\n");
  EXPECT_EQ(SpmModel::token_bytes("<0x0A>", TokenType::Control), "<0x0A>");
}

// Scores of normal tokens that fall with the id rank merges by id, which also ranks the
// user-defined tokens Gemma scores -1000; a user-defined run of spaces is merged to as "▁▁".
TEST(SpmModel, RanksByIdWhenScoresFollowIt) {
  const std::vector<std::string> tokens = {"<unk>", "a", "b", "  ", "\u2581", "\u2581b"};
  const std::vector<float> scores = {0, -1, -2, -1000, -3, -4};
  const std::vector<TokenType> types = {TokenType::Unknown, TokenType::Normal,
                                        TokenType::Normal,  TokenType::UserDefined,
                                        TokenType::Normal,  TokenType::Normal};
  EXPECT_TRUE(SpmModel::is_space_run("  ", TokenType::UserDefined));
  EXPECT_FALSE(SpmModel::is_space_run("  ", TokenType::Normal));
  EXPECT_FALSE(SpmModel::is_space_run(" \t", TokenType::UserDefined));
  const SpmModel spm(tokens, scores, types, 0);
  SpmModel::Scratch scratch;
  Ids out;
  spm.encode("a  b", scratch, out);
  EXPECT_EQ(out, (Ids{1, 3, 2}));  // by score, "▁b" (-4) would beat "▁▁" (-1000)
  out.clear();
  spm.encode("a b", scratch, out);
  EXPECT_EQ(out, (Ids{1, 5}));
  out.clear();
  spm.encode("\u00e9", scratch, out);  // no byte tokens: each byte is <unk>
  EXPECT_EQ(out, (Ids{0, 0}));
}

}  // namespace
}  // namespace llmk
