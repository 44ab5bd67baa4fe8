#include "engine/generator.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "engine/step_graph.h"
#include "model/model.h"
#include "ops/ops.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

#ifdef LLMK_HAS_CUDA
#include <cuda_runtime.h>

#include "core/cuda/check.h"
#include "core/cuda/graph.h"
#include "core/cuda/stream.h"
#endif

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

struct Decoder::GraphState {
#ifdef LLMK_HAS_CUDA
  cuda::Graph graph;
  // Greedy steps: where each step's token lands on the host (pinned, so the copy is queued
  // without waiting), two slots (the step being read, the one enqueued ahead), and an event
  // each that says it landed.
  int32_t* tokens = nullptr;
  cudaEvent_t landed[2] = {nullptr, nullptr};
  GraphState() = default;
  GraphState(const GraphState&) = delete;
  GraphState& operator=(const GraphState&) = delete;
  ~GraphState() {
    for (cudaEvent_t e : landed) {
      if (e != nullptr) cudaEventDestroy(e);
    }
    if (tokens != nullptr) cudaFreeHost(tokens);
  }
  void make_slots() {
    if (tokens != nullptr) return;
    LLMK_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&tokens), 2 * sizeof(int32_t)));
    for (cudaEvent_t& e : landed) {
      LLMK_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
  }
#endif
  Tensor logits;  // the captured step's output (fixed address)
};

Decoder::Decoder(Model& model, const SamplerConfig& sampler, bool cuda_graph, bool lookahead)
    : model_(model),
      sampler_(sampler),
      greedy_on_device_(model.device() != Device::CPU && sampler.temperature <= 0 &&
                        sampler.repeat_penalty == 1.0f),
      use_graph_(cuda_graph && model.device() == Device::CUDA),
      graph_(std::make_unique<GraphState>()),
      lookahead_(lookahead && greedy_on_device_ && use_graph_) {
#ifndef LLMK_HAS_CUDA
  use_graph_ = false;
#endif
  if (greedy_on_device_) {
    argmax_dev_ = Tensor::empty({1}, DType::I32, model.device());
    argmax_host_ = Tensor::empty({1}, DType::I32);
  }
}

Decoder::~Decoder() {
#ifdef LLMK_HAS_CUDA
  // A step enqueued ahead reads this decoder's graph and writes its slots: let it finish.
  if (ahead_.valid) (void)cudaStreamSynchronize(cuda::current_stream());
#endif
}

const Tensor& Decoder::last_logits() const {
  LLMK_CHECK(!lookahead_,
             "Decoder::last_logits: not with lookahead (the step enqueued ahead overwrites them)");
  return last_logits_;
}

void Decoder::drop_ahead() {
#ifdef LLMK_HAS_CUDA
  if (ahead_.valid) cuda::synchronize();
#endif
  ahead_.valid = false;
}

int32_t Decoder::choose(const Tensor& logits) {
  last_logits_ = logits;
  int32_t id;
  if (greedy_on_device_) {
    ops::argmax(argmax_dev_, logits);
    ops::transfer(argmax_host_, argmax_dev_);
    id = argmax_host_.data<int32_t>()[0];
  } else if (logits.device() == Device::CPU) {
    id = sampler_.sample({logits.data<float>(), static_cast<size_t>(logits.dim(-1))}, history_);
  } else {
    if (!logits_host_.defined()) logits_host_ = Tensor::empty(logits.shape(), DType::F32);
    ops::transfer(logits_host_, logits);
    id = sampler_.sample({logits_host_.data<float>(), static_cast<size_t>(logits.dim(-1))},
                         history_);
  }
  history_.push_back(id);
  return id;
}

int32_t Decoder::prefill(const std::vector<int32_t>& tokens, int64_t pos, int64_t seq) {
  drop_ahead();
  history_.insert(history_.end(), tokens.begin(), tokens.end());
  model_.stage(tokens, pos, seq);
  return choose(model_.compute(static_cast<int64_t>(tokens.size()), /*all_logits=*/false));
}

std::vector<int32_t> Decoder::step_batch(const std::vector<int32_t>& tokens,
                                         const std::vector<int64_t>& pos) {
  const auto b = static_cast<int64_t>(tokens.size());
  drop_ahead();  // a single-sequence step enqueued ahead is not what comes next
  model_.stage_step(tokens, pos);
  if (!batch_ids_dev_.defined() || batch_ids_dev_.dim(0) != b) {
    batch_ids_dev_ = Tensor::empty({b}, DType::I32, model_.device());
    batch_ids_host_ = Tensor::empty({b}, DType::I32);
  }
  Tensor logits;
#ifdef LLMK_HAS_CUDA
  if (use_graph_) {
    if (batch_graph_ == nullptr || batch_graph_size_ != b) {
      batch_graph_ = std::make_unique<GraphState>();
      batch_graph_size_ = b;
      model_.compute(b, true);  // sizes activations and settles one-time setup, as in step()
      capture_step(model_, b, batch_graph_->graph, [&] {
        batch_graph_->logits = model_.compute(b, true);
        ops::argmax(batch_ids_dev_, batch_graph_->logits);
      });
    }
    batch_graph_->graph.replay();
    logits = batch_graph_->logits;
  }
#endif
  if (!logits.defined()) {
    logits = model_.compute(b, true);
    ops::argmax(batch_ids_dev_, logits);
  }
  last_logits_ = logits;
  ops::transfer(batch_ids_host_, batch_ids_dev_);
  const int32_t* ids = batch_ids_host_.data<int32_t>();
  return std::vector<int32_t>(ids, ids + b);
}

