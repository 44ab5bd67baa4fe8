// Tokenizer::from_gguf on small GGUF files written here: the keys it reads, and errors that
// name the file and the problem.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/text.h"
#include "formats/gguf.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer_test_util.h"

namespace llmk {
namespace {

// Writes a GGUF v3 file with metadata only (no tensors).
class GgufWriter {
 public:
  void string(const std::string& key, const std::string& value) {
    kv_header(key, gguf::ValueType::STRING);
    str(value);
  }
  void u32(const std::string& key, uint32_t value) {
    kv_header(key, gguf::ValueType::U32);
    raw(value);
  }
  void boolean(const std::string& key, bool value) {
    kv_header(key, gguf::ValueType::BOOL);
    raw(static_cast<uint8_t>(value));
  }
  void strings(const std::string& key, const std::vector<std::string>& values) {
    kv_header(key, gguf::ValueType::ARRAY);
    raw(static_cast<uint32_t>(gguf::ValueType::STRING));
    raw(static_cast<uint64_t>(values.size()));
    for (const auto& v : values) str(v);
  }
  void i32s(const std::string& key, const std::vector<int32_t>& values) {
    kv_header(key, gguf::ValueType::ARRAY);
    raw(static_cast<uint32_t>(gguf::ValueType::I32));
    raw(static_cast<uint64_t>(values.size()));
    for (int32_t v : values) raw(v);
  }
  std::string save(const std::string& name) const {
    // The pid keeps concurrent runs (several build trees, ctest -j) apart.
    const std::string path =
        (std::filesystem::temp_directory_path() / (std::to_string(::getpid()) + "_" + name))
            .string();
    std::ofstream out(path, std::ios::binary);
    std::string header = "GGUF";
    append(header, uint32_t{3});
    append(header, uint64_t{0});  // tensors
    append(header, kv_count_);
    out << header << body_;
    return path;
  }

 private:
  template <typename T>
  static void append(std::string& s, T v) {
    char b[sizeof v];
    std::memcpy(b, &v, sizeof v);
    s.append(b, sizeof v);
  }
  template <typename T>
  void raw(T v) {
    append(body_, v);
  }
  void str(const std::string& s) {
    raw(static_cast<uint64_t>(s.size()));
    body_ += s;
  }
  void kv_header(const std::string& key, gguf::ValueType t) {
    str(key);
    raw(static_cast<uint32_t>(t));
    ++kv_count_;
  }
  std::string body_;
  uint64_t kv_count_ = 0;
};

// A byte-level vocabulary: the 256 bytes, "ab", and "<|end|>" (control).
GgufWriter toy_gguf(const std::string& model, const std::string& pre) {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  for (int b = 0; b < 256; ++b) {
    tokens.emplace_back(byte_level::spell(static_cast<unsigned char>(b)));
    types.push_back(1);
  }
  tokens.push_back("ab");
  types.push_back(1);
  tokens.push_back("<|end|>");
  types.push_back(3);
  GgufWriter w;
  w.string("general.architecture", "llama");
  w.string("tokenizer.ggml.model", model);
  if (!pre.empty()) w.string("tokenizer.ggml.pre", pre);
  w.strings("tokenizer.ggml.tokens", tokens);
  w.i32s("tokenizer.ggml.token_type", types);
  w.strings("tokenizer.ggml.merges", {"a b"});
  w.u32("tokenizer.ggml.eos_token_id", 257);
  w.boolean("tokenizer.ggml.add_bos_token", false);
  w.string("tokenizer.chat_template", "<|im_start|>");
  return w;
}

std::string load_error(const std::string& path) {
  try {
    Tokenizer::from_gguf(gguf::File::open(path));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(TokenizerGguf, ReadsTheTokenizerKeys) {
  const std::string path = toy_gguf("gpt2", "smollm").save("llmk_tok_ok.gguf");
  const Tokenizer t = Tokenizer::from_gguf(gguf::File::open(path));
  EXPECT_EQ(t.vocab_size(), 258);
  EXPECT_EQ(t.eos_id(), 257);
  EXPECT_EQ(t.bos_id(), -1);
  EXPECT_FALSE(t.add_bos());
  EXPECT_EQ(t.pre_tokenizer(), "smollm");
  EXPECT_EQ(t.chat_template(), "<|im_start|>");
  EXPECT_EQ(t.encode("ab<|end|>", false, true), (std::vector<int32_t>{256, 257}));
  EXPECT_EQ(t.end_of_generation_ids(), (std::vector<int32_t>{257}));
  std::filesystem::remove(path);
}

TEST(TokenizerGguf, MissingPreMeansGpt2) {
  const std::string path = toy_gguf("gpt2", "").save("llmk_tok_nopre.gguf");
  EXPECT_EQ(Tokenizer::from_gguf(gguf::File::open(path)).pre_tokenizer(), "gpt2");
  std::filesystem::remove(path);
}

TEST(TokenizerGguf, UnsupportedModelOrPreNamesItAndTheFile) {
  const std::string p1 = toy_gguf("t5", "smollm").save("llmk_tok_t5.gguf");
  const std::string e1 = load_error(p1);
  EXPECT_NE(e1.find(p1), std::string::npos) << e1;
  EXPECT_NE(e1.find("unsupported tokenizer model 't5'"), std::string::npos) << e1;
  const std::string p2 = toy_gguf("gpt2", "default").save("llmk_tok_default.gguf");
  const std::string e2 = load_error(p2);
  EXPECT_NE(e2.find("unsupported pre-tokenizer 'default'"), std::string::npos) << e2;
  EXPECT_NE(e2.find(p2), std::string::npos) << e2;
  std::filesystem::remove(p1);
  std::filesystem::remove(p2);
}

TEST(TokenizerGguf, MissingTokensNameTheKey) {
  GgufWriter w;
  w.string("tokenizer.ggml.model", "gpt2");
  const std::string path = w.save("llmk_tok_notokens.gguf");
  EXPECT_NE(load_error(path).find("tokenizer.ggml.tokens"), std::string::npos) << load_error(path);
  std::filesystem::remove(path);
}

// Reproducers written by tests/fixtures/bad/tokenizer/make_gguf.py: names of 300 bytes after a
// terminal escape sequence are quoted escaped and cut short.
TEST(TokenizerGguf, NamesFromTheFileAreEscapedAndCut) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"gguf_model_long.gguf", "unsupported tokenizer model"},
      {"gguf_pre_long.gguf", "unsupported pre-tokenizer"},
      {"gguf_byte_token_long.gguf", "byte token 0"},
  };
  for (const auto& [name, what] : cases) {
    const std::string path = test::bad_fixture(name);
    const std::string message = load_error(path);
    ASSERT_FALSE(message.empty()) << name;
    EXPECT_NE(message.find(path), std::string::npos) << message;
    EXPECT_NE(message.find(what), std::string::npos) << message;
    test::expect_short_printable(message);
  }
}

// A NaN score leaves the merges of a SentencePiece vocabulary without an order. The reproducer
// is written by tests/fixtures/bad/tokenizer/make_gguf.py.
TEST(TokenizerGguf, NanScoreIsAnError) {
  const std::string path = test::bad_fixture("gguf_score_nan.gguf");
  const std::string message = load_error(path);
  EXPECT_NE(message.find(path + ": tokenizer.ggml.scores[1] is NaN"), std::string::npos) << message;
}

}  // namespace
}  // namespace llmk
