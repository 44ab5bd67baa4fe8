// The tokenizer core on small hand-made vocabularies: merge order, special tokens, decoding
// and every error a TokenizerData can provoke.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer.h"

namespace llmk {
namespace {

using Ids = std::vector<int32_t>;

// Tokens 0..255 are the single bytes (in the byte alphabet), then `extra` in order. Merges are
// written with raw text and spelled here ("a b" -> "a b", " t" -> "Ġ t").
struct ToyVocab {
  TokenizerData data;

  ToyVocab() {
    data.model = "gpt2";
    data.pre = "gpt2";
    for (int b = 0; b < 256; ++b) {
      data.tokens.emplace_back(byte_level::spell(static_cast<unsigned char>(b)));
      data.token_types.push_back(1);
    }
  }
  int32_t add(const std::string& raw, TokenType type = TokenType::Normal) {
    const bool plain = type == TokenType::Control || type == TokenType::UserDefined;
    data.tokens.push_back(plain ? raw : byte_level::encode(raw));
    data.token_types.push_back(static_cast<int32_t>(type));
    return static_cast<int32_t>(data.tokens.size() - 1);
  }
  // Adds the merge left+right (and its result token, unless present).
  int32_t merge(const std::string& left, const std::string& right) {
    data.merges.push_back(byte_level::encode(left) + " " + byte_level::encode(right));
    const std::string joined = byte_level::encode(left + right);
    for (size_t i = 0; i < data.tokens.size(); ++i) {
      if (data.tokens[i] == joined) return static_cast<int32_t>(i);
    }
    return add(left + right);
  }
  Tokenizer build() const { return Tokenizer::from_data(data); }
};

int32_t byte_id(char c) { return static_cast<unsigned char>(c); }

TEST(TokenizerCore, MergesLowestRankFirst) {
  ToyVocab v;
  const int32_t bc = v.merge("b", "c");  // rank 0
  const int32_t ab = v.merge("a", "b");  // rank 1: "abc" -> a + bc, not ab + c
  const int32_t abc = v.merge("a", "bc");
  const Tokenizer t = v.build();
  EXPECT_EQ(t.encode("abc", false, false), Ids{abc});
  EXPECT_EQ(t.encode("ab", false, false), Ids{ab});
  EXPECT_EQ(t.encode("bcb", false, false), (Ids{bc, byte_id('b')}));
}

TEST(TokenizerCore, EqualRanksMergeLeftmostFirst) {
  ToyVocab v;
  const int32_t aa = v.merge("a", "a");
  const int32_t aaaa = v.merge("aa", "aa");
  const Tokenizer t = v.build();
  EXPECT_EQ(t.encode("aaa", false, false), (Ids{aa, byte_id('a')}));
  EXPECT_EQ(t.encode("aaaaa", false, false), (Ids{aaaa, byte_id('a')}));
  EXPECT_EQ(t.encode("aaaaaaaa", false, false), (Ids{aaaa, aaaa}));
}

TEST(TokenizerCore, PiecesDoNotMergeAcrossThePreTokenizerSplit) {
  ToyVocab v;
  const int32_t sp_t = v.merge(" ", "t");
  const int32_t xy = v.merge("x", "y");
  const Tokenizer t = v.build();
  // GPT-2 split: "xy", " t", "xy" -- and " " + "t" merge inside a piece only.
  EXPECT_EQ(t.encode("xy txy", false, false), (Ids{xy, sp_t, xy}));
  EXPECT_EQ(t.encode("y t", false, false), (Ids{byte_id('y'), sp_t}));
  EXPECT_EQ(t.encode("x.y", false, false), (Ids{byte_id('x'), byte_id('.'), byte_id('y')}));
}

TEST(TokenizerCore, Llama3TakesWholeTokensBeforeMerging) {
  ToyVocab v;
  const int32_t ab = v.merge("a", "b");
  const int32_t abc = v.add("abc");  // a token no merge leads to
  v.data.pre = "gpt2";
  EXPECT_EQ(v.build().encode("abc", false, false), (Ids{ab, byte_id('c')}));
  v.data.pre = "llama-bpe";  // Hugging Face's ignore_merges
  const Tokenizer t = v.build();
  EXPECT_EQ(t.encode("abc", false, false), Ids{abc});
  EXPECT_EQ(t.encode("abcc", false, false), (Ids{ab, byte_id('c'), byte_id('c')}));
}

TEST(TokenizerCore, MissingBytesAreDroppedAndNeighboursStillMerge) {
  ToyVocab v;
  const int32_t ab = v.merge("a", "b");
  v.data.tokens['x'] = "<unused-x>";  // no token for the byte 'x' any more
  v.data.token_types['x'] = static_cast<int32_t>(TokenType::Unused);
  const Tokenizer t = v.build();
  EXPECT_EQ(t.encode("axb", false, false), Ids{ab});  // one piece: "a" and "b" meet
  EXPECT_EQ(t.encode("x", false, false), Ids{});
  EXPECT_EQ(t.decode(t.encode("x axxb", false, false)), " ab");
}

TEST(TokenizerCore, SpecialTokensAreMatchedOnlyWhenAsked) {
  ToyVocab v;
  const int32_t start = v.add("<|start|>", TokenType::Control);
  const int32_t start_long = v.add("<|start|>!", TokenType::Control);
  const int32_t end = v.add("<|end|>", TokenType::Control);
  const int32_t think = v.add("<think>", TokenType::UserDefined);
  const Tokenizer t = v.build();

  EXPECT_EQ(t.encode("<|end|>", false, true), Ids{end});
  // Leftmost first; at one position the longest.
  EXPECT_EQ(t.encode("x<|start|>!<|end|>", false, true), (Ids{byte_id('x'), start_long, end}));
  EXPECT_EQ(t.encode("<|start|><|end|>", false, true), (Ids{start, end}));
  EXPECT_EQ(t.encode("<<|end|>>", false, true), (Ids{byte_id('<'), end, byte_id('>')}));
  EXPECT_EQ(t.encode("<|end", false, true).size(), 5u);

  // Without parse_special, control tokens are plain text; user-defined ones still match.
  const Ids plain = t.encode("<|end|><think>", false, false);
  ASSERT_EQ(plain.size(), 8u);
  EXPECT_EQ(plain.back(), think);
  for (size_t i = 0; i + 1 < plain.size(); ++i) EXPECT_LT(plain[i], 256);
  EXPECT_EQ(t.decode(plain), "<|end|><think>");
}

TEST(TokenizerCore, BpeNeverProducesControlTokens) {
  ToyVocab v;
  v.add("ab", TokenType::Control);  // a control token spelled like an ordinary merge result
  v.data.merges.push_back("a b");
  const Tokenizer t = v.build();
  EXPECT_EQ(t.encode("ab", false, false), (Ids{byte_id('a'), byte_id('b')}));
  EXPECT_EQ(t.encode("ab", false, true).size(), 1u);  // but the text itself matches it
}

TEST(TokenizerCore, DecodeAndTokenBytes) {
  ToyVocab v;
  const int32_t sp_t = v.merge(" ", "t");
  const int32_t bos = v.add("<s>", TokenType::Control);
  const int32_t unk = v.add("<unk>", TokenType::Unknown);
  v.data.bos_id = bos;
  v.data.unk_id = unk;
  const Tokenizer t = v.build();
  EXPECT_EQ(t.token_text(sp_t), "Ġt");
  EXPECT_EQ(t.token_bytes(sp_t), " t");
  EXPECT_EQ(t.token_bytes(byte_id('\n')), "\n");
  EXPECT_EQ(t.token_text(byte_id('\n')), "Ċ");
  EXPECT_EQ(t.token_bytes(bos), "<s>");
  EXPECT_TRUE(t.is_special(bos));
  EXPECT_TRUE(t.is_special(unk));
  EXPECT_FALSE(t.is_special(sp_t));

  const Ids ids = t.encode(" t", true, false);
  EXPECT_EQ(ids, (Ids{bos, sp_t}));
  EXPECT_EQ(t.decode(ids), "<s> t");
  EXPECT_EQ(t.decode(ids, true), " t");
  // A character split across tokens decodes whole once its bytes are together.
  const std::string euro = "\xE2\x82\xAC";
  const Ids e = t.encode(euro, false, false);
  ASSERT_EQ(e.size(), 3u);
  EXPECT_EQ(t.decode(e), euro);
  EXPECT_EQ(t.token_bytes(e[0]) + t.token_bytes(e[1]) + t.token_bytes(e[2]), euro);
}

TEST(TokenizerCore, InvalidUtf8RoundTrips) {
  const Tokenizer t = ToyVocab().build();
  for (std::string s : {std::string("\xFF"), std::string("a\xC3"), std::string("\xE2\x82 x"),
                        std::string("\xED\xA0\x80"), std::string("ok \xF0\x9F\x98", 6),
                        std::string("\xC0\xAF\x80\x80zz")}) {
    EXPECT_EQ(t.decode(t.encode(s, false, true)), s);
  }
}

TEST(TokenizerCore, Lookups) {
  ToyVocab v;
  const int32_t eos = v.add("<|endoftext|>", TokenType::Control);
  const int32_t im_end = v.add("<|im_end|>", TokenType::Control);
  v.add("<|eot_id|>");  // normal text token: not an end of turn
  v.data.eos_id = eos;
  v.data.chat_template = "{{ x }}";
  v.data.add_bos = true;
  const Tokenizer t = v.build();
  EXPECT_EQ(t.vocab_size(), 259);
  EXPECT_EQ(t.eos_id(), eos);
  EXPECT_EQ(t.bos_id(), -1);
  EXPECT_TRUE(t.add_bos());
  EXPECT_EQ(t.chat_template(), "{{ x }}");
  EXPECT_EQ(t.find_token("<|im_end|>"), im_end);
  EXPECT_EQ(t.find_token("Ġ"), byte_id(' '));
  EXPECT_EQ(t.find_token("nope"), std::nullopt);
  EXPECT_EQ(t.end_of_generation_ids(), (Ids{eos, im_end}));
}

TEST(TokenizerCore, BadIdsThrow) {
  const Tokenizer t = ToyVocab().build();
  EXPECT_THROW(t.token_text(256), Error);
  EXPECT_THROW(t.token_bytes(-1), Error);
  EXPECT_THROW(t.is_special(1 << 20), Error);
  const Ids bad = {1, 2, 999};
  EXPECT_THROW(t.decode(bad), Error);
  EXPECT_THROW(t.encode("x", true, false), Error);  // no bos token
}

// Runs `edit` on a fresh toy vocabulary and expects from_data to throw a message containing
// `expected`.
template <typename Edit>
void expect_build_error(Edit edit, const std::string& expected) {
  ToyVocab v;
  v.merge("a", "b");
  edit(v.data);
  try {
    v.build();
    ADD_FAILURE() << "no error; expected one containing: " << expected;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
  }
}

TEST(TokenizerCore, BadDataThrowsNamingTheProblem) {
  expect_build_error([](TokenizerData& d) { d.model = "t5"; }, "unsupported tokenizer model 't5'");
  expect_build_error([](TokenizerData& d) { d.pre = "tekken"; },
                     "unsupported pre-tokenizer 'tekken'");
  expect_build_error([](TokenizerData& d) { d.pre = "tekken"; }, "smollm");
  expect_build_error(
      [](TokenizerData& d) {
        d.tokens.clear();
        d.token_types.clear();
      },
      "no tokens");
  expect_build_error([](TokenizerData& d) { d.eos_id = 257; }, "eos token id 257 out of range");
  expect_build_error([](TokenizerData& d) { d.bos_id = -2; }, "bos token id -2");
  expect_build_error([](TokenizerData& d) { d.token_types.pop_back(); }, "256 token types");
  expect_build_error([](TokenizerData& d) { d.token_types[3] = 9; }, "unknown token type 9");
  expect_build_error([](TokenizerData& d) { d.merges.push_back("ab"); }, "merge 1 ('ab')");
  expect_build_error([](TokenizerData& d) { d.merges.push_back("a zz"); },
                     "token 'zz' is not in the vocabulary");
  expect_build_error([](TokenizerData& d) { d.merges.push_back("b a"); },
                     "token 'ba' is not in the vocabulary");
}

}  // namespace
}  // namespace llmk
