// Chat template families on hand-written templates; SmolLM2's own template is checked against
// transformers in smollm2_test.cpp.
#include "tokenizer/chat_template.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"

namespace llmk {
namespace {

TEST(ChatTemplate, ChatmlWithoutDefaultSystem) {
  // Qwen-style minimal ChatML: no literal system turn.
  const ChatTemplate t = ChatTemplate::from_jinja(
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
      "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
      "{{ '<|im_start|>assistant\\n' }}{% endif %}");
  EXPECT_EQ(t.family(), "chatml");
  EXPECT_EQ(t.default_system(), "");
  const std::vector<ChatMessage> m = {{"user", "hi"}, {"assistant", "yo"}};
  EXPECT_EQ(t.apply(m, false),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n");
  EXPECT_EQ(t.apply(m, true),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(t.apply({}, true), "<|im_start|>assistant\n");
}

TEST(ChatTemplate, ChatmlDefaultSystemFromAnEscapedLiteral) {
  // The literal written with escapes ("\n" as backslash-n) and double quotes.
  const ChatTemplate t = ChatTemplate::from_jinja(
      "{% if messages[0]['role'] != 'system' %}{{ \"<|im_start|>system\\nBe "
      "\\\"brief\\\".<|im_end|>\\n\" }}"
      "{% endif %}{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
      "message['content'] + '<|im_end|>\\n'}}{% endfor %}");
  EXPECT_EQ(t.default_system(), "Be \"brief\".");
  EXPECT_EQ(t.apply(std::vector<ChatMessage>{{"user", "x"}}, false),
            "<|im_start|>system\nBe \"brief\".<|im_end|>\n<|im_start|>user\nx<|im_end|>\n");
  // A conversation that brings its own system message gets no default.
  EXPECT_EQ(t.apply(std::vector<ChatMessage>{{"system", "S"}, {"user", "x"}}, false),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nx<|im_end|>\n");
}

TEST(ChatTemplate, UnknownFamilyThrowsNamingTheSupportedOnes) {
  for (const char* jinja : {"{{ bos_token }}{% for m in messages %}[INST] {{ m['content'] }} "
                            "[/INST]{% endfor %}",
                            ""}) {
    try {
      ChatTemplate::from_jinja(jinja);
      ADD_FAILURE() << "no error for " << jinja;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("chatml"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace llmk
