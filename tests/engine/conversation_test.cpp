// Reusing the KV cache of an earlier turn: generating after a prompt whose first tokens are
// already cached must give exactly what a fresh model gives for the whole prompt.
#include <gtest/gtest.h>

#include "engine/generator.h"
#include "model/model.h"
#include "test_paths.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace llmk {
namespace {

std::vector<int32_t> run(Model& m, const Tokenizer& tok, const std::vector<int32_t>& prompt,
                         int64_t cached, GenerateStats* stats = nullptr) {
  GenerateOptions opts;
  opts.max_tokens = 12;
  opts.sampler.temperature = 0;
  std::vector<int32_t> out;
  const GenerateStats st = generate(
      m, tok, prompt, opts,
      [&](int32_t id, const std::string&) {
        out.push_back(id);
        return true;
      },
      cached);
  if (stats) *stats = st;
  return out;
}

TEST(Conversation, SecondTurnOnTheCachedFirstEqualsAFreshRun) {
  auto model = Model::load(test::smollm2_path(), {.context = 256});
  const Tokenizer tok = Tokenizer::from_gguf(*model->gguf());
  const ChatTemplate tmpl = ChatTemplate::from_jinja(tok.chat_template());
  std::vector<ChatMessage> msgs = {{"user", "What is the capital of France?"}};
  const std::vector<int32_t> p1 = tok.encode(tmpl.apply(msgs, true), tok.add_bos(), true);
  GenerateStats st1;
  const std::vector<int32_t> reply = run(*model, tok, p1, 0, &st1);
  ASSERT_FALSE(reply.empty());
  // The cache now holds p1 and every sampled token but the last.
  std::vector<int32_t> in_cache = p1;
  in_cache.insert(in_cache.end(), st1.sampled.begin(), st1.sampled.end() - 1);

  msgs.push_back({"assistant", tok.decode(reply)});
  msgs.push_back({"user", "And of Italy?"});
  const std::vector<int32_t> p2 = tok.encode(tmpl.apply(msgs, true), tok.add_bos(), true);
  size_t common = 0;
  while (common < in_cache.size() && common < p2.size() && in_cache[common] == p2[common]) ++common;
  ASSERT_GT(common, p1.size()) << "the second prompt should share the first turn";
  ASSERT_LT(common, p2.size());
  GenerateStats st2;
  const std::vector<int32_t> reused = run(*model, tok, p2, static_cast<int64_t>(common), &st2);
  EXPECT_EQ(st2.prompt_tokens, static_cast<int64_t>(p2.size() - common));

  auto fresh_model = Model::load(test::smollm2_path(), {.context = 256});
  EXPECT_EQ(reused, run(*fresh_model, tok, p2, 0));
  EXPECT_FALSE(reused.empty());
}

}  // namespace
}  // namespace llmk
