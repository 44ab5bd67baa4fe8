// Text from a file, made safe to show: for error messages and anything printed to a terminal.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace llmk {

// How many bytes of a name or value from a file an error message quotes.
inline constexpr size_t kExcerptBytes = 120;

// `s` with control characters escaped (\n, \t, \r, other bytes below 0x20 and 0x7f as \xNN) and
// backslashes and both quote characters escaped, so a file cannot send terminal escape
// sequences or break the quoting of a message. At most `max_bytes` bytes of `s` are shown (cut
// at a UTF-8 character boundary); a longer `s` ends in "... (N bytes)".
std::string printable(std::string_view s, size_t max_bytes = kExcerptBytes);

}  // namespace llmk
