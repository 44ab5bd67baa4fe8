#include "engine/scheduler.h"

#include <algorithm>

#include "core/error.h"

namespace llmk {

Scheduler::Scheduler(KvPages& kv, const SchedulerConfig& cfg) : kv_(kv), cfg_(cfg) {
  LLMK_CHECK(cfg.max_running >= 1 && cfg.max_step_tokens >= 1,
             "scheduler: max_running {} and max_step_tokens {} must be at least 1", cfg.max_running,
             cfg.max_step_tokens);
}

void Scheduler::add(Id id, std::vector<int32_t> prompt) {
  LLMK_CHECK(seqs_.count(id) == 0, "scheduler: request {} exists already", id);
  LLMK_CHECK(!prompt.empty(), "scheduler: request {} has an empty prompt", id);
  const auto n = static_cast<int64_t>(prompt.size());
  LLMK_CHECK(kv_.pages_for(n) <= kv_.num_pages(),
             "scheduler: request {}: a prompt of {} tokens needs {} KV pages; the pool has {}", id,
             n, kv_.pages_for(n), kv_.num_pages());
  seqs_.emplace(id, Seq{std::move(prompt), 0, 0});
  queue_.push_back(id);
}

bool Scheduler::abort(Id id) {
  if (seqs_.count(id) == 0) return false;
  if (const auto it = std::find(queue_.begin(), queue_.end(), id); it != queue_.end()) {
    queue_.erase(it);
  } else {
    running_.erase(std::find(running_.begin(), running_.end(), id));
    kv_.free(id);
  }
  seqs_.erase(id);
  return true;
}

void Scheduler::preempt(Id id) {
  kv_.free(id);
  running_.erase(std::find(running_.begin(), running_.end(), id));
  Seq& s = seqs_.at(id);
  s.computed = 0;
  s.in_pool = 0;
  queue_.push_front(id);
  ++preemptions_;
}

Scheduler::Step Scheduler::schedule() {
  Step st;
  int64_t budget = cfg_.max_step_tokens;
  // 1. Decode: the token sampled last, once the pool has a slot for it.
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    const Id id = running_[i];
    Seq& s = seqs_.at(id);
    const auto known = static_cast<int64_t>(s.tokens.size());
    if (s.in_pool == known) continue;  // in its prompt: step 2
    bool self = false;
    while (!kv_.can_append(id, 1)) {
      const Id victim = running_.back();
      LLMK_CHECK(victim != id || running_.size() > 1,
                 "scheduler: sequence {} of {} tokens alone needs more than the pool's {} KV "
                 "pages",
                 id, known, kv_.num_pages());
      preempt(victim);
      st.preempted.push_back(victim);
      if (victim == id) {
        self = true;
        break;
      }
    }
    if (self) break;  // it was the newest: nothing after it runs
    const auto copies = kv_.append(id, std::span<const int32_t>(&s.tokens.back(), 1));
    st.copies.insert(st.copies.end(), copies->begin(), copies->end());
    s.in_pool = known;
    st.work.push_back({id, s.computed, 1, true});
    --budget;
  }
  // 2. Prompts under way: the next chunk of each.
  const size_t decoded = st.work.size();
  for (const Id id : running_) {
    if (budget == 0) break;
    const Seq& s = seqs_.at(id);
    const auto known = static_cast<int64_t>(s.tokens.size());
    const bool scheduled = std::any_of(st.work.begin(), st.work.begin() + decoded,
                                       [&](const Work& w) { return w.id == id; });
    if (scheduled || s.computed == known) continue;
    const int64_t n = std::min(known - s.computed, budget);
    st.work.push_back({id, s.computed, n, s.computed + n == known});
    budget -= n;
  }
  // 3. The queue, first come first served.
  while (!queue_.empty() && budget > 0 &&
         static_cast<int64_t>(running_.size()) < cfg_.max_running) {
    const Id id = queue_.front();
    Seq& s = seqs_.at(id);
    const auto cached = kv_.add(id, s.tokens);
    if (!cached) break;  // the head waits for pages; nothing overtakes it
    queue_.pop_front();
    running_.push_back(id);
    const auto known = static_cast<int64_t>(s.tokens.size());
    s.computed = *cached;
    s.in_pool = known;
    const int64_t n = std::min(known - s.computed, budget);
    st.work.push_back({id, s.computed, n, s.computed + n == known});
    budget -= n;
  }
  st.tokens = cfg_.max_step_tokens - budget;
  return st;
}

void Scheduler::update(const Step& step, const std::vector<int32_t>& sampled,
                       const std::vector<Id>& finished, const std::vector<Fork>& forks) {
  size_t j = 0;
  for (const Work& w : step.work) {
    Seq& s = seqs_.at(w.id);
    s.computed = w.start + w.count;
    kv_.computed(w.id, s.computed);
    if (w.samples) {
      LLMK_CHECK(j < sampled.size(), "scheduler: fewer sampled tokens than sampling sequences");
      s.tokens.push_back(sampled[j++]);
    }
  }
  LLMK_CHECK(j == sampled.size(), "scheduler: {} sampled tokens for {} sampling sequences",
             sampled.size(), j);
  for (const Fork& f : forks) {
    LLMK_CHECK(seqs_.count(f.child) == 0, "scheduler: request {} exists already", f.child);
    Seq child = seqs_.at(f.parent);
    LLMK_CHECK(child.in_pool == child.computed &&
                   child.computed + 1 == static_cast<int64_t>(child.tokens.size()),
               "scheduler: sequence {} forked without a token sampled this step", f.parent);
    child.tokens.back() = f.token;
    kv_.fork(f.parent, f.child);
    seqs_.emplace(f.child, std::move(child));
    running_.push_back(f.child);
  }
  for (const Id id : finished) {
    const auto it = std::find(running_.begin(), running_.end(), id);
    LLMK_CHECK(it != running_.end(), "scheduler: sequence {} finished but is not running", id);
    running_.erase(it);
    kv_.free(id);
    seqs_.erase(id);
  }
}

const std::vector<int32_t>& Scheduler::tokens(Id id) const {
  const auto it = seqs_.find(id);
  LLMK_CHECK(it != seqs_.end(), "scheduler: no request {}", id);
  return it->second.tokens;
}

Scheduler::Stats Scheduler::stats() const {
  return {static_cast<int64_t>(queue_.size()), static_cast<int64_t>(running_.size()), preemptions_};
}

}  // namespace llmk
