// Awkward logits for the topk_lse tests (tests/kernels/topk_test.cpp against a sorted reference,
// tests/gpu/topk_test.cpp against the CPU kernel): widths of 1 and 32003, k from 1 to the whole
// row or 1024, rows drawn from five values (ties straddling the k-th place), mostly or all -inf,
// signed zeros, NaN and +inf, and row strides past the width, aligned to 16 bytes or not.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace llmk::test {

enum class TopkFill {
  Uniform,       // uniform in [-8, 8)
  FiveValues,    // one of -2.5, -1, 0, 0.5, 3: long runs of ties
  MostlyNegInf,  // 70% -inf, the rest uniform in [-4, 4)
  AllNegInf,     // every logit -inf
  SignedZeros,   // one of -0.0, +0.0, -1, 1
  NonFinite,     // uniform, with NaNs (both signs, a payload) and +inf in some rows
};

struct TopkCase {
  int64_t rows, vocab, ld;
  int k;
  TopkFill fill;

  std::string label() const {
    static const char* const names[] = {"uniform",  "five-values",  "mostly--inf",
                                        "all--inf", "signed-zeros", "non-finite"};
    return std::string(names[static_cast<int>(fill)]) + " rows=" + std::to_string(rows) +
           " vocab=" + std::to_string(vocab) + " ld=" + std::to_string(ld) +
           " k=" + std::to_string(k);
  }
};

// Padding past each row's vocab logits: larger than any finite logit of the cases, so a kernel
// that read past the row would put it in the top k and in the log-sum-exp.
inline constexpr float kTopkPadding = 3e38f;

inline std::vector<TopkCase> topk_cases() {
  using F = TopkFill;
  std::vector<TopkCase> cases = {
      {3, 1, 1, 1, F::Uniform},        {3, 1, 4, 1, F::Uniform},
      {2, 17, 20, 17, F::Uniform},     {2, 1000, 1000, 1000, F::FiveValues},
      {2, 50, 53, 10, F::AllNegInf},   {1, 50, 50, 50, F::AllNegInf},
      {2, 64, 67, 20, F::SignedZeros}, {3, 100, 104, 1, F::NonFinite},
      {3, 100, 103, 16, F::NonFinite},
  };
  for (int k : {1, 7, 64, 1024}) {
    cases.push_back({3, 32003, 32006, k, F::Uniform});  // ld odd: element-by-element loads
    cases.push_back({3, 32003, 32008, k, F::Uniform});  // ld a multiple of 4: 16-byte loads
  }
  for (int k : {1, 7, 64, 1000, 1024}) cases.push_back({3, 4099, 4104, k, F::FiveValues});
  for (int k : {1, 64, 200}) cases.push_back({3, 300, 303, k, F::MostlyNegInf});
  return cases;
}

// rows * ld floats for c; each row's ld - vocab padding is kTopkPadding.
inline std::vector<float> topk_logits(const TopkCase& c, uint32_t seed) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-8.0f, 8.0f);
  std::uniform_int_distribution<int> pick(0, 99);
  std::vector<float> x(static_cast<size_t>(c.rows * c.ld), kTopkPadding);
  for (int64_t r = 0; r < c.rows; ++r) {
    float* row = x.data() + r * c.ld;
    for (int64_t i = 0; i < c.vocab; ++i) {
      float& v = row[i];
      switch (c.fill) {
        case TopkFill::Uniform:
        case TopkFill::NonFinite:
          v = uniform(rng);
          break;
        case TopkFill::FiveValues: {
          static constexpr float kFive[] = {-2.5f, -1.0f, 0.0f, 0.5f, 3.0f};
          v = kFive[pick(rng) % 5];
          break;
        }
        case TopkFill::MostlyNegInf:
          v = pick(rng) < 70 ? -kInf : uniform(rng) / 2;
          break;
        case TopkFill::AllNegInf:
          v = -kInf;
          break;
        case TopkFill::SignedZeros: {
          static constexpr float kZeros[] = {-0.0f, 0.0f, -1.0f, 1.0f};
          v = kZeros[pick(rng) % 4];
          break;
        }
      }
    }
    if (c.fill == TopkFill::NonFinite && c.vocab >= 8) {
      const float nan = std::numeric_limits<float>::quiet_NaN();
      const float neg_nan = std::bit_cast<float>(0xFFC00000u);
      const float payload_nan = std::bit_cast<float>(0x7FC00123u);
      if (r % 3 == 0) {  // NaNs of both signs and a +inf
        row[c.vocab - 1] = neg_nan;
        row[c.vocab / 2] = payload_nan;
        row[3] = kInf;
      } else if (r % 3 == 1) {  // two +inf and some -inf
        row[c.vocab - 2] = row[5] = kInf;
        row[0] = row[1] = row[7] = -kInf;
      } else {  // one NaN
        row[2] = nan;
      }
    }
  }
  return x;
}

}  // namespace llmk::test
