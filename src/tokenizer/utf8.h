// Small UTF-8 helpers: structure only (lengths, validity), no character properties.
#pragma once

#include <cstddef>
#include <string_view>

namespace llmk::utf8 {

// Length of the valid UTF-8 sequence starting at text[pos], or 0 when the bytes there are not
// one (a stray continuation byte, a truncated or overlong sequence, a surrogate, or a code
// point above U+10FFFF).
size_t sequence_length(std::string_view text, size_t pos);

// Bytes of the longest prefix of `text` that is valid UTF-8.
size_t valid_prefix(std::string_view text);

inline bool is_valid(std::string_view text) { return valid_prefix(text) == text.size(); }

// Bytes of the longest prefix of `text` that ends on a character boundary, assuming the text
// is valid UTF-8 apart from a possibly incomplete last character (for streaming output). A
// trailing byte that can never lead a sequence (F8..FF) counts as complete.
size_t complete_prefix(std::string_view text);

}  // namespace llmk::utf8
