#include "core/cuda/stream.h"

#include "core/cuda/check.h"

namespace llmk::cuda {

namespace {
thread_local cudaStream_t t_stream = nullptr;  // nullptr: default_stream()
thread_local bool t_release_first = false;
}  // namespace

cudaStream_t default_stream() {
  // Deliberately never destroyed: destroying it during static destruction can race with the
  // runtime's own teardown.
  static const cudaStream_t stream = [] {
    cudaStream_t s = nullptr;
    LLMK_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return s;
  }();
  return stream;
}

cudaStream_t current_stream() { return t_stream != nullptr ? t_stream : default_stream(); }

void set_current_stream(cudaStream_t stream) { t_stream = stream; }

StreamGuard::StreamGuard(cudaStream_t stream) : previous_(t_stream) { t_stream = stream; }

StreamGuard::~StreamGuard() { t_stream = previous_; }

bool release_dependents_first() { return t_release_first; }

ReleaseFirstGuard::ReleaseFirstGuard(bool first) : previous_(t_release_first) {
  t_release_first = first;
}

ReleaseFirstGuard::~ReleaseFirstGuard() { t_release_first = previous_; }

void synchronize() { LLMK_CUDA_CHECK(cudaStreamSynchronize(current_stream())); }

void memcpy_sync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (bytes == 0) return;
  const cudaStream_t stream = current_stream();
  LLMK_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, stream));
  LLMK_CUDA_CHECK(cudaStreamSynchronize(stream));
}

}  // namespace llmk::cuda
