// The sampler chain: repetition, presence and frequency penalties -> top-k -> temperature -> top-p
// -> min-p -> draw. temperature <= 0 means greedy (argmax after the penalty). The same seed and
// inputs give the same choices on every machine: the random draw uses its own 64-bit generator and
// arithmetic.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace llmk {

struct SamplerConfig {
  float temperature = 0.8f;
  int top_k = 40;               // 0 = off
  float top_p = 0.95f;          // 1 = off
  float min_p = 0.05f;          // 0 = off; drops tokens below min_p * p(most likely)
  float repeat_penalty = 1.0f;  // 1 = off; > 1 discourages tokens seen in the last window
  int repeat_last_n = 64;       // the window for the penalty
  // OpenAI's penalties over the generated tokens (history from `generated_from` on): each
  // token's logit minus presence_penalty if it occurs, minus frequency_penalty times its count.
  // (The engine passes where a request's prompt ends; generate() passes 0: its whole history.)
  float presence_penalty = 0.0f;   // in [-2, 2]; 0 = off
  float frequency_penalty = 0.0f;  // in [-2, 2]; 0 = off
  uint64_t seed = 0;

  // Throws llmk::Error naming the first out-of-range setting.
  void validate() const;
  // Whether some penalty moves a logit (one that is on and has a window).
  bool penalties() const {
    return (repeat_penalty != 1.0f && repeat_last_n > 0) || presence_penalty != 0.0f ||
           frequency_penalty != 0.0f;
  }
};

// One token's penalty in a row (kernels/penalty.h): the repetition factor (1: none) and the
// amount subtracted.
struct PenaltyEntry {
  int32_t id;
  float rp, sub;
};

class Sampler {
 public:
  explicit Sampler(const SamplerConfig& cfg);

  // The penalties config c puts on a row of `vocab` logits given the history (as sample()
  // takes it), one entry per token they move, by ascending id, into out (cleared first).
  static void penalty_entries(const SamplerConfig& c, std::span<const int32_t> history,
                              size_t generated_from, int32_t vocab, std::vector<PenaltyEntry>& out);

  // logits: [vocab]; history: tokens so far (prompt and generated), for the penalties; the
  // generated ones start at generated_from (presence and frequency penalties count only those).
  // An empty history: no penalty moves a logit (a row whose penalties were applied already).
  int32_t sample(std::span<const float> logits, std::span<const int32_t> history,
                 size_t generated_from = 0);

  // How many of a row's largest logits sample() reads with config c: top_k where sampling cuts
  // to the top k <= max and no penalty moves a logit, or penalized (the row's penalties were
  // applied already), (then sample_top gives what sample gives), else 0 (the whole row).
  static int top_candidates(const SamplerConfig& c, int max, bool penalized = false);
  // sample() from the row's largest logits only: values descending, equal values by ascending id
  // (ops::topk_lse's order), at least top_candidates() of them; the same token and the same
  // random draws as sample() on the whole row (penalized: its penalties applied already).
  int32_t sample_top(std::span<const float> values, std::span<const int32_t> ids,
                     bool penalized = false);
  // Whether sample_nucleus may serve config c: top-p below 1 at a temperature, no top-k cut, no
  // penalty left to apply (penalized: applied already).
  static bool nucleus(const SamplerConfig& c, int64_t vocab, bool penalized = false);
  // sample() for nucleus() configs from the row's largest logits (values descending, equal values
  // by ascending id: ops::topk_lse's order) and lse_t, the log-sum-exp of the whole row times
  // 1 / temperature (ops::topk_lse's lse_scale, 1.0f / temperature): -1, drawing nothing, where
  // the candidates hold less than top_p of the row's mass (the whole row is needed); else the
  // token sample() draws from the whole row, up to the rounding of lse_t, with the same random
  // draw.
  int32_t sample_nucleus(std::span<const float> values, std::span<const int32_t> ids, float lse_t);

 private:
  double next_uniform();  // in [0, 1)
  int32_t draw();         // from cand_: the kept candidates, sorted
  // From cand_ with probabilities p_ (descending, summing to at most 1): top-p's prefix, min-p's
  // floor, then one uniform draw.
  int32_t pick();

  SamplerConfig cfg_;
  uint64_t state_;
  std::vector<std::pair<float, int32_t>> cand_;  // reused: (logit or prob, id)
  std::vector<PenaltyEntry> entries_;            // reused
  std::vector<double> p_;                        // reused: cand_'s probabilities
};

}  // namespace llmk
