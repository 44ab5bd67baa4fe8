// What the tokenizer targets do with a tokenizer: encode and decode, checking what the API
// promises (ids in range, decode of what encode gave succeeds).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_util.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace llmk::fuzz {

// Encodes `text` with every flag combination the tokenizer allows; each id must be in range and
// decode. Returns the ids of the plain encoding (no bos, special tokens not parsed).
inline std::vector<int32_t> encode_all_ways(const Tokenizer& tok, std::string_view text) {
  std::vector<int32_t> plain;
  for (const bool add_bos : {false, true}) {
    if (add_bos && tok.bos_id() < 0) continue;
    for (const bool parse_special : {false, true}) {
      const std::vector<int32_t> ids = tok.encode(text, add_bos, parse_special);
      for (const int32_t id : ids)
        check(id >= 0 && id < tok.vocab_size(), "encode: id out of range");
      (void)tok.decode(ids, false);
      (void)tok.decode(ids, true);
      if (!add_bos && !parse_special) plain = ids;
    }
  }
  return plain;
}

// For a tokenizer loaded from a fuzzed file: encode and decode a short text that touches special
// tokens, spaces, digits and bytes outside ASCII (invalid UTF-8 included), then the accessors
// and the chat template.
inline void exercise(const Tokenizer& tok) {
  static constexpr std::string_view kText =
      "Hello, world!  <|im_start|>user\n h\xc3\xa9llo \xe6\x97\xa5\xe6\x9c\xac 123 <s></s> "
      "\xff\xfe\xc3 <bos><eos>\t\r\n";
  encode_all_ways(tok, kText);
  for (int32_t id = 0; id < tok.vocab_size() && id < 64; ++id) {
    (void)tok.token_bytes(id);
    (void)tok.token_text(id);
    (void)tok.token_type(id);
    (void)tok.is_special(id);
  }
  (void)tok.end_of_generation_ids();
  if (!tok.chat_template().empty()) {
    const ChatMessage messages[] = {{"system", "Be brief."}, {"user", "Hi"}};
    (void)ChatTemplate::from_jinja(tok.chat_template()).apply(messages, true);
  }
}

// The encode/decode targets' input: one flags byte, then the text, or the ids (little-endian
// int32) with kDecodeIds.
struct EncodeInput {
  static constexpr uint8_t kDecodeIds = 1;  // decode the rest as ids instead of encoding it
  static constexpr uint8_t kSkipSpecial = 2;
  static constexpr uint8_t kAlternate = 4;  // the target's second tokenizer, where it has one
  uint8_t flags = 0;
  std::string_view rest;

  EncodeInput(const uint8_t* data, size_t size) {
    if (size == 0) return;
    flags = data[0];
    rest = std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1);
  }
  std::vector<int32_t> ids() const {
    std::vector<int32_t> out(rest.size() / sizeof(int32_t));
    if (!out.empty()) std::memcpy(out.data(), rest.data(), out.size() * sizeof(int32_t));
    return out;
  }
};

// Decodes fuzzed ids: ids out of range must throw llmk::Error, the others decode.
inline void decode_ids(const Tokenizer& tok, const EncodeInput& in) {
  expect_llmk_errors(
      [&] { (void)tok.decode(in.ids(), (in.flags & EncodeInput::kSkipSpecial) != 0); });
}

}  // namespace llmk::fuzz
