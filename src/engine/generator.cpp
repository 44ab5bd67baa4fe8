#include "engine/generator.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace llmk {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}
}  // namespace

double GenerateStats::generate_tps() const {
  // The first generated token comes from the prefill; the rest each take one decode step.
  return generated_tokens > 1 && generate_seconds > 0 ? (generated_tokens - 1) / generate_seconds
                                                      : 0;
}

GenerateStats generate(Model& model, const Tokenizer& tok, const std::vector<int32_t>& prompt,
                       const GenerateOptions& opts, const TokenCallback& on_token) {
  LLMK_CHECK(!prompt.empty(), "the prompt is empty (no tokens to start from)");
  LLMK_CHECK(opts.max_tokens >= 0, "the token limit {} must be >= 0", opts.max_tokens);
  const auto n_prompt = static_cast<int64_t>(prompt.size());
  LLMK_CHECK(n_prompt < model.context(),
             "the prompt has {} tokens but the context holds {} (raise --ctx, at most {})",
             n_prompt, model.context(), model.config().context_length);
  const std::vector<int32_t> eog = tok.end_of_generation_ids();
  Sampler sampler(opts.sampler);
  std::vector<int32_t> history = prompt;
  GenerateStats st;
  st.prompt_tokens = n_prompt;
  st.stop_reason = "length";
  if (opts.max_tokens == 0) return st;

  auto t0 = Clock::now();
  Tensor logits = model.forward(prompt, 0, /*all_logits=*/false);
  st.prompt_seconds = seconds_since(t0);
  auto t1 = Clock::now();
  int64_t pos = n_prompt;
  for (;;) {
    const auto vocab = static_cast<size_t>(logits.dim(-1));
    const int32_t id = sampler.sample({logits.data<float>(), vocab}, history);
    history.push_back(id);
    ++st.generated_tokens;
    if (opts.stop_at_eog && std::find(eog.begin(), eog.end(), id) != eog.end()) {
      st.stop_reason = "eog";
      break;
    }
    if (!on_token(id, tok.token_bytes(id))) {
      st.stop_reason = "callback";
      break;
    }
    if (st.generated_tokens >= opts.max_tokens) break;
    if (pos + 1 > model.context()) {
      st.stop_reason = "context";
      break;
    }
    logits = model.forward({&id, 1}, pos, false);
    ++pos;
  }
  st.generate_seconds = seconds_since(t1);
  return st;
}

namespace {
// Length of the UTF-8 sequence a lead byte starts, or 0 for a byte that cannot lead one.
size_t utf8_length(unsigned char c) {
  if (c < 0x80) return 1;
  if ((c >> 5) == 0x6) return 2;
  if ((c >> 4) == 0xe) return 3;
  if ((c >> 3) == 0x1e) return 4;
  return 0;
}
}  // namespace

std::string Utf8Stream::push(const std::string& bytes) {
  pending_ += bytes;
  // Find the start of the last (possibly incomplete) character.
  size_t i = pending_.size();
  size_t back = 0;
  while (i > 0 && back < 4) {
    --i;
    ++back;
    const auto c = static_cast<unsigned char>(pending_[i]);
    if ((c & 0xc0) != 0x80) {
      const size_t len = utf8_length(c);
      if (len > back) {  // incomplete: hold it back
        std::string ready = pending_.substr(0, i);
        pending_.erase(0, i);
        return ready;
      }
      break;
    }
  }
  std::string ready;
  ready.swap(pending_);
  return ready;
}

std::string Utf8Stream::flush() {
  std::string rest;
  rest.swap(pending_);
  return rest;
}

}  // namespace llmk
