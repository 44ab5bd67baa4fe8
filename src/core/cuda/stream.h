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

// When a kernel launched with programmatic dependent launch (kernels/cuda/common.cuh) lets the
// next kernel in the stream start: once its own wait for the kernel before it returns (false,
// the default), or first, before that wait (true), so that the next kernel's independent work
// (a linear's first weight loads) starts a kernel earlier. Which is faster depends on the chain
// of kernels (measured on an H100, decode steps: Phi-3-mini and Qwen2.5-0.5B faster released
// first, Llama-3-8B slower), so the decoder times both (engine/generator.cpp). Per thread, like
// the stream, and read when a kernel is launched: a captured graph keeps the setting it was
// captured with. Only the kernels of a decode step between linears take it (the one-row linear,
// the RMS norms); the others wait first.
bool release_dependents_first();
// Sets release_dependents_first() for the calling thread for a scope, and restores it.
class ReleaseFirstGuard {
 public:
  explicit ReleaseFirstGuard(bool first);
  ~ReleaseFirstGuard();
  ReleaseFirstGuard(const ReleaseFirstGuard&) = delete;
  ReleaseFirstGuard& operator=(const ReleaseFirstGuard&) = delete;

 private:
  bool previous_;
};

// Waits for all work queued on current_stream().
void synchronize();

// Copies on current_stream() and waits for the copy (and the work queued before it) to finish,
// so host memory on either side may be reused or freed on return.
void memcpy_sync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);

}  // namespace llmk::cuda
