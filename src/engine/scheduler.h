// Which tokens of which sequences each step of the many-sequence engine computes.
//
// A sequence is its known tokens (the prompt, then each sampled token) of which the first
// `computed` have their keys in the KV pool. A step computes, for each sequence it takes, the
// next run of its uncomputed tokens: a chunk of its prompt (chunked prefill), or the one token
// sampled last (decode); where that run reaches the last known token, the step's logits for it
// give the next token. So decode tokens and prefill chunks share a step, and a preempted
// sequence (its pages freed when the pool ran out) is recomputed the same way, prompt and
// generated tokens alike, and goes on where it stopped.
//
// Each step, in order:
//   1. every running sequence with one token to compute (decode), oldest first; where the pool
//      has no page for it, the newest running sequence is preempted (it goes back to the head
//      of the queue) until it fits;
//   2. running sequences still in their prompt, oldest first, a chunk each under the budget;
//   3. queued requests, first come first served, while the running cap, the step's token budget
//      and the pool allow: the head of the queue waits for room rather than being overtaken, so
//      no request starves.
// Host bookkeeping only (KvPages for the pages); the engine runs the step and reports back.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <unordered_map>
#include <vector>

#include "engine/kv_pages.h"

namespace llmk {

struct SchedulerConfig {
  int64_t max_running = 256;       // sequences holding pages at once
  int64_t max_step_tokens = 2048;  // tokens computed in one step (decode and prefill)
};

class Scheduler {
 public:
  using Id = KvPages::SeqId;

  // One sequence's part of a step: tokens [start, start + count) of its known tokens.
  struct Work {
    Id id;
    int64_t start, count;
    bool samples;  // the run ends at the last known token: its logits give the next token
  };
  struct Step {
    std::vector<Work> work;
    std::vector<KvPages::CopyOp> copies;  // to run on the pool before the step's writes
    std::vector<Id> preempted;            // sequences whose pages were freed this step
    int64_t tokens = 0;
  };
  struct Stats {
    int64_t queued = 0, running = 0, preemptions = 0;
  };

  Scheduler(KvPages& kv, const SchedulerConfig& cfg);

  // Queues a request (a new id) with its prompt (non-empty, at most what the pool holds).
  void add(Id id, std::vector<int32_t> prompt);
  // Forgets a queued or running request, freeing its pages now; false if unknown.
  bool abort(Id id);
  // The next step (empty when nothing is queued or running).
  Step schedule();
  // A new sequence `child` made from `parent` after a step: the parent's tokens with its token
  // sampled in that step replaced by `token`, sharing the parent's pages (the n samples of one
  // prompt).
  struct Fork {
    Id parent, child;
    int32_t token;
  };
  // After the step ran: its work is computed, and each sampling sequence got `sampled[i]` (in
  // the order of the step's sampling work); then `forks` start (running, after the others);
  // then the `finished` ids end (their pages freed: a fork keeps those it shares).
  void update(const Step& step, const std::vector<int32_t>& sampled,
              const std::vector<Id>& finished, const std::vector<Fork>& forks = {});

  bool idle() const { return queue_.empty() && running_.empty(); }
  // A sequence's known tokens (prompt and sampled), queued or running.
  const std::vector<int32_t>& tokens(Id id) const;
  Stats stats() const;

 private:
  struct Seq {
    std::vector<int32_t> tokens;
    int64_t computed = 0;
    int64_t in_pool = 0;  // tokens the pool holds pages for (computed, or scheduled now)
  };
  void preempt(Id id);

  KvPages& kv_;
  SchedulerConfig cfg_;
  std::unordered_map<Id, Seq> seqs_;
  std::deque<Id> queue_;
  std::vector<Id> running_;  // oldest first
  int64_t preemptions_ = 0;
};

}  // namespace llmk
