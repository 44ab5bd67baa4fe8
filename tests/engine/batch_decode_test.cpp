// Batched decoding: several sequences of different lengths, each with its own KV cache region,
// stepped together (one token each per step) must give each sequence the greedy continuation it
// gets alone: transformers' continuations from the SmolLM2 fixture.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/generator.h"
#include "model/model.h"
#include "test_paths.h"

namespace llmk {
namespace {

TEST(BatchDecode, EachSequenceGetsItsOwnGreedyContinuation) {
  std::ifstream in(test::source_path("tests/fixtures/smollm2_reference.json"));
  ASSERT_TRUE(in.good());
  nlohmann::json ref;
  in >> ref;
  const auto& cases = ref.at("cases");
  const std::vector<size_t> pick = {0, 2, 5, 3};  // prompts of 5 to 31 tokens
  auto model = Model::load(test::smollm2_path(),
                           {.context = 128, .sequences = static_cast<int64_t>(pick.size())});
  SamplerConfig greedy;
  greedy.temperature = 0;
  Decoder dec(*model, greedy, /*cuda_graph=*/true);
  std::vector<int32_t> next(pick.size());
  std::vector<int64_t> pos(pick.size());
  std::vector<std::vector<int32_t>> got(pick.size());
  for (size_t b = 0; b < pick.size(); ++b) {
    const auto prompt = cases[pick[b]].at("ids").get<std::vector<int32_t>>();
    next[b] = dec.prefill(prompt, 0, static_cast<int64_t>(b));
    pos[b] = static_cast<int64_t>(prompt.size());
    got[b].push_back(next[b]);
  }
  for (int step = 1; step < 32; ++step) {
    next = dec.step_batch(next, pos);
    for (size_t b = 0; b < pick.size(); ++b) {
      got[b].push_back(next[b]);
      ++pos[b];
    }
  }
  for (size_t b = 0; b < pick.size(); ++b) {
    EXPECT_EQ(got[b], cases[pick[b]].at("continuation").get<std::vector<int32_t>>())
        << "sequence " << b << ": " << cases[pick[b]].at("text");
  }
}

TEST(BatchDecode, RejectsStepsBeyondTheSequencesLoaded) {
  auto model = Model::load(test::smollm2_path(), {.context = 16, .sequences = 2});
  // Token ids of no particular text: any ids below the vocabulary do; what is refused is the
  // number of sequences (3 of 2) and a position past the context (16 of 16).
  const std::vector<int32_t> three = {1, 2, 3};
  const std::vector<int64_t> pos = {0, 0, 0};
  EXPECT_THROW(model->stage_step(three, pos), Error);
  const std::vector<int32_t> two = {1, 2};
  const std::vector<int64_t> far = {0, 16};
  EXPECT_THROW(model->stage_step(two, far), Error);
  EXPECT_THROW(model->stage(two, 0, 2), Error);
}

}  // namespace
}  // namespace llmk
