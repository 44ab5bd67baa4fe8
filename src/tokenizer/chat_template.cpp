#include "tokenizer/chat_template.h"

#include <optional>

#include "core/error.h"

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

// ---- the table: the first family whose `matches` accepts the template is used ----

constexpr ChatTemplate::Family kFamilies[] = {
    {"chatml", "contains '<|im_start|>'", chatml_matches, chatml_default_system, chatml_render},
};

}  // namespace

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
