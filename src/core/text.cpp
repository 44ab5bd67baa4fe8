#include "core/text.h"

#include <fmt/format.h>

namespace llmk {

std::string printable(std::string_view s, size_t max_bytes) {
  size_t shown = s.size();
  if (shown > max_bytes) {
    shown = max_bytes;
    // Back off to the start of a UTF-8 character (at most 3 continuation bytes).
    for (int i = 0; i < 3 && shown > 0 && (static_cast<unsigned char>(s[shown]) & 0xc0) == 0x80;
         ++i) {
      --shown;
    }
  }
  std::string out;
  out.reserve(shown + 16);
  for (char c : s.substr(0, shown)) {
    const auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      case '"':
      case '\'':
      case '\\':
        out += '\\';
        out += c;
        break;
      default:
        if (u < 0x20 || u == 0x7f) {
          out += fmt::format("\\x{:02x}", u);
        } else {
          out += c;
        }
    }
  }
  if (shown < s.size()) out += fmt::format("... ({} bytes)", s.size());
  return out;
}

}  // namespace llmk
