// Text generation: one batched prefill of the prompt, then a decode loop that samples one token
// at a time, streams it, and stops at an end-of-generation token or the token limit.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/sampler.h"

namespace llmk {

class Model;
class Tokenizer;

struct GenerateOptions {
  int max_tokens = 128;     // tokens to generate at most
  SamplerConfig sampler;
  bool stop_at_eog = true;  // stop at the tokenizer's end-of-generation tokens
};

struct GenerateStats {
  int64_t prompt_tokens = 0;
  double prompt_seconds = 0;
  int64_t generated_tokens = 0;
  double generate_seconds = 0;  // decode steps, from the first sampled token on
  std::string stop_reason;      // "eog", "length", "context", "callback"
  double prompt_tps() const { return prompt_seconds > 0 ? prompt_tokens / prompt_seconds : 0; }
  double generate_tps() const;
};

// Called with each new token and its bytes; returning false stops generation.
using TokenCallback = std::function<bool(int32_t id, const std::string& bytes)>;

// Runs `prompt` (token ids) from position 0 of the model's cache and generates.
GenerateStats generate(Model& model, const Tokenizer& tok, const std::vector<int32_t>& prompt,
                       const GenerateOptions& opts, const TokenCallback& on_token);

// Splits a byte stream into pieces that end on UTF-8 character boundaries, so a terminal
// never receives half a character. Bytes that can never form a valid character pass through.
class Utf8Stream {
 public:
  std::string push(const std::string& bytes);
  std::string flush();

 private:
  std::string pending_;
};

}  // namespace llmk
