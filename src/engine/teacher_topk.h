// A teacher model's top-k logits over a dataset of token sequences, for offline distillation:
// each sequence runs from position 0 through the model in chunks of positions (each chunk one
// batched forward with the logits of every position), and each position's k largest logits (ids
// and values, descending) and the log-sum-exp of its whole row go to a safetensors file:
//   "offsets" I64 [S + 1]   sequence s holds rows offsets[s] .. offsets[s+1]-1
//   "ids"     I32 [P, k]    P = every position of every sequence
//   "values"  F32 [P, k]    raw logits (no temperature)
//   "lse"     F32 [P]       log sum exp of the row: exp(values - lse) are the k probabilities
//   "tokens"  I32 [P]       the input token at each position (row i predicts token i + 1)
// with "__metadata__" {"format": "llmk-teacher-topk", "version": "1", "k", "model",
// "vocab_size"}. Rows are written as they are computed, so a dataset larger than memory works.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace llmk {

class Model;

struct TeacherTopkOptions {
  int k = 32;
  int64_t chunk = 512;  // positions per forward (bounds the [chunk, vocab] f32 logits buffer)
  // Called after each sequence with the sequences and positions done so far.
  std::function<void(int64_t sequences_done, int64_t positions_done)> progress;
};

struct TeacherTopkStats {
  int64_t sequences = 0, positions = 0;
  double seconds = 0;
};

// Checks every sequence first (non-empty, at most the model's context, ids inside its
// vocabulary; 1 <= k <= min(vocab, ops::kMaxTopk); chunk >= 1), so that a bad dataset fails
// before any work with a message naming the sequence; then writes `path`.
TeacherTopkStats export_teacher_topk(Model& model, const std::vector<std::vector<int32_t>>& seqs,
                                     const std::string& path, const TeacherTopkOptions& opts);

}  // namespace llmk
