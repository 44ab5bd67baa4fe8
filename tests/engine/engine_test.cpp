// The many-sequence engine on the CPU, on the family fixtures (tiny random-weight models): many
// requests at once, prompt chunks and decode tokens in the same forward, preemption and
// recompute, prefix hits; every request must give what it gives alone through generate().
#include "engine/engine.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

#include "core/error.h"
#include "engine/generator.h"
#include "engine/sampler_configs.h"
#include "model/model.h"
#include "test_paths.h"
#include "tokenizer/tokenizer.h"

namespace llmk {
namespace {

std::string fixture(const std::string& family) {
  return test::source_path("tests/fixtures/families/" + family);
}

std::vector<std::vector<int32_t>> prompts(uint32_t seed) {
  std::mt19937 rng(seed);
  const std::vector<int32_t> system = {1, 17, 300, 42, 7, 99, 250, 3, 8, 60, 61, 62, 5};
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < 10; ++i) {
    std::vector<int32_t> p(system.begin(), system.begin() + static_cast<long>(rng() % 14));
    for (int k = 1 + static_cast<int>(rng() % 30); k > 0; --k) {
      p.push_back(static_cast<int32_t>(rng() % 512));
    }
    out.push_back(std::move(p));
  }
  return out;
}

// Each prompt alone through generate(): greedy, or seeded sampling.
std::vector<std::vector<int32_t>> alone(const std::string& path,
                                        const std::vector<std::vector<int32_t>>& ps,
                                        const SamplerConfig& sampler, int max_tokens,
                                        KvType kv = KvType::Auto) {
  auto model = Model::load(path, {.context = 128, .kv_type = kv});
  const Tokenizer tok = load_tokenizer(*model, path);
  std::vector<std::vector<int32_t>> out;
  for (size_t i = 0; i < ps.size(); ++i) {
    GenerateOptions o;
    o.max_tokens = max_tokens;
    o.stop_at_eog = false;
    o.sampler = sampler;
    o.sampler.seed = sampler.seed + i;
    const GenerateStats st =
        generate(*model, tok, ps[i], o, [](int32_t, const std::string&) { return true; });
    out.push_back(st.sampled);
  }
  return out;
}

struct Setting {
  int64_t sequences, page_size, max_running, step_tokens;
};

std::vector<std::vector<int32_t>> batched(const std::string& path,
                                          const std::vector<std::vector<int32_t>>& ps,
                                          const SamplerConfig& sampler, int max_tokens,
                                          const Setting& s, Scheduler::Stats* sst = nullptr,
                                          KvPages::Stats* kst = nullptr, KvType kv = KvType::Auto) {
  auto model = Engine::load(path, 128, s.sequences, s.page_size, Device::CPU, 0, kv);
  Engine engine(*model, {.max_running = s.max_running, .max_step_tokens = s.step_tokens});
  std::map<int64_t, std::vector<int32_t>> got;
  std::map<int64_t, size_t> index;
  for (size_t i = 0; i < ps.size(); ++i) {
    RequestOptions o;
    o.max_tokens = max_tokens;
    o.sampler = sampler;
    o.sampler.seed = sampler.seed + i;
    const int64_t id = engine.add_request(ps[i], o, [&](const TokenEvent& e) {
      got[e.request].push_back(e.token);
      return true;
    });
    index[id] = i;
  }
  for (int n = 0; !engine.idle(); ++n) {
    engine.step();
    if (n > 10000) {
      ADD_FAILURE() << "no progress";
      break;
    }
  }
  if (sst) *sst = engine.scheduler_stats();
  if (kst) *kst = engine.kv_stats();
  std::vector<std::vector<int32_t>> out(ps.size());
  for (const auto& [id, toks] : got) out[index.at(id)] = toks;
  return out;
}

TEST(Engine, GreedyRequestsTogetherMatchGenerateAlone) {
  SamplerConfig greedy;
  greedy.temperature = 0;
  for (const std::string family : {"llama3", "gemma3"}) {
    const auto ps = prompts(1);
    const auto want = alone(fixture(family), ps, greedy, 12);
    for (const Setting& s : {Setting{16, 16, 16, 512},  // all at once, whole prompts
                             Setting{1, 4, 8, 16},      // chunks of 16, a 128-token pool
                             Setting{4, 1, 3, 7}}) {    // one-token pages, 3 in flight
      Scheduler::Stats sst;
      KvPages::Stats kst;
      const auto got = batched(fixture(family), ps, greedy, 12, s, &sst, &kst);
      for (size_t i = 0; i < ps.size(); ++i) {
        EXPECT_EQ(got[i], want[i]) << family << " prompt " << i << ", pages of " << s.page_size
                                   << ", " << s.step_tokens << " tokens a step";
      }
      EXPECT_EQ(kst.in_use, 0);
      if (s.sequences == 1) {
        EXPECT_GT(sst.preemptions, 0) << family;
      }
      if (s.max_running == 3) {  // later requests find the shared prefix computed
        EXPECT_GT(kst.prefix_hit_tokens, 0) << family;
      }
    }
  }
}

// An 8-bit KV cache changes the numbers, not the engine's invariance: each request of a batch
// (chunked, preempted, one-token pages) gives what generate() gives it alone on the same cache.
TEST(Engine, EightBitKvRequestsTogetherMatchGenerateAlone) {
  SamplerConfig greedy;
  greedy.temperature = 0;
  for (const KvType kv : {KvType::FP8, KvType::INT8}) {
    for (const std::string family : {"llama3", "gemma3"}) {
      const auto ps = prompts(4);
      const auto want = alone(fixture(family), ps, greedy, 12, kv);
      for (const Setting& s :
           {Setting{16, 16, 16, 512}, Setting{1, 4, 8, 16}, Setting{4, 1, 3, 7}}) {
        KvPages::Stats kst;
        const auto got = batched(fixture(family), ps, greedy, 12, s, nullptr, &kst, kv);
        for (size_t i = 0; i < ps.size(); ++i) {
          EXPECT_EQ(got[i], want[i]) << kv_type_name(kv) << " " << family << " prompt " << i
                                     << ", pages of " << s.page_size;
        }
        EXPECT_EQ(kst.in_use, 0);
      }
    }
  }
}

TEST(Engine, SeededSamplingDoesNotDependOnTheBatch) {
  const SamplerConfig s = test::untruncated(1.2f, 1234);
  const auto ps = prompts(2);
  const std::string path = fixture("qwen2");
  const auto together = batched(path, ps, s, 10, {8, 4, 10, 24});
  for (size_t i = 0; i < ps.size(); ++i) {
    const auto single =
        batched(path, {ps[i]}, test::untruncated(1.2f, 1234 + i), 10, {2, 4, 1, 512});
    EXPECT_EQ(together[i], single[0]) << "prompt " << i;
  }
  // And generate() alone gives the same draws.
  EXPECT_EQ(together, alone(path, ps, s, 10));
}

TEST(Engine, NSamplesShareThePromptAndDrawAsSeparateRequests) {
  // Sample k of an n-sample request draws as a single request with seed + k does.
  const std::string path = fixture("gemma3");
  const std::vector<int32_t> prompt = prompts(3)[4];
  std::vector<std::vector<int32_t>> single;
  for (uint64_t k = 0; k < 5; ++k) {
    single.push_back(
        batched(path, {prompt}, test::untruncated(1.0f, 77 + k), 9, {2, 4, 1, 512})[0]);
  }
  EXPECT_NE(single[0], single[1]);
  RequestOptions o;
  o.sampler = test::untruncated(1.0f, 77);
  o.max_tokens = 9;
  o.n = 5;
  // A pool of 4 x 128 tokens, and of 64 (the samples preempt each other and are recomputed).
  for (const int64_t sequences : {4, 1}) {
    auto model = Engine::load(path, sequences == 1 ? 64 : 128, sequences, 4);
    Engine engine(*model, {.max_running = 8, .max_step_tokens = 32});
    std::map<int, std::vector<int32_t>> got;
    int64_t shared = 0;
    engine.add_request(prompt, o, [&](const TokenEvent& e) {
      got[e.sample].push_back(e.token);
      return true;
    });
    // A second request beside it, so the forks run among others.
    engine.add_request(prompts(3)[1], {.sampler = test::untruncated(1.0f, 77), .max_tokens = 6},
                       nullptr);
    while (!engine.idle()) {
      engine.step();
      shared = std::max(shared, engine.kv_stats().shared);
    }
    EXPECT_GT(shared, 0);  // the prompt's pages, held by every sample
    if (sequences == 1) {
      EXPECT_GT(engine.scheduler_stats().preemptions, 0);
    }
    ASSERT_EQ(got.size(), 5u);
    for (int k = 0; k < 5; ++k) EXPECT_EQ(got[k], single[static_cast<size_t>(k)]) << "sample " << k;
  }
  auto model = Engine::load(path, 128, 1, 4);
  Engine engine(*model, {.max_running = 8, .max_step_tokens = 32});
  o.n = 9;
  EXPECT_THROW(engine.add_request(prompt, o, nullptr), Error);  // more than the running cap
}

TEST(Engine, LogprobsAreTheModelsDistribution) {
  // Each token's logprob and its top 5, against log_softmax of the logits the plain forward gives
  // the same tokens (in double).
  const std::string path = fixture("llama3");
  const std::vector<int32_t> prompt = prompts(4)[2];
  auto model = Engine::load(path, 128, 2, 4);
  Engine engine(*model, {.max_running = 4, .max_step_tokens = 7});
  RequestOptions o;
  o.sampler.temperature = 0.7f;
  o.sampler.seed = 3;
  o.max_tokens = 4;
  o.logprobs = true;
  o.top_logprobs = 5;
  std::vector<TokenEvent> events;
  engine.add_request(prompt, o, [&](const TokenEvent& e) {
    events.push_back(e);
    return true;
  });
  while (!engine.idle()) engine.step();
  ASSERT_EQ(events.size(), 4u);
  auto plain = Model::load(path, {.context = 128});
  std::vector<int32_t> seq = prompt;
  for (const TokenEvent& e : events) {
    const Tensor logits = plain->forward(seq, 0, false);
    const float* row = logits.data<float>();
    const int64_t V = logits.dim(1);
    double m = row[0], sum = 0;
    for (int64_t i = 0; i < V; ++i) m = std::max(m, static_cast<double>(row[i]));
    for (int64_t i = 0; i < V; ++i) sum += std::exp(row[i] - m);
    const double lse = m + std::log(sum);
    EXPECT_NEAR(e.logprob, row[e.token] - lse, 1e-4);
    ASSERT_EQ(e.top.size(), 5u);
    for (size_t k = 0; k < 5; ++k) {
      EXPECT_NEAR(e.top[k].second, row[e.top[k].first] - lse, 1e-4);
      if (k > 0) {
        EXPECT_GE(e.top[k - 1].second, e.top[k].second);
      }
    }
    int64_t above = 0;  // tokens more likely than the fifth: exactly four
    for (int64_t i = 0; i < V; ++i) above += row[i] - lse > e.top[4].second + 1e-6 ? 1 : 0;
    EXPECT_EQ(above, 4);
    seq.push_back(e.token);
  }
  o.top_logprobs = 21;
  EXPECT_THROW(engine.add_request(prompt, o, nullptr), Error);
  o.logprobs = false;
  o.top_logprobs = 3;
  EXPECT_THROW(engine.add_request(prompt, o, nullptr), Error);  // top_logprobs needs logprobs
}

TEST(Engine, StopsAbortsAndRefuses) {
  const std::string path = fixture("llama3");
  auto model = Engine::load(path, 64, 2, 8);
  Engine engine(*model, {.max_running = 4, .max_step_tokens = 64});
  SamplerConfig greedy;
  greedy.temperature = 0;
  // The greedy continuation's second token as a stop id: the request ends there, with Stop.
  std::vector<int32_t> first;
  RequestOptions o;
  o.sampler = greedy;
  o.max_tokens = 5;
  engine.add_request({5, 6, 7}, o, [&](const TokenEvent& e) {
    first.push_back(e.token);
    return true;
  });
  while (!engine.idle()) engine.step();
  ASSERT_EQ(first.size(), 5u);
  o.stop_ids = {first[1]};
  std::vector<std::pair<int32_t, Finish>> got;
  engine.add_request({5, 6, 7}, o, [&](const TokenEvent& e) {
    got.emplace_back(e.token, e.finish);
    return true;
  });
  while (!engine.idle()) engine.step();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[1].second, Finish::Stop);
  EXPECT_EQ(got[0].second, Finish::None);
  // Abort from a callback, mid-run: no more tokens, pages freed.
  int calls = 0;
  RequestOptions longer;
  longer.sampler = greedy;
  longer.max_tokens = 50;
  int64_t id = -1;
  id = engine.add_request({1, 2, 3}, longer, [&](const TokenEvent&) {
    if (++calls == 3) engine.abort(id);
    return true;
  });
  while (!engine.idle()) engine.step();
  EXPECT_EQ(calls, 3);
  // A callback returning false ends its sample there.
  calls = 0;
  engine.add_request({1, 2, 3}, longer, [&](const TokenEvent&) { return ++calls < 4; });
  while (!engine.idle()) engine.step();
  EXPECT_EQ(calls, 4);
  EXPECT_EQ(engine.kv_stats().in_use, 0);
  // The context ends a request with Length.
  Finish last = Finish::None;
  int n = 0;
  engine.add_request(std::vector<int32_t>(60, 4), longer, [&](const TokenEvent& e) {
    last = e.finish;
    ++n;
    return true;
  });
  while (!engine.idle()) engine.step();
  EXPECT_EQ(last, Finish::Length);
  EXPECT_EQ(n, 5);  // computed at positions 60..63, the fifth at 64 is past the context
  EXPECT_THROW(engine.add_request({}, longer, nullptr), Error);
  EXPECT_THROW(engine.add_request({512}, longer, nullptr), Error);
  EXPECT_THROW(engine.add_request(std::vector<int32_t>(65, 1), longer, nullptr), Error);
}

