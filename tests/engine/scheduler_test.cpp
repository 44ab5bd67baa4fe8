// Scheduler over KvPages with a stand-in model on a simulated pool: each step writes its work's
// tokens into the pool rows the page tables name (after the step's copies) and "attends" by
// reading back every row of the sequence up to its run; the token it samples is a hash of what
// it read. A sequence's outputs therefore depend on nothing but its own tokens, exactly when
// the pages hold them: run among others, chunked, preempted, recomputed or hitting cached
// prefixes, every request must produce what it produces alone.
#include "engine/scheduler.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <vector>

#include "core/error.h"

namespace llmk {
namespace {

struct Request {
  std::vector<int32_t> prompt;
  int64_t max_tokens;
};

class Harness {
 public:
  Harness(int64_t pages, int64_t page_size, const SchedulerConfig& cfg)
      : kv(pages, page_size),
        sched(kv, cfg),
        cfg_(cfg),
        pool_(static_cast<size_t>(pages * page_size), -1),
        page_size_(page_size) {}

  // Runs every request to its max_tokens; returns each one's sampled tokens.
  std::map<int64_t, std::vector<int32_t>> run(const std::vector<Request>& reqs,
                                              int64_t arrive_every = 0) {
    std::map<int64_t, std::vector<int32_t>> out;
    size_t next = 0;
    int64_t step_no = 0;
    std::vector<int64_t> admitted_order;
    std::set<int64_t> seen;
    while (next < reqs.size() || !sched.idle()) {
      // Arrivals: all at once, or one every `arrive_every` steps.
      while (next < reqs.size() && (arrive_every == 0 || step_no % arrive_every == 0)) {
        sched.add(static_cast<int64_t>(next), reqs[next].prompt);
        ++next;
        if (arrive_every != 0) break;
      }
      const Scheduler::Step st = sched.schedule();
      ++step_no;
      EXPECT_LE(st.tokens, cfg_.max_step_tokens);
      EXPECT_LE(sched.stats().running, cfg_.max_running);
      EXPECT_LT(step_no, 100000) << "no progress";
      if (step_no >= 100000) break;
      for (const auto& c : st.copies) {
        for (int64_t r = 0; r < c.rows; ++r) {
          pool_[static_cast<size_t>(c.dst * page_size_ + r)] =
              pool_[static_cast<size_t>(c.src * page_size_ + r)];
        }
      }
      std::vector<int32_t> sampled;
      std::vector<int64_t> finished;
      std::set<int64_t> in_step;
      for (const auto& w : st.work) {
        EXPECT_TRUE(in_step.insert(w.id).second) << "sequence " << w.id << " twice in a step";
        if (seen.insert(w.id).second) admitted_order.push_back(w.id);
        const std::vector<int32_t>& t = sched.tokens(w.id);
        if (w.start + w.count > static_cast<int64_t>(t.size()) ||
            w.samples != (w.start + w.count == static_cast<int64_t>(t.size()))) {
          ADD_FAILURE() << "sequence " << w.id << ": run " << w.start << "+" << w.count << " of "
                        << t.size() << " tokens, samples " << w.samples;
          return out;
        }
        for (int64_t i = w.start; i < w.start + w.count; ++i) row(w.id, i) = t[i];
        if (!w.samples) continue;
        uint64_t h = 1469598103934665603ull;  // FNV-1a over every row the sequence reads
        for (int64_t i = 0; i < w.start + w.count; ++i) {
          h = (h ^ static_cast<uint32_t>(row(w.id, i))) * 1099511628211ull;
        }
        sampled.push_back(static_cast<int32_t>(h % 5));
        const auto generated = static_cast<int64_t>(t.size()) + 1 -
                               static_cast<int64_t>(reqs[static_cast<size_t>(w.id)].prompt.size());
        if (generated == reqs[static_cast<size_t>(w.id)].max_tokens) {
          finished.push_back(w.id);
          out[w.id].assign(
              t.begin() + static_cast<long>(reqs[static_cast<size_t>(w.id)].prompt.size()),
              t.end());
          out[w.id].push_back(sampled.back());
        }
      }
      sched.update(st, sampled, finished);
    }
    // First come first served: sequences start in arrival order.
    for (size_t i = 0; i < admitted_order.size(); ++i) {
      EXPECT_EQ(admitted_order[i], static_cast<int64_t>(i));
    }
    return out;
  }

  KvPages kv;
  Scheduler sched;

