// The stream llmk's kernels and copies run on.
//
// Every launcher enqueues on current_stream(). By default that is one process-wide stream
// created with cudaStreamNonBlocking on first use: unlike the legacy default stream it does not
// synchronise with other streams, and it can be captured into a CUDA graph. set_current_stream
// overrides it for the calling thread only (as a graph-capturing engine thread would).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace llmk::cuda {

// llmk's process-wide non-blocking stream (created on first use; never destroyed).
cudaStream_t default_stream();
// The calling thread's stream: the one last set on this thread, else default_stream().
cudaStream_t current_stream();
// Sets the calling thread's stream; nullptr restores default_stream() (the legacy NULL stream
// cannot be selected: it would serialise against every other stream).
void set_current_stream(cudaStream_t stream);

// Sets the calling thread's stream for a scope and restores the previous one.
class StreamGuard {
 public:
  explicit StreamGuard(cudaStream_t stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  cudaStream_t previous_;
};

// Waits for all work queued on current_stream().
void synchronize();

// Copies on current_stream() and waits for the copy (and the work queued before it) to finish,
// so host memory on either side may be reused or freed on return.
void memcpy_sync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);

}  // namespace llmk::cuda
