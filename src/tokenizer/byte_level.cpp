#include "tokenizer/byte_level.h"

#include <array>

namespace llmk::byte_level {
namespace {

bool stands_for_itself(int b) {
  return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

// Code point <-> byte tables. The alphabet's largest code point is U+0143.
constexpr int kMaxCodePoint = 0x143;

struct Tables {
  std::array<std::string, 256> spelling;
  std::array<int, kMaxCodePoint + 1> byte_of;  // -1: not in the alphabet

  Tables() {
    byte_of.fill(-1);
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const int cp = stands_for_itself(b) ? b : next++;
      byte_of[cp] = b;
      // Every code point here is below U+0800: one or two UTF-8 bytes.
      std::string& s = spelling[b];
      if (cp < 0x80) {
        s.push_back(static_cast<char>(cp));
      } else {
        s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
      }
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

std::string_view spell(unsigned char b) { return tables().spelling[b]; }

std::string encode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out += spell(static_cast<unsigned char>(c));
  return out;
}

std::optional<std::string> decode(std::string_view spelled) {
  const Tables& t = tables();
  std::string out;
  out.reserve(spelled.size());
  for (size_t i = 0; i < spelled.size();) {
    const auto c0 = static_cast<unsigned char>(spelled[i]);
    int cp;
    if (c0 < 0x80) {
      cp = c0;
      i += 1;
    } else if ((c0 & 0xE0) == 0xC0 && i + 1 < spelled.size() &&
               (static_cast<unsigned char>(spelled[i + 1]) & 0xC0) == 0x80) {
      cp = ((c0 & 0x1F) << 6) | (static_cast<unsigned char>(spelled[i + 1]) & 0x3F);
      if (cp < 0x80) return std::nullopt;  // overlong
      i += 2;
    } else {
      return std::nullopt;  // three- and four-byte characters are never in the alphabet
    }
    if (cp > kMaxCodePoint || t.byte_of[cp] < 0) return std::nullopt;
    out.push_back(static_cast<char>(t.byte_of[cp]));
  }
  return out;
}

}  // namespace llmk::byte_level
