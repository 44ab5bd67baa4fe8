#include "tokenizer/normalizer.h"

#include <utf8proc.h>

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
