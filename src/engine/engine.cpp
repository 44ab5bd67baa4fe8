#include "engine/engine.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>

#include "core/error.h"
#include "core/tensor.h"
#include "kernels/gumbel.h"
#include "model/model.h"
#include "ops/ops.h"

namespace llmk {

namespace {
// The model's pool pages, checked: the engine needs a paged pool.
int64_t pool_pages(const Model& model) {
  LLMK_CHECK(model.kv_pages() > 0, "engine: the model has no paged KV pool (Engine::load)");
  return model.kv_pages();
}
}  // namespace

Engine::Engine(Model& model, const EngineOptions& opts)
    : model_(model),
      kv_(pool_pages(model), model.kv_page_size()),
      sched_(kv_, SchedulerConfig{.max_running = opts.max_running,
                                  .max_step_tokens = opts.max_step_tokens}),
      opts_(opts) {
  if (opts.cuda_graphs && model.device() == Device::CUDA && model.kv_scratch_page() >= 0) {
    const int64_t ps = model.kv_page_size();
    graph_width_ = (model.context() + ps - 1) / ps;
    // Everything a step reads sized once, so that no later step moves what a graph holds.
    model.reserve_runs(opts.max_running, std::max(opts.max_step_tokens, opts.max_running),
                       graph_width_);
    graphs_ = std::make_unique<StepGraphs>(model);
  }
}

int64_t Engine::bucket(int64_t b) const {
  int64_t rows = 1;
  while (rows < b) rows *= 2;
  return std::min(rows, std::max(b, opts_.max_running));
}

std::unique_ptr<Model> Engine::load(const std::string& path, int64_t context, int64_t sequences,
                                    int64_t page_size, Device device, int64_t kv_memory,
                                    KvType kv_type, std::optional<DType> dtype,
                                    bool batch_invariant, bool quantized_weights,
                                    bool host_embeddings) {
  LLMK_CHECK(sequences >= 1 && page_size >= 1,
             "engine: {} sequences of pages of {} tokens: both must be at least 1", sequences,
             page_size);
  return Model::load(path, LoadOptions{.context = context,
                                       .sequences = sequences,
                                       .device = device,
                                       .page_size = page_size,
                                       .kv_memory = kv_memory,
                                       .scratch_page = true,
                                       .kv_type = kv_type,
                                       .dtype = dtype,
                                       .quantized_weights = quantized_weights,
                                       .batch_invariant = batch_invariant,
                                       .host_embeddings = host_embeddings});
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
  LLMK_CHECK(opts.top_logprobs >= 0 && opts.top_logprobs <= 20,
             "engine: top_logprobs = {} must be from 0 to 20", opts.top_logprobs);
  LLMK_CHECK(opts.logprobs || opts.top_logprobs == 0, "engine: top_logprobs = {} needs logprobs",
             opts.top_logprobs);
  LLMK_CHECK(opts.n >= 1 && opts.n <= opts_.max_running,
             "engine: n = {} samples must be from 1 to the running cap {}", opts.n,
             opts_.max_running);
  opts.sampler.validate();
  const int64_t id = next_request_++, seq = next_seq_++;
  const auto n = static_cast<int64_t>(prompt.size());
  sched_.add(seq, std::move(prompt));
  requests_.emplace(id, Request{opts, std::move(on_token), n, {seq}, opts.n == 1});
  samples_.emplace(seq, Sample{id, 0, Sampler(opts.sampler)});
  return id;
}

bool Engine::abort(int64_t request) {
  const auto it = requests_.find(request);
  if (it == requests_.end()) return false;
  for (const int64_t seq : it->second.seqs) {
    sched_.abort(seq);
    samples_.erase(seq);
  }
  requests_.erase(it);
  aborted_.push_back(request);
  return true;
}

namespace {
// log sum exp of a row of logits (-inf entries add nothing).
float log_sum_exp(std::span<const float> row) {
  const float m = *std::max_element(row.begin(), row.end());
  if (m == -std::numeric_limits<float>::infinity()) return m;
  double sum = 0;
  for (const float x : row) sum += std::exp(static_cast<double>(x - m));
  return m + static_cast<float>(std::log(sum));
}

// The event's logprob of its token and its top k alternatives from the row.
void add_logprobs(TokenEvent& e, std::span<const float> row, float lse, int k) {
  e.logprob = row[static_cast<size_t>(e.token)] - lse;
  if (k == 0) return;
  std::vector<int32_t> ids(row.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
  const auto more = [&](int32_t a, int32_t b) {
    return row[static_cast<size_t>(a)] > row[static_cast<size_t>(b)] ||
           (row[static_cast<size_t>(a)] == row[static_cast<size_t>(b)] && a < b);
  };
  const auto kk = std::min<size_t>(static_cast<size_t>(k), ids.size());
  std::partial_sort(ids.begin(), ids.begin() + static_cast<long>(kk), ids.end(), more);
  for (size_t i = 0; i < kk; ++i)
    e.top.emplace_back(ids[i], row[static_cast<size_t>(ids[i])] - lse);
}

// add_logprobs from a row's largest logits (descending), which hold the event's token.
void add_top_logprobs(TokenEvent& e, std::span<const float> values, std::span<const int32_t> ids,
                      float lse, int k) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] == e.token) {
      e.logprob = values[i] - lse;
      break;
    }
  }
  for (size_t i = 0; i < std::min(static_cast<size_t>(k), ids.size()); ++i)
    e.top.emplace_back(ids[i], values[i] - lse);
}
}  // namespace

