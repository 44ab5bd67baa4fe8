#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "core/error.h"
#include "kernels/penalty.h"

namespace llmk {

void SamplerConfig::validate() const {
  LLMK_CHECK(std::isfinite(temperature) && temperature >= 0, "temperature {} must be >= 0",
             temperature);
  LLMK_CHECK(top_k >= 0, "top-k {} must be >= 0", top_k);
  LLMK_CHECK(top_p > 0 && top_p <= 1, "top-p {} must be in (0, 1]", top_p);
  LLMK_CHECK(min_p >= 0 && min_p < 1, "min-p {} must be in [0, 1)", min_p);
  LLMK_CHECK(std::isfinite(repeat_penalty) && repeat_penalty > 0, "repeat penalty {} must be > 0",
             repeat_penalty);
  LLMK_CHECK(repeat_last_n >= 0, "repeat-last-n {} must be >= 0", repeat_last_n);
  LLMK_CHECK(presence_penalty >= -2 && presence_penalty <= 2,
             "presence penalty {} must be in [-2, 2]", presence_penalty);
  LLMK_CHECK(frequency_penalty >= -2 && frequency_penalty <= 2,
             "frequency penalty {} must be in [-2, 2]", frequency_penalty);
}

Sampler::Sampler(const SamplerConfig& cfg) : cfg_(cfg) {
  cfg_.validate();
  // splitmix64 of the seed, so that nearby seeds start far apart.
  state_ = cfg.seed + 0x9e3779b97f4a7c15ull;
}

double Sampler::next_uniform() {
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> history,
                        size_t generated_from) {
  const auto n = static_cast<int32_t>(logits.size());
  LLMK_CHECK(n > 0, "sampler: empty logits");
  cand_.resize(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i)
    cand_[static_cast<size_t>(i)] = {logits[static_cast<size_t>(i)], i};

  penalty_entries(cfg_, history, generated_from, n, entries_);
  for (const PenaltyEntry& e : entries_) {
    float& l = cand_[static_cast<size_t>(e.id)].first;
    l = penalty::apply(l, e.rp, e.sub);
  }

  auto by_logit = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  if (cfg_.temperature <= 0.0f) {
    return std::min_element(cand_.begin(), cand_.end(), by_logit)->second;
  }

  size_t keep = cand_.size();
  if (cfg_.top_k > 0 && static_cast<size_t>(cfg_.top_k) < keep)
    keep = static_cast<size_t>(cfg_.top_k);
  std::partial_sort(cand_.begin(), cand_.begin() + static_cast<std::ptrdiff_t>(keep), cand_.end(),
                    by_logit);
  cand_.resize(keep);
  return draw();
}

void Sampler::penalty_entries(const SamplerConfig& c, std::span<const int32_t> history,
                              size_t generated_from, int32_t vocab,
                              std::vector<PenaltyEntry>& out) {
  out.clear();
  std::map<int32_t, PenaltyEntry> at;  // by id
  if (c.repeat_penalty != 1.0f && c.repeat_last_n > 0) {
    const size_t from = history.size() > static_cast<size_t>(c.repeat_last_n)
                            ? history.size() - static_cast<size_t>(c.repeat_last_n)
                            : 0;
    for (size_t i = from; i < history.size(); ++i)
      at[history[i]] = {history[i], c.repeat_penalty, 0};
  }
  if ((c.presence_penalty != 0.0f || c.frequency_penalty != 0.0f) &&
      generated_from < history.size()) {
    std::map<int32_t, int> count;
    for (size_t i = generated_from; i < history.size(); ++i) ++count[history[i]];
    for (const auto& [id, k] : count) {
      auto [it, fresh] = at.try_emplace(id, PenaltyEntry{id, 1.0f, 0});
      it->second.sub = penalty::subtracted(c.presence_penalty, c.frequency_penalty, k);
    }
  }
  for (const auto& [id, e] : at) {
    if (id >= 0 && id < vocab) out.push_back(e);
  }
}

int Sampler::top_candidates(const SamplerConfig& c, int max, bool penalized) {
  return c.temperature > 0.0f && c.top_k >= 1 && c.top_k <= max && (penalized || !c.penalties())
             ? c.top_k
             : 0;
}

int32_t Sampler::sample_top(std::span<const float> values, std::span<const int32_t> ids,
                            bool penalized) {
  LLMK_CHECK(top_candidates(cfg_, static_cast<int>(values.size()), penalized) > 0 &&
                 values.size() == ids.size(),
             "sampler: {} candidates for top-k {} (temperature {}, penalties off?)", values.size(),
             cfg_.top_k, cfg_.temperature);
  const auto keep = static_cast<size_t>(cfg_.top_k);
  cand_.resize(keep);
  for (size_t i = 0; i < keep; ++i) cand_[i] = {values[i], ids[i]};
  return draw();
}

int32_t Sampler::draw() {
  const size_t keep = cand_.size();
  // Softmax at the temperature, in double for a stable sum.
  const double max_logit = cand_[0].first;
  double sum = 0;
  p_.resize(keep);
  for (size_t i = 0; i < keep; ++i) {
    p_[i] = std::exp((static_cast<double>(cand_[i].first) - max_logit) / cfg_.temperature);
    sum += p_[i];
  }
  for (double& x : p_) x /= sum;
  return pick();
}

bool Sampler::nucleus(const SamplerConfig& c, int64_t vocab, bool penalized) {
  return c.temperature > 0.0f && c.top_p < 1.0f && (c.top_k == 0 || c.top_k >= vocab) &&
         (penalized || !c.penalties());
}

int32_t Sampler::sample_nucleus(std::span<const float> values, std::span<const int32_t> ids,
                                float lse_t) {
  LLMK_CHECK(cfg_.temperature > 0.0f && cfg_.top_p < 1.0f && !values.empty() &&
                 values.size() == ids.size(),
             "sampler: {} candidates for top-p {} at temperature {}", values.size(), cfg_.top_p,
             cfg_.temperature);
  if (!std::isfinite(lse_t)) return -1;
  const float scale = 1.0f / cfg_.temperature;  // as the engine passes topk_lse
  p_.resize(values.size());
  double mass = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    p_[i] = std::exp(static_cast<double>(values[i] * scale) - lse_t);
    mass += p_[i];
  }
  if (mass < cfg_.top_p) return -1;  // the nucleus reaches past the candidates
  cand_.resize(values.size());
  for (size_t i = 0; i < values.size(); ++i) cand_[i] = {values[i], ids[i]};
  return pick();
}

int32_t Sampler::pick() {
  const size_t keep = cand_.size();
  const std::vector<double>& p = p_;
  // top-p: the smallest prefix whose mass reaches top_p (at least one token).
  size_t cut = keep;
  if (cfg_.top_p < 1.0f) {
    double acc = 0;
    for (size_t i = 0; i < keep; ++i) {
      acc += p[i];
      if (acc >= cfg_.top_p) {
        cut = i + 1;
        break;
      }
    }
  }
  // min-p: drop tokens less likely than min_p times the most likely one.
  if (cfg_.min_p > 0.0f) {
    const double floor = cfg_.min_p * p[0];
    size_t m = 1;
    while (m < cut && p[m] >= floor) ++m;
    cut = m;
  }

  double mass = 0;
  for (size_t i = 0; i < cut; ++i) mass += p[i];
  double r = next_uniform() * mass;
  for (size_t i = 0; i < cut; ++i) {
    r -= p[i];
    if (r < 0) return cand_[i].second;
  }
  return cand_[cut - 1].second;
}

}  // namespace llmk
