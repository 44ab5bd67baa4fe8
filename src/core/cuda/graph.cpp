#include "core/cuda/graph.h"

#include "core/cuda/check.h"
#include "core/cuda/stream.h"
#include "core/error.h"

namespace llmk::cuda {

Graph::~Graph() { reset(); }

void Graph::reset() {
  if (exec_) cudaGraphExecDestroy(exec_);
  if (graph_) cudaGraphDestroy(graph_);
  exec_ = nullptr;
  graph_ = nullptr;
}

void Graph::capture(const std::function<void()>& fn) {
  reset();
  cudaStream_t s = current_stream();
  LLMK_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  try {
    fn();
  } catch (...) {
    cudaGraph_t broken = nullptr;
    cudaStreamEndCapture(s, &broken);
    if (broken) cudaGraphDestroy(broken);
    cudaGetLastError();
    throw;
  }
  LLMK_CUDA_CHECK(cudaStreamEndCapture(s, &graph_));
  LLMK_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
}

void Graph::replay() {
  LLMK_CHECK(exec_ != nullptr, "cuda::Graph::replay before capture");
  LLMK_CUDA_CHECK(cudaGraphLaunch(exec_, current_stream()));
}

}  // namespace llmk::cuda
