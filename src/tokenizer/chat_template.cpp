#include "tokenizer/chat_template.h"

#include <optional>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace llmk {

struct ChatTemplate::Family {
  std::string_view name;
  std::string_view recognised_by;  // for the error message
  bool (*matches)(std::string_view jinja);
  // The system message the template writes for conversations that have none ("" if none).
  std::string (*default_system)(std::string_view jinja);
  void (*render)(std::string_view default_system, std::span<const ChatMessage> messages,
                 bool add_generation_prompt, std::string& out);
};

namespace {

// The value of the Jinja string literal whose opening quote is at jinja[quote], or nullopt
// when it is unterminated.
std::optional<std::string> read_string_literal(std::string_view jinja, size_t quote) {
  const char q = jinja[quote];
  std::string value;
  for (size_t i = quote + 1; i < jinja.size(); ++i) {
    const char c = jinja[i];
    if (c == q) return value;
    if (c == '\\' && i + 1 < jinja.size()) {
      const char e = jinja[++i];
      value += e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e;  // \\ \' \" as is
      continue;
    }
    value += c;
  }
  return std::nullopt;
}

// ---- chatml ----

constexpr std::string_view kImStart = "<|im_start|>";
constexpr std::string_view kImEnd = "<|im_end|>";

bool chatml_matches(std::string_view jinja) { return jinja.find(kImStart) != jinja.npos; }

// A string literal that is exactly "<|im_start|>system\n{text}<|im_end|>\n" gives the default
// system message (SmolLM2 writes one when messages[0] is not a system message).
std::string chatml_default_system(std::string_view jinja) {
  const std::string prefix = std::string(kImStart) + "system\n";
  const std::string suffix = std::string(kImEnd) + "\n";
  for (size_t at = jinja.find(kImStart); at != jinja.npos; at = jinja.find(kImStart, at + 1)) {
    if (at == 0 || (jinja[at - 1] != '\'' && jinja[at - 1] != '"')) continue;
    const std::optional<std::string> literal = read_string_literal(jinja, at - 1);
    if (!literal || literal->size() <= prefix.size() + suffix.size() ||
        !literal->starts_with(prefix) || !literal->ends_with(suffix)) {
      continue;
    }
    std::string text =
        literal->substr(prefix.size(), literal->size() - prefix.size() - suffix.size());
    if (text.find(kImStart) == text.npos && text.find(kImEnd) == text.npos) return text;
  }
  return "";
}

void chatml_render(std::string_view default_system, std::span<const ChatMessage> messages,
                   bool add_generation_prompt, std::string& out) {
  const auto turn = [&](std::string_view role, std::string_view content) {
    out += kImStart;
    out += role;
    out += '\n';
    out += content;
    out += kImEnd;
    out += '\n';
  };
  if (!messages.empty() && messages[0].role != "system" && !default_system.empty()) {
    turn("system", default_system);
  }
  for (const ChatMessage& m : messages) turn(m.role, m.content);
  if (add_generation_prompt) {
    out += kImStart;
    out += "assistant\n";
  }
}

// ---- gemma ----

constexpr std::string_view kStartOfTurn = "<start_of_turn>";

bool gemma_matches(std::string_view jinja) { return jinja.find(kStartOfTurn) != jinja.npos; }

std::string no_default_system(std::string_view) { return ""; }

// The length in bytes of the character at text[pos] when it is whitespace as Python's
// str.strip() sees it (Jinja's `trim`), else 0.
size_t python_space_length(std::string_view text, size_t pos) {
  const size_t len = utf8::sequence_length(text, pos);
  if (len == 0) return 0;
  uint32_t cp = static_cast<uint8_t>(text[pos]);
  if (len > 1) {
    cp &= 0x7Fu >> len;
    for (size_t i = 1; i < len; ++i) cp = (cp << 6) | (static_cast<uint8_t>(text[pos + i]) & 0x3F);
  }
  const bool space = (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 ||
                     cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
                     cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
  return space ? len : 0;
}

std::string_view python_strip(std::string_view text) {
  while (!text.empty()) {
    const size_t len = python_space_length(text, 0);
    if (len == 0) break;
    text.remove_prefix(len);
  }
  while (!text.empty()) {
    size_t start = text.size() - 1;  // back up to the lead byte of the last character
    while (start > 0 && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) --start;
    if (python_space_length(text, start) != text.size() - start) break;
    text.remove_suffix(text.size() - start);
  }
  return text;
}

// Gemma 3's template: "<bos>", then turns "<start_of_turn>{role}\n{content | trim}<end_of_turn>\n"
// with "assistant" written as "model". A leading system message is not a turn: its content
// (untrimmed) and "\n\n" open the first turn. The remaining messages must alternate user, non-user,
// user, ... (the template raises an exception otherwise).
void gemma_render(std::string_view, std::span<const ChatMessage> messages,
                  bool add_generation_prompt, std::string& out) {
  out += "<bos>";
  const bool has_system = !messages.empty() && messages[0].role == "system";
  const std::string_view system = has_system ? std::string_view(messages[0].content) : "";
  if (has_system) messages = messages.subspan(1);
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    LLMK_CHECK((m.role == "user") == (i % 2 == 0),
               "gemma chat template: conversation roles must alternate user/assistant/user/... "
               "(message {} is '{}')",
               i, m.role);
    out += kStartOfTurn;
    out += m.role == "assistant" ? "model" : m.role;
    out += '\n';
    if (i == 0 && has_system) {
      out += system;
      out += "\n\n";
    }
    out += python_strip(m.content);
    out += "<end_of_turn>\n";
  }
  if (add_generation_prompt) {
    out += kStartOfTurn;
    out += "model\n";
  }
}

// ---- the table: the first family whose `matches` accepts the template is used ----

constexpr ChatTemplate::Family kFamilies[] = {
    {"chatml", "contains '<|im_start|>'", chatml_matches, chatml_default_system, chatml_render},
    {"gemma", "contains '<start_of_turn>'", gemma_matches, no_default_system, gemma_render},
};

}  // namespace

ChatTemplate ChatTemplate::for_family(std::string_view name) {
  for (const Family& f : kFamilies) {
    if (f.name != name) continue;
    ChatTemplate t;
    t.family_ = &f;
    return t;
  }
  LLMK_FAIL("unknown chat template family '{}'", name);
}

ChatTemplate ChatTemplate::from_jinja(std::string_view jinja) {
  for (const Family& f : kFamilies) {
    if (!f.matches(jinja)) continue;
    ChatTemplate t;
    t.family_ = &f;
    t.default_system_ = f.default_system(jinja);
    return t;
  }
  std::string supported;
  for (const Family& f : kFamilies) {
    supported +=
        fmt::format("{}{} (template {})", supported.empty() ? "" : ", ", f.name, f.recognised_by);
  }
  LLMK_FAIL("unsupported chat template{}: supported families are {}",
            jinja.empty() ? " (the model has none)" : "", supported);
}

std::string ChatTemplate::apply(std::span<const ChatMessage> messages,
                                bool add_generation_prompt) const {
  LLMK_CHECK(family_ != nullptr, "ChatTemplate::apply on an empty template");
  std::string out;
  family_->render(default_system_, messages, add_generation_prompt, out);
  return out;
}

std::string_view ChatTemplate::family() const { return family_ ? family_->name : ""; }

}  // namespace llmk