// A decode step padded for a captured graph (Model::Padding): the real rows' logits are those of
// the step unpadded; the padding writes only the scratch page, which the engine's pages never are.
TEST(Engine, PaddedStepGivesTheUnpaddedRows) {
  for (const std::string family : {"llama3", "gemma3"}) {
    SCOPED_TRACE(family);
    auto model = Engine::load(fixture(family), 64, 3, 4);
    ASSERT_EQ(model->kv_scratch_page(), model->kv_pages());  // the page past the engine's
    const std::vector<std::vector<int32_t>> pages = {{0, 1, 2}, {5, 3}, {4}};
    const std::vector<std::vector<int32_t>> ps = {{3, 9, 27, 81, 243, 1, 2, 4, 8}, {7, 7, 1}, {2}};
    std::vector<Model::Run> prompts;
    for (size_t r = 0; r < ps.size(); ++r) {
      prompts.push_back({.tokens = ps[r], .pos = 0, .pages = pages[r], .logits = true});
    }
    model->stage_runs(prompts);
    model->compute(13, false);
    const std::vector<int32_t> next = {11, 12, 13};
    std::vector<Model::Run> step;
    for (size_t r = 0; r < ps.size(); ++r) {
      step.push_back({.tokens = std::span<const int32_t>(next).subspan(r, 1),
                      .pos = static_cast<int64_t>(ps[r].size()),
                      .pages = pages[r],
                      .logits = true});
    }
    model->stage_runs(step);
    const Tensor plain = model->compute(3, false);
    const std::vector<float> want(plain.data<float>(), plain.data<float>() + plain.numel());
    model->stage_runs(step, {.rows = 8, .width = 16});
    const Tensor padded = model->compute(8, false);
    ASSERT_EQ(padded.dim(0), 8);
    ASSERT_EQ(padded.dim(1), plain.dim(1));
    // Within f32 rounding (the CPU's GEMM splits 8 rows differently from 3: measured 1.7e-6 at
    // most, of logits up to 3.4); a padding row read as a key, or a key row it overwrote, moves a
    // logit by far more.
    double worst = 0, big = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      worst = std::max(worst, std::abs(static_cast<double>(padded.data<float>()[i]) - want[i]));
      big = std::max(big, std::abs(static_cast<double>(want[i])));
    }
    EXPECT_LE(worst, 1e-5 * big);
    // The unpadded step again: the padded one changed nothing the sequences read.
    model->stage_runs(step);
    const Tensor again = model->compute(3, false);
    for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(again.data<float>()[i], want[i]);
    // Only one-token runs with logits, within the rows and the width.
    EXPECT_THROW(model->stage_runs(prompts, {.rows = 8, .width = 16}), Error);
    EXPECT_THROW(model->stage_runs(step, {.rows = 2, .width = 16}), Error);
    EXPECT_THROW(model->stage_runs(step, {.rows = 8, .width = 2}), Error);
  }
  auto bare = Model::load(fixture("llama3"), {.context = 64, .sequences = 2, .page_size = 4});
  EXPECT_EQ(bare->kv_scratch_page(), -1);
  const std::vector<int32_t> one = {1}, page = {0};
  const Model::Run run{.tokens = one, .pos = 0, .pages = page, .logits = true};
  EXPECT_THROW(bare->stage_runs(std::span<const Model::Run>(&run, 1), {.rows = 2, .width = 1}),
               Error);
}

}  // namespace
}  // namespace llmk