#ifdef LLMK_HAS_CUDA
void Decoder::enqueue_step(int slot) {
  graph_->graph.replay();
  if (!greedy_on_device_) return;
  const cudaStream_t s = cuda::current_stream();
  LLMK_CUDA_CHECK(cudaMemcpyAsync(graph_->tokens + slot, argmax_dev_.data(), sizeof(int32_t),
                                  cudaMemcpyDeviceToHost, s));
  LLMK_CUDA_CHECK(cudaEventRecord(graph_->landed[slot], s));
}
#else
void Decoder::enqueue_step(int) {}
#endif

int32_t Decoder::step(int32_t token, int64_t pos) {
  if (!use_graph_) return choose(model_.forward({&token, 1}, pos, false));
#ifdef LLMK_HAS_CUDA
  Ahead cur = ahead_;
  if (!(ahead_.valid && ahead_.token == token && ahead_.pos == pos)) {
    drop_ahead();
    model_.stage({&token, 1}, pos);
    if (!graph_->graph.ready()) {
      // One plain run first: it sizes the activations and lets every op settle its one-time
      // setup (cuBLASLt algorithms), so that the captured step allocates nothing. Capturing
      // then records the same work; replaying it rewrites this position's KV rows with equal
      // values.
      model_.compute(1, false);
      capture_step(model_, 1, graph_->graph, [&] {
        graph_->logits = model_.compute(1, false);
        if (greedy_on_device_) ops::argmax(argmax_dev_, graph_->logits);  // one launch fewer
      });
      if (greedy_on_device_) graph_->make_slots();
    }
    cur = {.token = token, .pos = pos, .slot = 0, .valid = true};
    enqueue_step(cur.slot);
  }
  ahead_.valid = false;
  if (!greedy_on_device_) return choose(graph_->logits);
  // The next step, fed with this one's argmax where it lies on the device, before this one's
  // token is read back.
  if (lookahead_ && pos + 1 < model_.context()) {
    model_.stage_device_token(argmax_dev_, pos + 1);
    ahead_ = {.pos = pos + 1, .slot = 1 - cur.slot, .valid = true};
    enqueue_step(ahead_.slot);
  }
  LLMK_CUDA_CHECK(cudaEventSynchronize(graph_->landed[cur.slot]));
  const int32_t id = graph_->tokens[cur.slot];
  ahead_.token = id;
  last_logits_ = graph_->logits;
  history_.push_back(id);
  return id;
#else
  return choose(model_.forward({&token, 1}, pos, false));
#endif
}

GenerateStats generate(Model& model, const Tokenizer& tok, const std::vector<int32_t>& prompt,
                       const GenerateOptions& opts, const TokenCallback& on_token, int64_t cached) {
  LLMK_CHECK(!prompt.empty(), "the prompt is empty (no tokens to start from)");
  LLMK_CHECK(cached >= 0 && cached < static_cast<int64_t>(prompt.size()),
             "generate: {} cached tokens of a {}-token prompt (at least one must run)", cached,
             prompt.size());
  LLMK_CHECK(opts.max_tokens >= 0, "the token limit {} must be >= 0", opts.max_tokens);
  const auto n_prompt = static_cast<int64_t>(prompt.size());
  LLMK_CHECK(n_prompt < model.context(),
             "the prompt has {} tokens but the context holds {} (raise --ctx, at most {})",
             n_prompt, model.context(), model.config().context_length);
  const std::vector<int32_t> eog = tok.end_of_generation_ids();
  Decoder dec(model, opts.sampler, opts.cuda_graph, /*lookahead=*/true);
  GenerateStats st;
  st.prompt_tokens = n_prompt - cached;
  st.stop_reason = "length";
  if (opts.max_tokens == 0) return st;

  auto t0 = Clock::now();
  // The sampler's repetition window looks at the whole prompt, cached part included.
  dec.add_history({prompt.data(), static_cast<size_t>(cached)});
  const std::vector<int32_t> fresh(prompt.begin() + cached, prompt.end());
  int32_t id = dec.prefill(fresh, cached);
  st.prompt_seconds = seconds_since(t0);
  auto t1 = Clock::now();
  int64_t pos = n_prompt;
  for (;;) {
    ++st.generated_tokens;
    st.sampled.push_back(id);
    if (opts.stop_at_eog && std::find(eog.begin(), eog.end(), id) != eog.end()) {
      st.stop_reason = "eog";
      break;
    }
    if (!on_token(id, tok.token_bytes(id))) {
      st.stop_reason = "callback";
      break;
    }
    if (st.generated_tokens >= opts.max_tokens) break;
    if (pos >= model.context()) {
      st.stop_reason = "context";
      break;
    }
    id = dec.step(id, pos);
    ++pos;
  }
  st.generate_seconds = seconds_since(t1);
  return st;
}

std::string Utf8Stream::push(const std::string& bytes) {
  pending_ += bytes;
  const size_t complete = utf8::complete_prefix(pending_);
  std::string ready = pending_.substr(0, complete);
  pending_.erase(0, complete);
  return ready;
}

std::string Utf8Stream::flush() {
  std::string rest;
  rest.swap(pending_);
  return rest;
}

}  // namespace llmk
