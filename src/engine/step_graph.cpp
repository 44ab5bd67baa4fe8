#include "engine/step_graph.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "model/model.h"

#ifdef LLMK_HAS_CUDA
#include "core/cuda/graph.h"
#include "core/cuda/stream.h"
#endif

namespace llmk {

#ifdef LLMK_HAS_CUDA
void capture_step(Model& model, int64_t batch, cuda::Graph& graph, const std::function<void()>& fn,
                  bool choose) {
  const std::optional<bool> known = model.release_first(batch);
  if (known || !choose) {
    cuda::ReleaseFirstGuard guard(known.value_or(false));
    graph.capture(fn);
    return;
  }
  cuda::Graph first;
  {
    cuda::ReleaseFirstGuard guard(false);
    graph.capture(fn);
  }
  {
    cuda::ReleaseFirstGuard guard(true);
    first.capture(fn);
  }
  using Clock = std::chrono::steady_clock;
  auto time = [](cuda::Graph& g) {
    const auto t0 = Clock::now();
    g.replay();
    cuda::synchronize();
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  constexpr int kWarmup = 2, kRounds = 7;
  std::vector<double> after, before;
  for (int i = 0; i < kWarmup + kRounds; ++i) {
    const double a = time(graph), b = time(first);
    if (i >= kWarmup) {
      after.push_back(a);
      before.push_back(b);
    }
  }
  auto median = [](std::vector<double>& v) {
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2];
  };
  const bool release_first = median(before) < median(after);
  if (release_first) graph.swap(first);
  model.set_release_first(batch, release_first);
}

struct StepGraphs::Entry {
  cuda::Graph graph;
  Tensor logits;  // the captured step's output (fixed address)
};
#else
struct StepGraphs::Entry {};
#endif

StepGraphs::StepGraphs(Model& model) : model_(model) {}
StepGraphs::~StepGraphs() = default;

Tensor StepGraphs::run(int64_t rows) {
#ifdef LLMK_HAS_CUDA
  if (model_.device() == Device::CUDA) {
    if (model_.buffers_generation() != generation_) {  // addresses the graphs hold have moved
      graphs_.clear();
      generation_ = model_.buffers_generation();
    }
    const auto it = graphs_.find(rows);
    if (it != graphs_.end()) {
      it->second->graph.replay();
      ++replayed_;
      return it->second->logits;
    }
    // Once eagerly first: workspaces (split-KV partials, GEMM plans) grow outside a capture.
    const Tensor logits = model_.compute(rows, false);
    if (model_.buffers_generation() != generation_) return logits;  // capture next time
    auto e = std::make_unique<Entry>();
    Entry& entry = *e;
    capture_step(
        model_, rows, entry.graph, [&] { entry.logits = model_.compute(rows, false); },
        /*choose=*/false);
    graphs_.emplace(rows, std::move(e));
    ++captured_;
    return entry.logits;  // the eager step's logits, or a replay's (the same step)
  }
#endif
  return model_.compute(rows, false);
}

}  // namespace llmk
