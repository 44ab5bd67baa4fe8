#include "tokenizer/normalizer.h"

#include <utf8proc.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <utility>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace llmk {
namespace {

// NFC of valid UTF-8 (utf8proc_map allocates the result with malloc).
void append_nfc(std::string_view valid, std::string& out) {
  if (valid.empty()) return;
  utf8proc_uint8_t* mapped = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(valid.data()),
                   static_cast<utf8proc_ssize_t>(valid.size()), &mapped,
                   static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  const std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owned(mapped, &std::free);
  LLMK_CHECK(n >= 0, "NFC normalization failed: {}", utf8proc_errmsg(n));
  out.append(reinterpret_cast<const char*>(mapped), static_cast<size_t>(n));
}

}  // namespace

namespace unicode {

std::string nfc(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  while (!text.empty()) {
    const size_t valid = utf8::valid_prefix(text);
    append_nfc(text.substr(0, valid), out);
    if (valid == text.size()) break;
    out += text[valid];  // an invalid byte, kept
    text.remove_prefix(valid + 1);
  }
  return out;
}

namespace {

bool is_white_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

// The code point of the valid sequence of `len` bytes at text[pos].
uint32_t code_point(std::string_view text, size_t pos, size_t len) {
  const auto byte = [&](size_t i) { return static_cast<uint32_t>(static_cast<uint8_t>(text[i])); };
  if (len == 1) return byte(pos);
  uint32_t c = byte(pos) & (0xFFu >> (len + 1));
  for (size_t i = 1; i < len; ++i) c = (c << 6) | (byte(pos + i) & 0x3F);
  return c;
}

}  // namespace

size_t whitespace_prefix(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t len = utf8::sequence_length(text, pos);
    if (len == 0 || !is_white_space(code_point(text, pos, len))) break;
    pos += len;
  }
  return pos;
}

size_t whitespace_suffix(std::string_view text) {
  size_t end = text.size();
  while (end > 0) {
    size_t start = end - 1;  // back to the first byte of the last character
    while (start > 0 && end - start < 4 && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) {
      --start;
    }
    const size_t len = utf8::sequence_length(text, start);
    if (len != end - start || !is_white_space(code_point(text, start, len))) break;
    end = start;
  }
  return text.size() - end;
}

}  // namespace unicode

std::string Normalizer::apply(std::string_view text) const {
  std::string s = nfc ? unicode::nfc(text) : std::string(text);
  if (prepend_space && !s.empty()) s.insert(0, kSpaceMark);
  if (escape_spaces) {
    std::string escaped;
    escaped.reserve(s.size() + s.size() / 4);
    for (char c : s) {
      if (c == ' ') {
        escaped += kSpaceMark;
      } else {
        escaped += c;
      }
    }
    s = std::move(escaped);
  }
  return s;
}

}  // namespace llmk