 private:
  int32_t& row(int64_t id, int64_t i) {
    const int32_t page = kv.page_table(id)[static_cast<size_t>(i / page_size_)];
    return pool_[static_cast<size_t>(page * page_size_ + i % page_size_)];
  }
  SchedulerConfig cfg_;
  std::vector<int32_t> pool_;
  int64_t page_size_;
};

std::vector<Request> random_requests(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  const std::vector<int32_t> system = {4, 1, 3, 3, 0, 2, 4, 1, 1, 0, 3};  // a shared prefix
  std::vector<Request> reqs;
  for (int i = 0; i < n; ++i) {
    Request r;
    r.prompt.assign(system.begin(), system.begin() + static_cast<long>(rng() % system.size()));
    for (int k = 1 + static_cast<int>(rng() % 20); k > 0; --k) {
      r.prompt.push_back(static_cast<int32_t>(rng() % 5));
    }
    r.max_tokens = 1 + static_cast<int64_t>(rng() % 24);
    reqs.push_back(std::move(r));
  }
  return reqs;
}

TEST(Scheduler, EveryRequestGetsWhatItGetsAlone) {
  const std::vector<Request> reqs = random_requests(60, 1);
  // Alone: one request at a time, a pool as large as it needs, no chunking.
  std::map<int64_t, std::vector<int32_t>> alone;
  for (size_t i = 0; i < reqs.size(); ++i) {
    Harness h(64, 4, {.max_running = 1, .max_step_tokens = 1000});
    const auto one = h.run({reqs[i]});
    alone[static_cast<int64_t>(i)] = one.at(0);
  }
  struct Setting {
    int64_t pages, page_size, running, budget, arrive_every;
  };
  for (const Setting& s : {Setting{400, 4, 64, 512, 0},  // room for all
                           Setting{24, 4, 16, 32, 0},    // short of pages: preemptions
                           Setting{12, 5, 8, 7, 2},      // chunks of at most 7, staggered
                           Setting{60, 1, 64, 3, 1}}) {
    Harness h(s.pages, s.page_size, {.max_running = s.running, .max_step_tokens = s.budget});
    const auto got = h.run(reqs, s.arrive_every);
    for (size_t i = 0; i < reqs.size(); ++i) {
      ASSERT_EQ(got.at(static_cast<int64_t>(i)), alone.at(static_cast<int64_t>(i)))
          << "request " << i << ", pages " << s.pages << " of " << s.page_size << ", budget "
          << s.budget;
    }
    EXPECT_TRUE(h.sched.idle());
    const auto kst = h.kv.stats();
    EXPECT_EQ(kst.in_use, 0);
    if (s.pages == 24) {
      EXPECT_GT(h.sched.stats().preemptions, 0);
    }
    if (s.pages == 400) {
      EXPECT_GT(kst.prefix_hit_tokens, 0);
      EXPECT_EQ(h.sched.stats().preemptions, 0);
    }
  }
}

TEST(Scheduler, BudgetMixesDecodeAndPrefillChunks) {
  KvPages kv(64, 4);
  Scheduler s(kv, {.max_running = 8, .max_step_tokens = 10});
  s.add(0, std::vector<int32_t>(3, 1));
  Scheduler::Step st = s.schedule();
  ASSERT_EQ(st.work.size(), 1u);
  EXPECT_TRUE(st.work[0].samples);
  s.update(st, {7}, {});
  s.add(1, std::vector<int32_t>(25, 2));  // a long prompt: chunks of what the decode leaves
  st = s.schedule();
  ASSERT_EQ(st.work.size(), 2u);
  EXPECT_EQ(st.work[0].id, 0);  // decode first
  EXPECT_EQ(st.work[0].count, 1);
  EXPECT_EQ(st.work[1].id, 1);
  EXPECT_EQ(st.work[1].count, 9);
  EXPECT_FALSE(st.work[1].samples);
  s.update(st, {8}, {});
  st = s.schedule();
  ASSERT_EQ(st.work.size(), 2u);
  EXPECT_EQ(st.work[1].start, 9);
  EXPECT_EQ(st.work[1].count, 9);
  s.update(st, {9}, {});
  st = s.schedule();
  EXPECT_EQ(st.work[1].count, 7);
  EXPECT_TRUE(st.work[1].samples);
  EXPECT_EQ(st.tokens, 8);
  s.update(st, {1, 2}, {0});
  EXPECT_EQ(s.stats().running, 1);
  EXPECT_TRUE(s.abort(1));
  EXPECT_FALSE(s.abort(1));
  EXPECT_TRUE(s.idle());
  EXPECT_EQ(kv.stats().in_use, 0);
}

TEST(Scheduler, CapsAndBadUse) {
  KvPages kv(4, 2);
  Scheduler s(kv, {.max_running = 2, .max_step_tokens = 100});
  for (int64_t i = 0; i < 4; ++i) s.add(i, {1, 2});
  Scheduler::Step st = s.schedule();
  EXPECT_EQ(st.work.size(), 2u);  // the running cap
  EXPECT_EQ(s.stats().queued, 2);
  EXPECT_TRUE(s.abort(3));  // a queued one
  EXPECT_THROW(s.add(0, {1}), Error);
  EXPECT_THROW(s.add(9, {}), Error);
  EXPECT_THROW(s.add(9, std::vector<int32_t>(9, 1)), Error);  // 5 pages: more than the pool
  EXPECT_THROW(s.update(st, {1}, {}), Error);                 // two sampling sequences
  EXPECT_THROW(Scheduler(kv, {.max_running = 0}), Error);
}

}  // namespace
}  // namespace llmk