namespace {
// No penalty (or penalized: applied already), no logprobs and no samples left to fork: the
// token needs the row alone.
bool row_alone(const RequestOptions& o, bool forked, bool penalized) {
  return (penalized || !o.sampler.penalties()) && !o.logprobs && (forked || o.n == 1);
}
}  // namespace

bool Engine::device_penalties(const Request& r) {
  return r.opts.sampler.penalties() && row_alone(r.opts, r.forked, true);
}

bool Engine::plain_sampled(const Request& r, int64_t vocab, bool penalized) {
  const SamplerConfig& c = r.opts.sampler;
  return c.temperature > 0.0f && (c.top_k == 0 || c.top_k >= vocab) && c.top_p >= 1.0f &&
         row_alone(r.opts, r.forked, penalized);
}

bool Engine::plain_greedy(const Request& r, bool penalized) {
  return r.opts.sampler.temperature <= 0.0f && row_alone(r.opts, r.forked, penalized);
}

Finish Engine::finish_of(const Request& r, int32_t token, int64_t known) const {
  if (std::find(r.opts.stop_ids.begin(), r.opts.stop_ids.end(), token) != r.opts.stop_ids.end()) {
    return Finish::Stop;
  }
  // max_tokens reached, or this token's position (known) is past the context: never computed.
  if (known + 1 - r.prompt_tokens >= r.opts.max_tokens || known >= model_.context()) {
    return Finish::Length;
  }
  return Finish::None;
}

