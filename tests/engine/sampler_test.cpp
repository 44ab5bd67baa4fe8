#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <span>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "engine/generator.h"
#include "engine/sampler_configs.h"
#include "ops/ops.h"

namespace llmk {
namespace {

TEST(Sampler, GreedyTakesTheLargestLogitAndLowestIdOnTies) {
  Sampler s(test::untruncated(0));
  EXPECT_EQ(s.sample(std::vector<float>{0.1f, 3.0f, -2.0f, 2.9f}, {}), 1);
  EXPECT_EQ(s.sample(std::vector<float>{1.0f, 5.0f, 5.0f}, {}), 1);
}

TEST(Sampler, SameSeedSameChoicesOtherSeedOtherChoices) {
  const std::vector<float> logits{0.0f, 0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f};
  auto draw = [&](uint64_t seed) {
    Sampler s(test::untruncated(1.0f, seed));
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(s.sample(logits, {}));
    return out;
  };
  EXPECT_EQ(draw(42), draw(42));
  EXPECT_NE(draw(42), draw(43));
}

TEST(Sampler, FrequenciesFollowTheSoftmaxAtTheTemperature) {
  const std::vector<float> logits{1.0f, 2.0f, 0.5f, -1.0f};
  const float temp = 0.7f;
  std::vector<double> p(logits.size());
  double sum = 0;
  for (size_t i = 0; i < p.size(); ++i) sum += p[i] = std::exp(logits[i] / temp);
  Sampler s(test::untruncated(temp, 7));
  std::vector<int> count(logits.size());
  const int n = 20000;
  for (int i = 0; i < n; ++i) count[static_cast<size_t>(s.sample(logits, {}))]++;
  for (size_t i = 0; i < p.size(); ++i) {
    // 20000 draws: the standard error of a frequency is at most 0.0036; allow ~4 of them.
    EXPECT_NEAR(count[i] / static_cast<double>(n), p[i] / sum, 0.015) << "token " << i;
  }
}

TEST(Sampler, TopKTopPAndMinPCutTheTail) {
  const std::vector<float> logits{3.0f, 2.9f, 0.0f, -1.0f, 2.8f};
  {
    SamplerConfig c = test::untruncated(1.0f);
    c.top_k = 2;
    Sampler s(c);
    for (int i = 0; i < 500; ++i) {
      const int32_t id = s.sample(logits, {});
      ASSERT_TRUE(id == 0 || id == 1) << id;
    }
  }
  {
    SamplerConfig c = test::untruncated(1.0f);
    c.top_p = 0.05f;  // the top token alone carries more than 5%
    Sampler s(c);
    for (int i = 0; i < 200; ++i) ASSERT_EQ(s.sample(logits, {}), 0);
  }
  {
    SamplerConfig c = test::untruncated(1.0f);
    c.min_p = 0.5f;  // p(2)/p(0) = e^-3 and p(3)/p(0) = e^-4 fall below one half
    Sampler s(c);
    std::map<int32_t, int> seen;
    for (int i = 0; i < 2000; ++i) seen[s.sample(logits, {})]++;
    EXPECT_EQ(seen.count(2), 0u);
    EXPECT_EQ(seen.count(3), 0u);
    EXPECT_GT(seen[0], 0);
    EXPECT_GT(seen[1], 0);
    EXPECT_GT(seen[4], 0);
  }
}

TEST(Sampler, RepeatPenaltyDemotesRecentTokens) {
  SamplerConfig c = test::untruncated(0);
  c.repeat_penalty = 1.5f;
  c.repeat_last_n = 2;
  Sampler s(c);
  const std::vector<float> logits{2.0f, 1.9f, -0.5f};
  EXPECT_EQ(s.sample(logits, std::vector<int32_t>{0}), 1);
  // Token 0 is outside the window of the last two tokens: no penalty.
  EXPECT_EQ(s.sample(logits, std::vector<int32_t>{0, 2, 2}), 0);
}

TEST(Sampler, PresenceAndFrequencyPenaltiesCountGeneratedTokensOnly) {
  // Logits 1.0, 0.5, 0.0; token 0 generated twice (and in the prompt, which does not count).
  const std::vector<float> logits{1.0f, 0.5f, 0.0f};
  const std::vector<int32_t> history{0, 0, 0, 1, 0, 0};  // prompt: the first three
  SamplerConfig c = test::untruncated(0);
  c.frequency_penalty = 0.3f;  // 1.0 - 0.6 = 0.4 against 0.5 - 0.3 = 0.2 and 0.0
  EXPECT_EQ(Sampler(c).sample(logits, history, 3), 0);
  c.frequency_penalty = 0.4f;  // 1.0 - 0.8 = 0.2 against 0.5 - 0.4 = 0.1 and 0.0
  EXPECT_EQ(Sampler(c).sample(logits, history, 3), 0);
  c.frequency_penalty = 0.6f;  // -0.2 against -0.1 and 0.0: the unseen token wins
  EXPECT_EQ(Sampler(c).sample(logits, history, 3), 2);
  EXPECT_EQ(Sampler(c).sample(logits, history, 6), 0);  // nothing generated yet: no penalty
  c.frequency_penalty = 0;
  c.presence_penalty = 0.7f;  // 0.3 and -0.2 against 0.0: token 0 still
  EXPECT_EQ(Sampler(c).sample(logits, history, 3), 0);
  c.presence_penalty = 1.1f;  // -0.1 and -0.6 against 0.0
  EXPECT_EQ(Sampler(c).sample(logits, history, 3), 2);
  c.presence_penalty = -2.0f;  // negative: seen tokens favoured
  EXPECT_EQ(Sampler(c).sample(std::vector<float>{0.0f, 0.5f, 2.0f}, history, 3), 1);
}

// sample_top on a row's largest logits (ops::topk_lse's ids and values, with some to spare)
// draws exactly what sample draws on the whole row, draw after draw: the engine's CUDA path
// moves only those candidates to the host. Rows with ties, several cuts and temperatures.
TEST(Sampler, TopCandidatesDrawWhatTheWholeRowDraws) {
  std::mt19937 rng(11);
  constexpr int64_t V = 300;
  Tensor row = Tensor::empty({1, V}, DType::F32);
  for (int64_t i = 0; i < V; ++i) row.data<float>()[i] = static_cast<float>(rng() % 61) / 10.0f;
  const std::span<const float> whole(row.data<float>(), V);
  int compared = 0;
  for (float temp : {0.5f, 1.0f, 1.7f}) {
    for (int top_k : {1, 5, 40, 300}) {
      for (float top_p : {1.0f, 0.9f}) {
        for (float min_p : {0.0f, 0.05f}) {
          SamplerConfig c;
          c.temperature = temp;
          c.top_k = top_k;
          c.top_p = top_p;
          c.min_p = min_p;
          c.seed = static_cast<uint64_t>(top_k) * 7 + 3;
          ASSERT_EQ(Sampler::top_candidates(c, 1024), top_k);
          const int64_t k = std::min<int64_t>(V, top_k + 7);
          Tensor ids = Tensor::empty({1, k}, DType::I32),
                 values = Tensor::empty({1, k}, DType::F32);
          Tensor lse = Tensor::empty({1}, DType::F32);
          ops::topk_lse(ids, values, lse, row);
          Sampler a(c), b(c);
          for (int d = 0; d < 40; ++d) {
            ASSERT_EQ(a.sample(whole, {}),
                      b.sample_top({values.data<float>(), static_cast<size_t>(k)},
                                   {ids.data<int32_t>(), static_cast<size_t>(k)}))
                << "temperature " << temp << " top_k " << top_k << " top_p " << top_p << " min_p "
                << min_p << " draw " << d;
            ++compared;
          }
        }
      }
    }
  }
  EXPECT_EQ(compared, 3 * 4 * 2 * 2 * 40);
  // Where the whole row is needed: greedy, no top-k, top-k over the bound, penalties.
  SamplerConfig c;
  c.temperature = 0.7f;
  c.top_k = 40;
  EXPECT_EQ(Sampler::top_candidates(c, 1024), 40);
  EXPECT_EQ(Sampler::top_candidates(c, 39), 0);
  c.frequency_penalty = 0.5f;
  EXPECT_EQ(Sampler::top_candidates(c, 1024), 0);
  c.frequency_penalty = 0;
  c.repeat_penalty = 1.1f;
  EXPECT_EQ(Sampler::top_candidates(c, 1024), 0);
  c.repeat_penalty = 1;
  c.top_k = 0;
  EXPECT_EQ(Sampler::top_candidates(c, 1024), 0);
  c.top_k = 40;
  c.temperature = 0;
  EXPECT_EQ(Sampler::top_candidates(c, 1024), 0);
}

TEST(Sampler, RejectsOutOfRangeSettings) {
  SamplerConfig c;
  c.top_p = 0;
  EXPECT_THROW(Sampler{c}, Error);
  c = SamplerConfig{};
  c.temperature = -1;
  EXPECT_THROW(Sampler{c}, Error);
  c = SamplerConfig{};
  c.min_p = 1.0f;
  EXPECT_THROW(Sampler{c}, Error);
  c = SamplerConfig{};
  c.repeat_penalty = 0;
  EXPECT_THROW(Sampler{c}, Error);
  c = SamplerConfig{};
  c.presence_penalty = 2.5f;
  EXPECT_THROW(Sampler{c}, Error);
  c = SamplerConfig{};
  c.frequency_penalty = -3.0f;
  EXPECT_THROW(Sampler{c}, Error);
}

TEST(Utf8Stream, HoldsBackIncompleteCharacters) {
  Utf8Stream s;
  EXPECT_EQ(s.push("ab"), "ab");
  EXPECT_EQ(s.push("\xc3"), "");  // first byte of é
  EXPECT_EQ(s.push("\xa9x"), "\xc3\xa9x");
  EXPECT_EQ(s.push("\xf0\x9f"), "");  // half of 🙂 (F0 9F 99 82)
  EXPECT_EQ(s.push("\x99"), "");
  EXPECT_EQ(s.push("\x82!"), "\xf0\x9f\x99\x82!");
  EXPECT_EQ(s.push("\xff"), "\xff");  // never valid: passes through
  EXPECT_EQ(s.push("\xe2\x82"), "");
  EXPECT_EQ(s.flush(), "\xe2\x82");  // end of stream: whatever is left
  EXPECT_EQ(s.flush(), "");
}

// Rows penalised by the op from Sampler::penalty_entries give the sampler the tokens it draws
// from the raw rows with the history (the engine's device path against its host path): greedy,
// and sampled with the same seed (the same random draws), over penalty settings and histories.
TEST(OpsApplyPenalties, SameTokensAsTheSamplersOwnPenalties) {
  std::mt19937 rng(21);
  std::uniform_real_distribution<float> logit(-4.0f, 4.0f);
  constexpr int64_t kRows = 40, kVocab = 50;
  Tensor x = Tensor::empty({kRows, kVocab}, DType::F32);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = logit(rng);
  const Tensor raw = x.to(Device::CPU);  // a copy
  std::vector<std::vector<int32_t>> history(kRows);
  std::vector<SamplerConfig> cfg(kRows);
  std::vector<int32_t> at;
  std::vector<float> by;
  std::vector<PenaltyEntry> entries;
  for (int64_t r = 0; r < kRows; ++r) {
    for (int k = 0; k < 5 + static_cast<int>(rng() % 40); ++k) {
      history[r].push_back(static_cast<int32_t>(rng() % (kVocab + 3)) - 1);  // some out of range
    }
    SamplerConfig& c = cfg[r];
    c.temperature = r % 2 == 0 ? 0.0f : 0.9f;
    c.top_k = 0;
    c.top_p = 1.0f;
    c.min_p = 0.0f;
    c.repeat_penalty = r % 3 == 0 ? 1.0f : 1.3f;
    c.repeat_last_n = static_cast<int>(r % 4) * 8;
    c.presence_penalty = r % 5 == 0 ? 0.0f : 0.7f;
    c.frequency_penalty = r % 7 == 0 ? 0.0f : -0.4f;
    c.seed = static_cast<uint64_t>(r);
    Sampler::penalty_entries(c, history[r], history[r].size() / 2, kVocab, entries);
    for (const PenaltyEntry& e : entries) {
      at.insert(at.end(), {static_cast<int32_t>(r), e.id});
      by.insert(by.end(), {e.rp, e.sub});
    }
  }
  const auto n = static_cast<int64_t>(by.size() / 2);
  ASSERT_GT(n, kRows);
  ops::apply_penalties(x, Tensor::borrow(at.data(), {n, 2}, DType::I32),
                       Tensor::borrow(by.data(), {n, 2}, DType::F32));
  int moved = 0;
  for (int64_t r = 0; r < kRows; ++r) {
    const std::span<const float> before(raw.data<float>() + r * kVocab, kVocab);
    const std::span<const float> after(x.data<float>() + r * kVocab, kVocab);
    for (int64_t i = 0; i < kVocab; ++i) moved += before[i] != after[i];
    Sampler host(cfg[r]), device(cfg[r]);
    for (int k = 0; k < 3; ++k) {
      EXPECT_EQ(device.sample(after, {}, 0), host.sample(before, history[r], history[r].size() / 2))
          << "row " << r << " draw " << k;
    }
  }
  EXPECT_GT(moved, kRows);
}

// Top-p alone from a row's 1024 largest logits and its log-sum-exp at the temperature
// (ops::topk_lse, as the engine reads it on CUDA): the token sample() draws from the whole row,
// with the same random draws; a flat row whose nucleus reaches past the candidates gives -1 and
// draws nothing, so the whole row's draw that follows is the one a fresh sampler makes.
TEST(Sampler, NucleusFromTheCandidatesDrawsWhatTheWholeRowDraws) {
  constexpr int64_t kVocab = 5000, kK = 1024;
  std::mt19937 rng(3);
  int compared = 0, fell_back = 0;
  for (int row = 0; row < 24; ++row) {
    // Peaked rows (a few hundred tokens carry the mass) and flat ones.
    const float spread = row % 3 == 2 ? 0.05f : 4.0f;
    std::normal_distribution<float> normal(0.0f, spread);
    std::vector<float> x(kVocab);
    for (float& v : x) v = normal(rng);
    SamplerConfig c =
        test::untruncated(0.6f + 0.2f * static_cast<float>(row % 4), static_cast<uint64_t>(row));
    c.top_p = row % 2 == 0 ? 0.9f : 0.5f;
    c.min_p = row % 5 == 0 ? 0.02f : 0.0f;
    ASSERT_TRUE(Sampler::nucleus(c, kVocab));
    Tensor ids = Tensor::empty({1, kK}, DType::I32), values = Tensor::empty({1, kK}, DType::F32);
    Tensor lse = Tensor::empty({1}, DType::F32);
    float scale = 1.0f / c.temperature;
    const Tensor s_t = Tensor::borrow(&scale, {1}, DType::F32);
    ops::topk_lse(ids, values, lse, Tensor::borrow(x.data(), {1, kVocab}, DType::F32), &s_t);
    const std::span<const float> v(values.data<float>(), kK);
    const std::span<const int32_t> id(ids.data<int32_t>(), kK);
    Sampler whole(c), top(c);
    for (int draw = 0; draw < 20; ++draw) {
      const int32_t want = whole.sample(x, {});
      const int32_t got = top.sample_nucleus(v, id, lse.data<float>()[0]);
      if (got < 0) {
        ++fell_back;
        EXPECT_EQ(top.sample(x, {}), want) << "row " << row << " draw " << draw;
      } else {
        EXPECT_EQ(got, want) << "row " << row << " draw " << draw;
        ++compared;
      }
    }
  }
  EXPECT_GT(compared, 200);
  EXPECT_GT(fell_back, 50);
}

}  // namespace
}  // namespace llmk
