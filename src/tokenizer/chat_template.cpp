#include "tokenizer/chat_template.h"

#include <fmt/format.h>

#include <ctime>
#include <optional>

#include "core/error.h"
#include "core/text.h"
#include "tokenizer/utf8.h"

namespace llmk {

struct ChatTemplate::Family {
  std::string_view name;
  std::string_view recognised_by;  // for the error message
  bool (*matches)(std::string_view jinja);
  // What the family's renderer takes from the template string itself.
  void (*read)(std::string_view jinja, ChatTemplate::Settings& s);
  void (*render)(const ChatTemplate::Settings& s, std::span<const ChatMessage> messages,
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
// system message (SmolLM2 and Qwen2.5 write one when messages[0] is not a system message).
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

void chatml_read(std::string_view jinja, ChatTemplate::Settings& s) {
  s.default_system = chatml_default_system(jinja);
}

void chatml_render(const ChatTemplate::Settings& s, std::span<const ChatMessage> messages,
                   bool add_generation_prompt, std::string& out) {
  const std::string& default_system = s.default_system;
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

void read_nothing(std::string_view, ChatTemplate::Settings&) {}

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
void gemma_render(const ChatTemplate::Settings&, std::span<const ChatMessage> messages,
                  bool add_generation_prompt, std::string& out) {
  out += "<bos>";
  const bool has_system = !messages.empty() && messages[0].role == "system";
  const std::string_view system = has_system ? std::string_view(messages[0].content) : "";
  if (has_system) messages = messages.subspan(1);
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    // The role is not quoted: it is the caller's text, and the message must stay one line.
    LLMK_CHECK((m.role == "user") == (i % 2 == 0),
               "gemma chat template: conversation roles must alternate user/assistant/user/... "
               "(message {} {} a user message)",
               i + (has_system ? 1 : 0), i % 2 == 0 ? "is not" : "is");
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

// ---- llama3 ----

constexpr std::string_view kStartHeader = "<|start_header_id|>";
constexpr std::string_view kKnowledgeDate = "Cutting Knowledge Date: December 2023\n";

bool llama3_matches(std::string_view jinja) { return jinja.find(kStartHeader) != jinja.npos; }

// Today's date as Python's strftime("%d %b %Y") writes it in the C locale: "05 Mar 2026".
std::string today_string() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[32];
  const size_t n = std::strftime(buf, sizeof buf, "%d %b %Y", &tm);
  return std::string(buf, n);
}

// Llama 3.1 and later write a system turn with a knowledge date and "Today Date: {date_string}"
// into every prompt; date_string is the template's literal default, or today's date where the
// template asks for strftime_now (3.2, 3.3; transformers defines it). Llama 3.0 has neither.
void llama3_read(std::string_view jinja, ChatTemplate::Settings& s) {
  s.system_block = jinja.find("Cutting Knowledge Date") != jinja.npos;
  if (!s.system_block) return;
  if (jinja.find("strftime_now") != jinja.npos) {
    s.date = today_string();
    return;
  }
  constexpr std::string_view kSet = "set date_string = ";
  const size_t at = jinja.find(kSet);
  std::optional<std::string> literal;
  if (at != jinja.npos && at + kSet.size() < jinja.size()) {
    const char q = jinja[at + kSet.size()];
    if (q == '"' || q == '\'') literal = read_string_literal(jinja, at + kSet.size());
  }
  s.date = literal.value_or("26 Jul 2024");  // the value Llama 3.1's template sets
}

// <|begin_of_text|>, then "<|start_header_id|>{role}<|end_header_id|>\n\n{content | trim}
// <|eot_id|>" per message. 3.1+: the system message (trimmed) moves into the fixed system turn,
// which is written even when the conversation has none. 3.0: bos only before the first message.
void llama3_render(const ChatTemplate::Settings& s, std::span<const ChatMessage> messages,
                   bool add_generation_prompt, std::string& out) {
  const auto turn = [&](std::string_view role, std::string_view content) {
    out += kStartHeader;
    out += role;
    out += "<|end_header_id|>\n\n";
    out += content;
    out += "<|eot_id|>";
  };
  if (s.system_block) {
    out += "<|begin_of_text|>";
    std::string_view system;
    if (!messages.empty() && messages[0].role == "system") {
      system = python_strip(messages[0].content);
      messages = messages.subspan(1);
    }
    turn("system", fmt::format("{}Today Date: {}\n\n{}", kKnowledgeDate, s.date, system));
  } else if (!messages.empty()) {
    out += "<|begin_of_text|>";
  }
  for (const ChatMessage& m : messages) turn(m.role, python_strip(m.content));
  if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
}

// ---- phi3 ----

bool phi3_matches(std::string_view jinja) {
  return jinja.find("<|user|>") != jinja.npos && jinja.find("<|end|>") != jinja.npos;
}

// Phi-3 / Phi-3.5 instruct: "<|{role}|>\n{content}<|end|>\n" for system, user and assistant
// messages (others are left out), then "<|assistant|>\n", or the eos token <|endoftext|> when
// no generation prompt is asked for.
void phi3_render(const ChatTemplate::Settings&, std::span<const ChatMessage> messages,
                 bool add_generation_prompt, std::string& out) {
  for (const ChatMessage& m : messages) {
    if (m.role != "system" && m.role != "user" && m.role != "assistant") continue;
    out += "<|";
    out += m.role;
    out += "|>\n";
    out += m.content;
    out += "<|end|>\n";
  }
  out += add_generation_prompt ? "<|assistant|>\n" : "<|endoftext|>";
}

// ---- the table: the first family whose `matches` accepts the template is used ----

constexpr ChatTemplate::Family kFamilies[] = {
    {"chatml", "contains '<|im_start|>'", chatml_matches, chatml_read, chatml_render},
    {"gemma", "contains '<start_of_turn>'", gemma_matches, read_nothing, gemma_render},
    {"llama3", "contains '<|start_header_id|>'", llama3_matches, llama3_read, llama3_render},
    {"phi3", "contains '<|user|>' and '<|end|>'", phi3_matches, read_nothing, phi3_render},
};

}  // namespace

ChatTemplate ChatTemplate::for_family(std::string_view name) {
  for (const Family& f : kFamilies) {
    if (f.name != name) continue;
    ChatTemplate t;
    t.family_ = &f;
    // No template string: the settings of the family's current models.
    if (f.name == "llama3") {
      t.settings_.system_block = true;
      t.settings_.date = today_string();
    }
    return t;
  }
  LLMK_FAIL("unknown chat template family '{}'", printable(name));
}

ChatTemplate ChatTemplate::from_jinja(std::string_view jinja) {
  for (const Family& f : kFamilies) {
    if (!f.matches(jinja)) continue;
    ChatTemplate t;
    t.family_ = &f;
    f.read(jinja, t.settings_);
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
  family_->render(settings_, messages, add_generation_prompt, out);
  return out;
}

std::string_view ChatTemplate::family() const { return family_ ? family_->name : ""; }

}  // namespace llmk
