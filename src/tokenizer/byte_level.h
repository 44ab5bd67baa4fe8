// GPT-2's byte-level alphabet: every byte 0..255 is spelled as one printable Unicode character,
// so that a byte-level BPE vocabulary can be stored as text. Printable Latin-1 bytes ('!'..'~',
// '¡'..'¬', '®'..'ÿ') stand for themselves; the other 68 bytes take U+0100.. in byte order
// (space is 'Ġ' U+0120, '\n' is 'Ċ' U+010A).
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace llmk::byte_level {

// The UTF-8 spelling of byte `b`'s character (one or two bytes).
std::string_view spell(unsigned char b);

// The spelling of every byte of `bytes`, concatenated.
std::string encode(std::string_view bytes);

// The bytes a spelled string stands for, or nullopt when it holds a character outside the
// alphabet (or is not valid UTF-8).
std::optional<std::string> decode(std::string_view spelled);

}  // namespace llmk::byte_level
