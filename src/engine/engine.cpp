#include "engine/engine.h"

#include <algorithm>
#include <span>

#include "core/error.h"
#include "core/tensor.h"
#include "model/model.h"
#include "ops/ops.h"

namespace llmk {

Engine::Engine(Model& model, const EngineOptions& opts)
    : model_(model),
      kv_(std::max<int64_t>(model.kv_pages(), 1), std::max<int64_t>(model.kv_page_size(), 1)),
      sched_(kv_, SchedulerConfig{.max_running = opts.max_running,
                                  .max_step_tokens = opts.max_step_tokens}) {
  LLMK_CHECK(model.device() == Device::CPU,
             "engine: runs on the CPU only so far (its CUDA forward of mixed batches is not yet "
             "validated)");
  LLMK_CHECK(model.kv_pages() > 0, "engine: the model has no paged KV pool (Engine::load)");
}

std::unique_ptr<Model> Engine::load(const std::string& path, int64_t context, int64_t sequences,
                                    int64_t page_size) {
  LLMK_CHECK(sequences >= 1 && page_size >= 1,
             "engine: {} sequences of pages of {} tokens: both must be at least 1", sequences,
             page_size);
  return Model::load(path, LoadOptions{.context = context,
                                       .sequences = sequences,
                                       .device = Device::CPU,
                                       .page_size = page_size});
}

int64_t Engine::add_request(std::vector<int32_t> prompt, const RequestOptions& opts,
                            TokenFn on_token) {
  const int64_t vocab = model_.config().vocab_size, ctx = model_.context();
  LLMK_CHECK(!prompt.empty(), "engine: empty prompt");
  LLMK_CHECK(static_cast<int64_t>(prompt.size()) <= ctx,
             "engine: a prompt of {} tokens is longer than the context of {}", prompt.size(), ctx);
  for (size_t i = 0; i < prompt.size(); ++i) {
    LLMK_CHECK(prompt[i] >= 0 && prompt[i] < vocab,
               "engine: prompt token {} ({}) is outside the vocabulary of {}", i + 1, prompt[i],
               vocab);
  }
  LLMK_CHECK(opts.max_tokens >= 1, "engine: max_tokens {} must be at least 1", opts.max_tokens);
  opts.sampler.validate();
  const int64_t id = next_id_++;
  const auto n = static_cast<int64_t>(prompt.size());
  sched_.add(id, std::move(prompt));
  requests_.emplace(id, Request{opts, Sampler(opts.sampler), std::move(on_token), n});
  return id;
}

bool Engine::abort(int64_t request) {
  if (requests_.erase(request) == 0) return false;
  return sched_.abort(request);
}

void Engine::step() {
  const Scheduler::Step st = sched_.schedule();
  if (st.work.empty()) return;
  for (const KvPages::CopyOp& c : st.copies) model_.copy_kv_page(c.src, c.dst, c.rows);
  std::vector<Model::Run> runs;
  runs.reserve(st.work.size());
  for (const Scheduler::Work& w : st.work) {
    const std::span<const int32_t> t = sched_.tokens(w.id);
    runs.push_back({.tokens = t.subspan(static_cast<size_t>(w.start), static_cast<size_t>(w.count)),
                    .pos = w.start,
                    .pages = kv_.page_table(w.id),
                    .logits = w.samples});
  }
  model_.stage_runs(runs);
  const Tensor logits = model_.compute(st.tokens, false);
  const int64_t vocab = model_.config().vocab_size, rows = logits.dim(0);
  host_logits_.resize(static_cast<size_t>(rows * vocab));
  if (rows > 0) {
    Tensor host = Tensor::borrow(host_logits_.data(), {rows, vocab}, DType::F32);
    ops::transfer(host, logits);
  }
  struct Event {
    TokenFn fn;
    int64_t id;
    int32_t token;
    Finish finish;
  };
  std::vector<Event> events;
  std::vector<int32_t> sampled;
  std::vector<int64_t> finished;
  size_t j = 0;
  for (const Scheduler::Work& w : st.work) {
    if (!w.samples) continue;
    Request& r = requests_.at(w.id);
    const std::vector<int32_t>& t = sched_.tokens(w.id);
    const int32_t token =
        r.sampler.sample(std::span<const float>(host_logits_)
                             .subspan(j++ * static_cast<size_t>(vocab), static_cast<size_t>(vocab)),
                         t);
    const int64_t generated = static_cast<int64_t>(t.size()) + 1 - r.prompt_tokens;
    Finish finish = Finish::None;
    if (std::find(r.opts.stop_ids.begin(), r.opts.stop_ids.end(), token) != r.opts.stop_ids.end()) {
      finish = Finish::Stop;
    } else if (generated >= r.opts.max_tokens ||
               static_cast<int64_t>(t.size()) >= model_.context()) {
      finish = Finish::Length;  // (this token's position is past the context: never computed)
    }
    sampled.push_back(token);
    if (finish != Finish::None) finished.push_back(w.id);
    events.push_back({r.on_token, w.id, token, finish});
  }
  sched_.update(st, sampled, finished);
  for (const int64_t id : finished) requests_.erase(id);
  // After the bookkeeping, so that a callback may add or abort requests.
  for (const Event& e : events) {
    if (e.finish == Finish::None && requests_.count(e.id) == 0) continue;  // aborted meanwhile
    if (e.fn) e.fn(e.id, e.token, e.finish);
  }
}

}  // namespace llmk
