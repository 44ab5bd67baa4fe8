// Text generation: one batched prefill of the prompt, then a decode loop that samples one token
// at a time, streams it, and stops at an end-of-generation token or the token limit.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "engine/sampler.h"

namespace llmk {

class Model;
class Tokenizer;

struct GenerateOptions {
  int max_tokens = 128;  // tokens to generate at most
  SamplerConfig sampler;
  bool stop_at_eog = true;  // stop at the tokenizer's end-of-generation tokens
  bool cuda_graph = true;   // on CUDA, replay one captured decode step per token
};

struct GenerateStats {
  int64_t prompt_tokens = 0;
  double prompt_seconds = 0;
  int64_t generated_tokens = 0;
  double generate_seconds = 0;  // decode steps, from the first sampled token on
  std::string stop_reason;      // "eog", "length", "context", "callback"
  // Every sampled token, the last included (an end-of-generation token too). The KV cache then
  // holds the prompt and all of these but the last, which was never run through the model.
  std::vector<int32_t> sampled;
  double prompt_tps() const { return prompt_seconds > 0 ? prompt_tokens / prompt_seconds : 0; }
  double generate_tps() const;
};

// Called with each new token and its bytes; returning false stops generation.
using TokenCallback = std::function<bool(int32_t id, const std::string& bytes)>;

// Generates after `prompt` (token ids). The first `cached` of them are already in the model's
// KV cache at positions 0..cached-1 (an earlier turn of the same conversation); the rest run as
// one prefill from there. prompt_tokens in the stats counts only those.
GenerateStats generate(Model& model, const Tokenizer& tok, const std::vector<int32_t>& prompt,
                       const GenerateOptions& opts, const TokenCallback& on_token,
                       int64_t cached = 0);

// One token at a time through a model: prefill, then decode steps (graph-replayed on CUDA),
// with the choice of the next token made on the device when it is a plain argmax. Used by
// generate() and by `llmk bench`, which has no tokenizer.
class Decoder {
 public:
  // lookahead (greedy on CUDA with a graph): each step() also enqueues the step after it, fed
  // with this step's argmax on the device, before waiting for this one's token; the next call
  // with that token and the next position finds it running. The GPU then never waits for the
  // host between tokens. A different call waits for the guess and redoes the step; the guess
  // may have written the next position's K/V rows, which any later use of that position
  // rewrites before reading. last_logits() is not offered with it (the guess overwrites them).
  Decoder(Model& model, const SamplerConfig& sampler, bool cuda_graph, bool lookahead = false);
  ~Decoder();
  // Runs tokens of sequence `seq` from position `pos` and returns the next token.
  int32_t prefill(const std::vector<int32_t>& tokens, int64_t pos, int64_t seq = 0);
  // Runs one token at position `pos` and returns the next token.
  int32_t step(int32_t token, int64_t pos);
  // One batched step of sequences 0..B-1 (a model loaded with sequences >= B, each prefilled):
  // token b at position pos[b] of sequence b. Returns each sequence's next token by argmax.
  std::vector<int32_t> step_batch(const std::vector<int32_t>& tokens,
                                  const std::vector<int64_t>& pos);
  // Tokens already in the cache from earlier calls, for the repetition penalty's window.
  void add_history(std::span<const int32_t> tokens) {
    history_.insert(history_.end(), tokens.begin(), tokens.end());
  }
  // The logits the last prefill or step chose from ([1, vocab] f32, on the model's device).
  const Tensor& last_logits() const;
  // Whether step() enqueues the next greedy step ahead (asked for, greedy on the device, graphs).
  bool lookahead() const { return lookahead_; }

 private:
  int32_t choose(const Tensor& logits);

  Model& model_;
  Sampler sampler_;
  bool greedy_on_device_;
  bool use_graph_;
  std::vector<int32_t> history_;
  Tensor argmax_dev_, argmax_host_, logits_host_, last_logits_;
  struct GraphState;
  std::unique_ptr<GraphState> graph_;        // the single-sequence step
  std::unique_ptr<GraphState> batch_graph_;  // the batched step (for one batch size)
  bool lookahead_;
  // The step enqueued ahead (lookahead): its input token and position, and the token slot
  // (GraphState) its argmax goes to; valid while it may still be running.
  struct Ahead {
    int32_t token = -1;
    int64_t pos = -1;
    int slot = 0;
    bool valid = false;
  } ahead_;
  void enqueue_step(int slot);  // replay the captured step; its argmax to the host slot
  void drop_ahead();            // waits for a step enqueued ahead, if any, and forgets it
  int64_t batch_graph_size_ = 0;
  Tensor batch_ids_dev_, batch_ids_host_;
};

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
