// Decode steps replayed from CUDA graphs.
//
// capture_step records one step of a model (whatever fn enqueues) into a graph; StepGraphs keeps
// one such graph per batch size for the many-sequence engine, whose decode-only steps are padded
// to the next size it keeps (Model::Padding), so a handful of graphs serves every step. Without
// CUDA (or on the CPU) StepGraphs computes each step eagerly.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>

#include "core/tensor.h"

namespace llmk {

class Model;

#ifdef LLMK_HAS_CUDA
namespace cuda {
class Graph;
}
// Captures a decode step of `batch` rows into `graph` (fn enqueues it; it must allocate nothing).
// With `choose`, the first time for a model and batch size, twice: with its kernels releasing the
// next one after their wait and before it (cuda::release_dependents_first); both are replayed in
// turn and the faster kept (Model::release_first remembers which). A replay recomputes the same
// step, rewriting its KV rows with equal values. Without, once: as remembered, else released
// after the wait.
void capture_step(Model& model, int64_t batch, cuda::Graph& graph, const std::function<void()>& fn,
                  bool choose = true);
#endif

class StepGraphs {
 public:
  explicit StepGraphs(Model& model);
  ~StepGraphs();
  StepGraphs(const StepGraphs&) = delete;
  StepGraphs& operator=(const StepGraphs&) = delete;

  // The logits of the padded step of `rows` rows staged on the model (Model::stage_runs with
  // Padding{rows, ...}): its graph replayed, or, the first time for `rows` (or after the model's
  // buffers moved), computed eagerly and then captured (once: no timed choice of the release
  // point, whose 18 replays of the step per batch size would slow a server's first minutes).
  Tensor run(int64_t rows);
  int64_t captured() const { return captured_; }
  int64_t replayed() const { return replayed_; }

 private:
  struct Entry;
  Model& model_;
  std::map<int64_t, std::unique_ptr<Entry>> graphs_;
  int64_t generation_ = -1;
  int64_t captured_ = 0, replayed_ = 0;
};

}  // namespace llmk
