// The many-sequence engine: requests in, tokens out, any number of sequences in flight.
//
//   request -> Scheduler (queue, running set, preemption; KvPages for the pool's pages)
//           -> a step: each sequence's next run of tokens (prompt chunks and decode tokens
//              together) -> Model::stage_runs + compute (one forward for all of them)
//           -> per sequence: its Sampler on its logits -> the token -> its callback
//           -> Scheduler::update (finished sequences free their pages)
//
// The model must be loaded for it (Engine::load: several sequences' worth of pool, pages of
// kv page size tokens), on the CPU or CUDA. Sampling is the CPU sampler of engine/sampler.h, one
// per request, seeded per request, so a request's tokens do not depend on what else runs beside
// it on the CPU (on CUDA a row's logits depend on the batch's shape through the GEMM's tiling
// and the attention kernel chosen, in the last bits); on CUDA each step copies the wanted rows
// of logits to the host for it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/tensor.h"
#include "engine/kv_pages.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "engine/step_graph.h"

namespace llmk {

class Model;

struct RequestOptions {
  SamplerConfig sampler;
  int64_t max_tokens = 128;       // tokens to generate at most, per sample
  std::vector<int32_t> stop_ids;  // tokens that end a sample (end-of-generation ids)
  int n = 1;  // samples of the prompt, sharing its pages; sample i draws with seed sampler.seed + i
  bool logprobs = false;  // with each token, its log-probability (TokenEvent::logprob)
  int top_logprobs = 0;   // and this many of the most likely tokens (at most 20; needs logprobs)
};

enum class Finish { None, Stop, Length };

// One sampled token of sample `sample` (0 .. n - 1) of `request`; finish: None while that sample
// goes on, else why it ended (Stop: the token is one of its stop ids; Length: max_tokens or the
// context reached). A request is done when each of its samples has ended. The callback returns
// false to end that sample there (a stop string found in its text): no more tokens for it.
struct TokenEvent {
  int64_t request;
  int sample;
  int32_t token;
  Finish finish;
  // With RequestOptions::logprobs: the model's log-probability of `token` (its raw distribution:
  // before temperature, penalties and truncation), and the top_logprobs most likely tokens with
  // theirs, most likely first. Neither is computed otherwise (each costs a pass over the row).
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;
};
using TokenFn = std::function<bool(const TokenEvent&)>;

struct EngineOptions {
  int64_t max_running = 64;       // sequences in flight
  int64_t max_step_tokens = 512;  // tokens per forward (decode tokens plus prompt chunks)
  // On CUDA, a step of one token per sequence replays a CUDA graph captured for its batch size
  // (1, 2, 4, ... max_running: the step is padded to the next), once the model has a scratch
  // page for the padding (Engine::load gives it one).
  bool cuda_graphs = true;
};

class Engine {
 public:
  // model: loaded with a paged pool (kv_pages() > 0).
  Engine(Model& model, const EngineOptions& opts);
  // Loads `path` for the engine on `device`: a KV pool in pages of `page_size` tokens, of
  // `sequences` context-long sequences' worth, or of kv_memory bytes (LoadOptions::kv_memory:
  // LoadOptions::kKvMemoryFree sizes it from the GPU's free memory).
  // kv_type: the cache's element type (LoadOptions::kv_type); dtype: the activations'
  // (LoadOptions::dtype); batch_invariant: LoadOptions::batch_invariant.
  static std::unique_ptr<Model> load(const std::string& path, int64_t context, int64_t sequences,
                                     int64_t page_size = 16, Device device = Device::CPU,
                                     int64_t kv_memory = 0, KvType kv_type = KvType::Auto,
                                     std::optional<DType> dtype = std::nullopt,
                                     bool batch_invariant = false, bool quantized_weights = true,
                                     bool host_embeddings = true);

