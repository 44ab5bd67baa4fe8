// Chat templates without a Jinja engine: the model's template string (tokenizer.chat_template)
// is recognised as one of a few known families, and the family's formatter writes the prompt
// exactly as the Jinja template would render it.
//
// Families (a table in chat_template.cpp; the first that matches is used):
//   chatml  templates that contain "<|im_start|>":
//             <|im_start|>{role}\n{content}<|im_end|>\n ... [<|im_start|>assistant\n]
//           When the template holds a literal "<|im_start|>system\n{text}<|im_end|>\n" (as
//           SmolLM2's does, for conversations that do not start with a system message), that
//           system message is written first whenever messages[0] is not a system message.
//   gemma   templates that contain "<start_of_turn>" (Gemma 3):
//             <bos><start_of_turn>user\n{system}\n\n{content}<end_of_turn>\n
//             <start_of_turn>model\n{content}<end_of_turn>\n ... [<start_of_turn>model\n]
//           The system message (messages[0] only) opens the first turn; contents are trimmed
//           (Jinja's `trim`); roles must alternate user / non-user. The text starts with "<bos>":
//           Tokenizer::encode with add_bos does not add a second one.
//   llama3  templates that contain "<|start_header_id|>" (Llama 3.x):
//             <|begin_of_text|><|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>
//             ... [<|start_header_id|>assistant<|end_header_id|>\n\n]
//           Contents trimmed. Templates with "Cutting Knowledge Date" (3.1 and later) always open
//           with a system turn holding that date line, "Today Date: {date}" and the system
//           message; the date is the template's literal date_string, or today where it calls
//           strftime_now.
//   phi3    templates that contain "<|user|>" and "<|end|>" (Phi-3, Phi-3.5):
//             <|{role}|>\n{content}<|end|>\n ... then <|assistant|>\n or <|endoftext|>
#pragma once

#include <span>
#include <string>
#include <string_view>

namespace llmk {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", ...
  std::string content;
};

class ChatTemplate {
 public:
  // Recognises the family of `jinja` (a tokenizer.chat_template value); throws llmk::Error
  // naming the supported families when none matches.
  static ChatTemplate from_jinja(std::string_view jinja);
  // The family by name ("chatml", "gemma", "llama3", "phi3"), for models whose file carries no
  // template.
  static ChatTemplate for_family(std::string_view name);

  // The prompt for `messages`; add_generation_prompt appends the opening of an assistant turn.
  std::string apply(std::span<const ChatMessage> messages, bool add_generation_prompt) const;

  std::string_view family() const;
  // The system message written when the conversation has none (empty: none is written).
  const std::string& default_system() const { return settings_.default_system; }
  // The date a Llama 3.1+ prompt carries ("21 Nov 2026"); tests fix it.
  const std::string& date() const { return settings_.date; }
  void set_date(std::string date) { settings_.date = std::move(date); }

  // What a family reads from its template string.
  struct Settings {
    std::string default_system;  // chatml
    bool system_block = false;   // llama3 (3.1+)
    std::string date;            // llama3 (3.1+)
  };
  struct Family;

 private:
  const Family* family_ = nullptr;
  Settings settings_;
};

}  // namespace llmk