void Engine::read_rows(const Scheduler::Step& st, const Tensor& logits) {
  const int64_t vocab = model_.config().vocab_size, rows = logits.dim(0);
  // What the host reads of each row: on the CPU the whole row. On CUDA the penalties of a row
  // without logprobs or samples yet to fork from it are applied there first
  // (ops::apply_penalties, the sampler's arithmetic); then a plain greedy row (no penalties left,
  // no logprobs, no samples yet to fork) only its argmax, taken on the device; a plain sampled
  // row (no top-k or top-p, no penalties left, no logprobs or samples to fork) only its token,
  // drawn on the device by the Gumbel-max trick (ops::sample_gumbel: the temperature and min-p,
  // seeded by the sample's seed and the token's position); a top-k row without penalties left
  // (Sampler::top_candidates) its largest logits and log-sum-exp (ops::topk_lse), from which the
  // sampler draws what it would draw from the whole row; a top-p row without top-k or logprobs
  // (Sampler::nucleus) the most candidates and the log-sum-exp at its temperature, the whole row
  // after all where they hold less than top-p of the mass; any other row comes whole.
  read_.assign(static_cast<size_t>(rows), Read::Whole);
  penalized_.assign(static_cast<size_t>(rows), 0);
  nucleus_.assign(static_cast<size_t>(rows), 0);
  lse_scale_.assign(static_cast<size_t>(rows), 1.0f);
  bool any_nucleus = false;
  int64_t top_k = 0;
  bool any_argmax = false, any_gumbel = false;
  if (model_.device() != Device::CPU) {
    const int max_k = static_cast<int>(std::min<int64_t>(vocab, ops::kMaxTopk));
    gumbel_temperature_.assign(static_cast<size_t>(rows), 1.0f);
    gumbel_min_p_.assign(static_cast<size_t>(rows), 0.0f);
    gumbel_seed_.assign(static_cast<size_t>(rows), 0);
    penalty_at_.clear();
    penalty_by_.clear();
    size_t i = 0;
    for (const Scheduler::Work& w : st.work) {
      if (!w.samples) continue;
      const Sample& sm = samples_.at(w.id);
      const Request& r = requests_.at(sm.request);
      const bool pen = device_penalties(r);
      if (pen) {
        penalized_[i] = 1;
        Sampler::penalty_entries(r.opts.sampler, sched_.tokens(w.id),
                                 static_cast<size_t>(r.prompt_tokens), static_cast<int32_t>(vocab),
                                 entries_);
        for (const PenaltyEntry& e : entries_) {
          penalty_at_.insert(penalty_at_.end(), {static_cast<int32_t>(i), e.id});
          penalty_by_.insert(penalty_by_.end(), {e.rp, e.sub});
        }
      }
      const int k = Sampler::top_candidates(r.opts.sampler, max_k, pen);
      lse_scale_[i] = 1.0f;
      if (plain_greedy(r, pen)) {
        read_[i] = Read::Argmax;
        any_argmax = true;
      } else if (plain_sampled(r, vocab, pen)) {
        read_[i] = Read::Gumbel;
        any_gumbel = true;
        gumbel_temperature_[i] = r.opts.sampler.temperature;
        gumbel_min_p_[i] = r.opts.sampler.min_p;
        gumbel_seed_[i] = static_cast<int64_t>(
            gumbel::row_seed(r.opts.sampler.seed + static_cast<uint64_t>(sm.index),
                             static_cast<int64_t>(sched_.tokens(w.id).size())));
      } else if (k > 0) {
        read_[i] = Read::Top;
        top_k = std::max<int64_t>({top_k, k, r.opts.logprobs ? r.opts.top_logprobs : 0});
      } else if (!r.opts.logprobs && Sampler::nucleus(r.opts.sampler, vocab, pen)) {
        // top-p alone: the most candidates and the log-sum-exp at the temperature (its logprobs
        // would need the lse at 1); the whole row after all where they hold too little mass.
        read_[i] = Read::Top;
        nucleus_[i] = 1;
        any_nucleus = true;
        lse_scale_[i] = 1.0f / r.opts.sampler.temperature;
        top_k = max_k;
      }
      ++i;
    }
  }
  if (!penalty_at_.empty()) {
    const auto n = static_cast<int64_t>(penalty_by_.size() / 2);
    Tensor at = Tensor::empty({n, 2}, DType::I32, model_.device());
    Tensor by = Tensor::empty({n, 2}, DType::F32, model_.device());
    ops::transfer(at, Tensor::borrow(penalty_at_.data(), {n, 2}, DType::I32));
    ops::transfer(by, Tensor::borrow(penalty_by_.data(), {n, 2}, DType::F32));
    Tensor penalized = logits;  // the same storage: penalised in place
    ops::apply_penalties(penalized, at, by);
  }
  if (std::count(read_.begin(), read_.end(), Read::Whole) > 0) {  // else no row comes whole
    host_logits_.resize(static_cast<size_t>(rows * vocab));
  }
  if (any_argmax) {
    host_argmax_.resize(static_cast<size_t>(rows));
    Tensor ids = Tensor::empty({rows}, DType::I32, model_.device());
    ops::argmax(ids, logits);
    Tensor host = Tensor::borrow(host_argmax_.data(), {rows}, DType::I32);
    ops::transfer(host, ids);
  }
  if (any_gumbel) {  // every row drawn; only the Gumbel rows' draws are read
    const auto to_device = [&](auto& host, DType dt) {
      Tensor d = Tensor::empty({rows}, dt, model_.device());
      ops::transfer(d, Tensor::borrow(host.data(), {rows}, dt));
      return d;
    };
    Tensor ids = Tensor::empty({rows}, DType::I32, model_.device());
    ops::sample_gumbel(ids, logits, to_device(gumbel_temperature_, DType::F32),
                       to_device(gumbel_min_p_, DType::F32), to_device(gumbel_seed_, DType::I64));
    host_drawn_.resize(static_cast<size_t>(rows));
    Tensor host = Tensor::borrow(host_drawn_.data(), {rows}, DType::I32);
    ops::transfer(host, ids);
  }
  if (top_k > 0) {
    top_k = std::min<int64_t>(top_k, std::min<int64_t>(vocab, ops::kMaxTopk));
    host_top_ids_.resize(static_cast<size_t>(rows * top_k));
    host_top_values_.resize(host_top_ids_.size());
    host_lse_.resize(static_cast<size_t>(rows));
    Tensor ids = Tensor::empty({rows, top_k}, DType::I32, model_.device());
    Tensor values = Tensor::empty({rows, top_k}, DType::F32, model_.device());
    Tensor lse = Tensor::empty({rows}, DType::F32, model_.device());
    if (any_nucleus) {
      Tensor scale = Tensor::empty({rows}, DType::F32, model_.device());
      ops::transfer(scale, Tensor::borrow(lse_scale_.data(), {rows}, DType::F32));
      ops::topk_lse(ids, values, lse, logits, &scale);
    } else {
      ops::topk_lse(ids, values, lse, logits);
    }
    Tensor h_ids = Tensor::borrow(host_top_ids_.data(), {rows, top_k}, DType::I32);
    Tensor h_values = Tensor::borrow(host_top_values_.data(), {rows, top_k}, DType::F32);
    Tensor h_lse = Tensor::borrow(host_lse_.data(), {rows}, DType::F32);
    ops::transfer(h_ids, ids);
    ops::transfer(h_values, values);
    ops::transfer(h_lse, lse);
  }
  top_k_ = top_k;
  if (any_argmax || any_gumbel || top_k > 0) {
    for (int64_t i = 0; i < rows; ++i) {
      if (read_[static_cast<size_t>(i)] != Read::Whole) continue;
      Tensor dst = Tensor::borrow(host_logits_.data() + i * vocab, {1, vocab}, DType::F32);
      ops::transfer(dst, logits.slice(0, i, i + 1));
    }
  } else if (rows > 0) {
    Tensor host = Tensor::borrow(host_logits_.data(), {rows, vocab}, DType::F32);
    ops::transfer(host, logits);
  }
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
  // One token per sequence, each with logits (decode steps): a graph of the step's bucket.
  const bool graphed =
      graphs_ != nullptr && std::all_of(st.work.begin(), st.work.end(), [&](const auto& w) {
        return w.count == 1 && w.samples &&
               static_cast<int64_t>(kv_.page_table(w.id).size()) <= graph_width_;
      });
  Tensor logits;
  if (graphed) {
    const auto b = static_cast<int64_t>(runs.size()), rows = bucket(b);
    model_.stage_runs(runs, {.rows = rows, .width = graph_width_});
    logits = graphs_->run(rows).slice(0, 0, b);
  } else {
    model_.stage_runs(runs);
    logits = model_.compute(st.tokens, false);
  }
  const int64_t vocab = model_.config().vocab_size;
  read_rows(st, logits);
  struct Event {
    TokenFn fn;
    TokenEvent e;
    int64_t seq;  // its sequence (-1: a sample that ended at its first token)
  };
  std::vector<Event> events;
  std::vector<int32_t> sampled;
  std::vector<int64_t> finished;
  std::vector<Scheduler::Fork> forks;
  size_t j = 0;
  for (const Scheduler::Work& w : st.work) {
    if (!w.samples) continue;
    Sample& sm = samples_.at(w.id);
    Request& r = requests_.at(sm.request);
    const std::vector<int32_t>& t = sched_.tokens(w.id);
    const auto known = static_cast<int64_t>(t.size());
    const size_t at = j++;
    const Read how = read_[at];
    const std::span<const float> row =
        how == Read::Whole
            ? std::span<const float>(host_logits_)
                  .subspan(at * static_cast<size_t>(vocab), static_cast<size_t>(vocab))
            : std::span<const float>();
    const auto top = static_cast<size_t>(top_k_);
    const std::span<const float> top_values =
        how == Read::Top ? std::span<const float>(host_top_values_).subspan(at * top, top)
                         : std::span<const float>();
    const std::span<const int32_t> top_ids =
        how == Read::Top ? std::span<const int32_t>(host_top_ids_).subspan(at * top, top)
                         : std::span<const int32_t>();
    const auto from = static_cast<size_t>(r.prompt_tokens);
    // A row penalised on the device is drawn from without the history (no penalty again).
    const bool pen = !penalized_.empty() && penalized_[at] != 0;
    const bool nucleus = !nucleus_.empty() && nucleus_[at] != 0;
    const auto whole = [&](Sampler& s, std::span<const float> x) {
      return pen ? s.sample(x, {}, 0) : s.sample(x, t, from);
    };
    const auto draw = [&](Sampler& s) {
      if (how == Read::Top && nucleus) {
        const int32_t token = s.sample_nucleus(top_values, top_ids, host_lse_[at]);
        if (token >= 0) return token;
        // The nucleus reaches past the candidates: the row after all.
        row_.resize(static_cast<size_t>(vocab));
        Tensor dst = Tensor::borrow(row_.data(), {1, vocab}, DType::F32);
        ops::transfer(dst, logits.slice(0, static_cast<int64_t>(at), static_cast<int64_t>(at) + 1));
        return whole(s, row_);
      }
      return how == Read::Top ? s.sample_top(top_values, top_ids, pen) : whole(s, row);
    };
    const int32_t token = how == Read::Argmax   ? host_argmax_[at]
                          : how == Read::Gumbel ? host_drawn_[at]
                                                : draw(sm.sampler);
    const Finish finish = finish_of(r, token, known);
    sampled.push_back(token);
    if (finish != Finish::None) finished.push_back(w.id);
    const float lse = !r.opts.logprobs ? 0.0f : how == Read::Top ? host_lse_[at] : log_sum_exp(row);
    const auto add_event = [&](int index, int32_t tok, Finish f, int64_t seq) {
      events.push_back({r.on_token, {sm.request, index, tok, f}, seq});
      if (!r.opts.logprobs) return;
      if (how == Read::Top) {
        add_top_logprobs(events.back().e, top_values, top_ids, lse, r.opts.top_logprobs);
      } else {
        add_logprobs(events.back().e, row, lse, r.opts.top_logprobs);
      }
    };
    add_event(sm.index, token, finish, w.id);
    if (!r.forked) {  // the prompt's first draw: samples 1 .. n-1 draw from the same logits
      r.forked = true;
      for (int k = 1; k < r.opts.n; ++k) {
        SamplerConfig c = r.opts.sampler;
        c.seed += static_cast<uint64_t>(k);
        Sampler sk(c);
        const int32_t tk = draw(sk);
        const Finish fk = finish_of(r, tk, known);
        int64_t child = -1;
        if (fk == Finish::None) {
          child = next_seq_++;
          forks.push_back({w.id, child, tk});
          samples_.emplace(child, Sample{sm.request, k, std::move(sk)});
          r.seqs.push_back(child);
        }
        add_event(k, tk, fk, child);
      }
    }
  }
  sched_.update(st, sampled, finished, forks);
  for (const int64_t seq : finished) forget_sample(seq);
  // After the bookkeeping, so that a callback may add or abort requests; a request aborted by an
  // earlier callback of this step gets no more calls.
  aborted_.clear();
  for (const Event& ev : events) {
    if (std::find(aborted_.begin(), aborted_.end(), ev.e.request) != aborted_.end()) continue;
    const bool go_on = !ev.fn || ev.fn(ev.e);
    if (!go_on && ev.e.finish == Finish::None && samples_.count(ev.seq) != 0) {
      sched_.abort(ev.seq);
      forget_sample(ev.seq);
    }
  }
}

void Engine::forget_sample(int64_t seq) {
  const int64_t request = samples_.at(seq).request;
  Request& r = requests_.at(request);
  samples_.erase(seq);
  r.seqs.erase(std::find(r.seqs.begin(), r.seqs.end(), seq));
  if (r.forked && r.seqs.empty()) requests_.erase(request);
}

}  // namespace llmk
