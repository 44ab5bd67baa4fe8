// A CUDA graph captured from the work enqueued on cuda::current_stream() and replayed on it.
// Capture runs nothing: whatever fn enqueues is recorded. fn must not allocate or synchronise.
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <utility>

namespace llmk::cuda {

class Graph {
 public:
  Graph() = default;
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  void capture(const std::function<void()>& fn);
  void replay();
  bool ready() const { return exec_ != nullptr; }
  void reset();
  void swap(Graph& other) noexcept {
    std::swap(graph_, other.graph_);
    std::swap(exec_, other.exec_);
  }

 private:
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace llmk::cuda