  // Queues a prompt; returns its id. The prompt (non-empty, ids inside the vocabulary, at most
  // the context) and the options (1 <= n <= max_running) are checked here.
  int64_t add_request(std::vector<int32_t> prompt, const RequestOptions& opts, TokenFn on_token);
  // Ends a request (all its samples) now, with no more callbacks, freeing its pages; false if
  // unknown or done.
  bool abort(int64_t request);
  // One forward of every running sequence's next run; calls the callbacks of those sampled.
  void step();
  bool idle() const { return sched_.idle(); }
  // Steps replayed from a CUDA graph, and graphs captured (EngineOptions::cuda_graphs).
  int64_t graph_steps() const { return graphs_ ? graphs_->replayed() : 0; }
  int64_t graphs_captured() const { return graphs_ ? graphs_->captured() : 0; }
  Scheduler::Stats scheduler_stats() const { return sched_.stats(); }
  KvPages::Stats kv_stats() const { return kv_.stats(); }

 private:
  struct Request {
    RequestOptions opts;
    TokenFn on_token;
    int64_t prompt_tokens = 0;
    std::vector<int64_t> seqs;  // its samples' sequences still running
    bool forked = false;        // samples 1 .. n-1 exist (from the prompt's first draw on)
  };
  struct Sample {  // a scheduler sequence: one sample of a request
    int64_t request;
    int index;
    Sampler sampler;
  };
  // Forgets the sample of sequence `seq` (finished or ended), and its request with its last one.
  void forget_sample(int64_t seq);
  // Why a sample ends with `token` after `known` tokens (None: it goes on).
  Finish finish_of(const Request& r, int32_t token, int64_t known) const;
  // Whether a request's row has its penalties applied on the device (ops::apply_penalties) before
  // it is read: some penalty, no logprobs (they are of the logits as computed), no samples left
  // to draw from its first row.
  static bool device_penalties(const Request& r);
  // Whether a request's next token is the argmax of its logits: temperature 0, no penalties (or
  // penalized: applied already), no logprobs, and no samples left to draw from its first row.
  static bool plain_greedy(const Request& r, bool penalized);
  // Whether it is a draw at the temperature above min-p alone (ops::sample_gumbel): no top-k
  // below the vocabulary, top-p 1, no penalties (or penalized), no logprobs, no samples left to
  // draw.
  static bool plain_sampled(const Request& r, int64_t vocab, bool penalized);
  // How the host reads each row of a step's logits (read_rows): whole, its device argmax, its
  // device Gumbel draw, or its top_k_ largest logits and log-sum-exp.
  enum class Read : uint8_t { Whole, Argmax, Gumbel, Top };
  // Classifies the step's rows and brings what the sampler needs of each to the host buffers.
  void read_rows(const Scheduler::Step& st, const Tensor& logits);

  // The rows a decode-only step of b sequences is padded to (a power of two, at most
  // max_running).
  int64_t bucket(int64_t b) const;

  Model& model_;
  KvPages kv_;
  Scheduler sched_;
  EngineOptions opts_;
  std::unordered_map<int64_t, Request> requests_;
  std::unordered_map<int64_t, Sample> samples_;  // by sequence id
  int64_t next_request_ = 0, next_seq_ = 0;
  std::vector<float> host_logits_;
  std::vector<int32_t> host_argmax_, host_top_ids_;
  std::vector<float> host_top_values_, host_lse_;
  std::vector<int32_t> host_drawn_;
  std::vector<Read> read_;
  std::vector<uint8_t> penalized_;  // per row of a step: penalties applied on the device
  std::vector<uint8_t> nucleus_;    // per row of a step: top-p alone, from the candidates
  std::vector<float> lse_scale_;    // per row of a step: ops::topk_lse's lse_scale
  std::vector<float> row_;          // a row read after all (the nucleus past the candidates)
  std::vector<PenaltyEntry> entries_;
  std::vector<int32_t> penalty_at_;  // ops::apply_penalties's places and factors, per step
  std::vector<float> penalty_by_;
  int64_t top_k_ = 0;
  std::vector<float> gumbel_temperature_, gumbel_min_p_;  // per row of a step, for sample_gumbel
  std::vector<int64_t> gumbel_seed_;
  std::vector<int64_t> aborted_;  // requests aborted by the callbacks of the step running them
  std::unique_ptr<StepGraphs> graphs_;  // null: every step eager
  int64_t graph_width_ = 0;             // the padded steps' page-table width: a context's pages
};

}  // namespace llmk
