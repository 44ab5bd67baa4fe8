#include "tokenizer/utf8.h"

#include <cstdint>

namespace llmk::utf8 {

size_t sequence_length(std::string_view text, size_t pos) {
  const auto at = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  const size_t left = text.size() - pos;
  const uint8_t c0 = at(pos);
  if (c0 < 0x80) return 1;
  size_t len;
  uint32_t cp;
  if (c0 >= 0xC2 && c0 <= 0xDF) {
    len = 2;
    cp = c0 & 0x1F;
  } else if (c0 >= 0xE0 && c0 <= 0xEF) {
    len = 3;
    cp = c0 & 0x0F;
  } else if (c0 >= 0xF0 && c0 <= 0xF4) {
    len = 4;
    cp = c0 & 0x07;
  } else {
    return 0;  // continuation byte, C0/C1 (always overlong) or F5..FF
  }
  if (left < len) return 0;
  for (size_t i = 1; i < len; ++i) {
    const uint8_t c = at(pos + i);
    if ((c & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (c & 0x3F);
  }
  const uint32_t min_cp = len == 2 ? 0x80 : len == 3 ? 0x800 : 0x10000;
  if (cp < min_cp || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return len;
}

size_t valid_prefix(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t n = sequence_length(text, pos);
    if (n == 0) break;
    pos += n;
  }
  return pos;
}

size_t complete_prefix(std::string_view text) {
  // Walk back over at most three continuation bytes to the last lead byte.
  size_t i = text.size();
  size_t back = 0;
  while (i > 0 && back < 4 && (static_cast<uint8_t>(text[i - 1]) & 0xC0) == 0x80) {
    --i;
    ++back;
  }
  if (i == 0) return text.size();
  const auto lead = static_cast<uint8_t>(text[i - 1]);
  // F8..FF never lead a sequence: such a byte is complete as it is.
  const size_t need = lead >= 0xF8 ? 1 : lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
  return need > back + 1 ? i - 1 : text.size();
}

}  // namespace llmk::utf8
