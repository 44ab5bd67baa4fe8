// Chat template families on hand-written templates, and on the families' real templates as
// Jinja2 renders them (tests/fixtures/tokenizer/chat_templates.json, written by
// tests/fixtures/tokenizer/make_chat_templates.py).
// SmolLM2's own template is checked against transformers in smollm2_test.cpp.
#include "tokenizer/chat_template.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "tokenizer_test_util.h"

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

// Every family's real template: recognised, and rendered exactly as Jinja2 renders it (or
// refused where the template raises, as Gemma's does for roles that do not alternate).
TEST(ChatTemplate, RealTemplatesRenderAsJinjaDoes) {
  const nlohmann::json fixture = test::load_fixture("chat_templates.json");
  size_t checked = 0;
  for (const nlohmann::json& t : fixture["templates"]) {
    const std::string name = t["name"].get<std::string>();
    ChatTemplate tmpl = ChatTemplate::from_jinja(t["template"].get<std::string>());
    EXPECT_EQ(tmpl.family(), t["family"].get<std::string>()) << name;
    if (name == "llama-3.2-instruct") {
      EXPECT_FALSE(tmpl.date().empty());  // today's date; the fixture fixed one
      tmpl.set_date(fixture["today"].get<std::string>());
    }
    for (const nlohmann::json& c : t["cases"]) {
      std::vector<ChatMessage> messages;
      for (const nlohmann::json& m : c["messages"]) {
        messages.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
      }
      const bool agp = c["add_generation_prompt"].get<bool>();
      const std::string where = name + ": " + c["messages"].dump() + (agp ? " +gen" : "");
      if (c.contains("error")) {
        EXPECT_THROW(tmpl.apply(messages, agp), Error) << where;
      } else {
        EXPECT_EQ(tmpl.apply(messages, agp), c["text"].get<std::string>()) << where;
      }
      ++checked;
    }
  }
  EXPECT_GE(checked, 90u);
}

TEST(ChatTemplate, FamiliesByNameForModelsWithoutATemplate) {
  const std::vector<ChatMessage> m = {{"user", "hi"}};
  EXPECT_EQ(ChatTemplate::for_family("phi3").apply(m, true), "<|user|>\nhi<|end|>\n<|assistant|>\n");
  ChatTemplate llama = ChatTemplate::for_family("llama3");
  llama.set_date("01 Jan 2027");
  EXPECT_EQ(llama.apply(m, true),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge "
            "Date: December 2023\nToday Date: 01 Jan 2027\n\n<|eot_id|><|start_header_id|>user"
            "<|end_header_id|>\n\nhi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_THROW(ChatTemplate::for_family("mistral"), Error);
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

// Roles are the caller's text: the error names the message by its index and stays one line
// (tests/fixtures/bad/fuzz/chat_template-gemma-role-newline, found by fuzz/chat_template.cpp).
TEST(ChatTemplate, GemmaRoleErrorIsOneLine) {
  const std::vector<ChatMessage> m = {{"system", "s"}, {"\n\x1b[31mrole", "hi"}};
  try {
    ChatTemplate::for_family("gemma").apply(m, true);
    ADD_FAILURE() << "no error for a first role that is not user";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find_first_of("\n\x1b"), std::string::npos) << msg;
    EXPECT_NE(msg.find("message 1 is not a user message"), std::string::npos) << msg;
  }
}

// A family name from the caller is quoted escaped (tests/fixtures/bad/fuzz/
// chat_template-family-name-newline, found by fuzz/chat_template.cpp).
TEST(ChatTemplate, UnknownFamilyNameIsQuotedEscaped) {
  try {
    ChatTemplate::for_family("cha\ntml\x1b[2J");
    ADD_FAILURE() << "no error for an unknown family";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "unknown chat template family 'cha\\ntml\\x1b[2J'");
  }
}

}  // namespace
}  // namespace llmk
