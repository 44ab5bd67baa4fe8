// The Hugging Face normalizers that tokenizer.json files of the supported families declare, as
// one flat description, and the Unicode normalization they need (utf8proc).
//
// tokenizers normalizes each stretch of text between the added tokens that are matched in the
// raw text ("normalized": false), before pre-tokenization; added tokens with "normalized": true
// are then matched in the normalized text (see Tokenizer::encode).
#pragma once

#include <string>
#include <string_view>

namespace llmk {

// U+2581 "▁", SentencePiece's written form of a space.
inline constexpr std::string_view kSpaceMark = "\xE2\x96\x81";

struct Normalizer {
  bool nfc = false;            // NFC: Unicode canonical composition
  bool prepend_space = false;  // Prepend("▁"): U+2581 before each non-empty stretch
  bool escape_spaces = false;  // Replace(" ", "▁"): every space becomes U+2581

  bool empty() const { return !nfc && !prepend_space && !escape_spaces; }
  // `text` normalized. Bytes that are not valid UTF-8 pass through unchanged (the valid
  // stretches around them are normalized on their own).
  std::string apply(std::string_view text) const;
};

namespace unicode {
// The NFC form of `text` (canonical decomposition, then composition; utf8proc's tables).
// Bytes that are not valid UTF-8 are kept as they are.
std::string nfc(std::string_view text);
// Bytes of the longest prefix / suffix of `text` made of White_Space characters (Unicode's
// property, as Rust's char::is_whitespace, which tokenizers' lstrip and rstrip use).
size_t whitespace_prefix(std::string_view text);
size_t whitespace_suffix(std::string_view text);
}  // namespace unicode

}  // namespace llmk
