// Chat-template rendering: the input is NUL-separated fields, the template first, then role and
// content pairs. A template field starting with '@' names a family instead ("@chatml"). Both
// the template string and the messages are fuzzed; a template that is recognised must render
// every conversation or fail with llmk::Error.
#include "tokenizer/chat_template.h"

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "fuzz_util.h"

namespace {

std::vector<std::string_view> split_fields(std::string_view input) {
  std::vector<std::string_view> fields;
  for (size_t at = 0;;) {
    const size_t end = input.find('\0', at);
    fields.push_back(input.substr(at, end == std::string_view::npos ? end : end - at));
    if (end == std::string_view::npos) return fields;
    at = end + 1;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<std::string_view> fields =
      split_fields(std::string_view(reinterpret_cast<const char*>(data), size));
  std::vector<llmk::ChatMessage> messages;
  for (size_t i = 1; i + 1 < fields.size(); i += 2) {
    messages.push_back({std::string(fields[i]), std::string(fields[i + 1])});
  }
  llmk::fuzz::expect_llmk_errors([&] {
    const std::string_view source = fields[0];
    llmk::ChatTemplate t = source.starts_with('@')
                               ? llmk::ChatTemplate::for_family(source.substr(1))
                               : llmk::ChatTemplate::from_jinja(source);
    t.set_date("21 Nov 2026");  // strftime_now would make a run depend on the day
    (void)t.family();
    (void)t.apply(messages, false);
    (void)t.apply(messages, true);
  });
  return 0;
}
