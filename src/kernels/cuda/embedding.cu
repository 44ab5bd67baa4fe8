// Embedding gather: block t copies table row ids[t] into out row t as raw words (the table's
// element type is the output's), with 16-byte accesses where every row start is aligned.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/embedding.h"

namespace llmk::cuda {

namespace {

// Rows are moved in words of R: uint4 (16 bytes) where every row start is aligned, else the
// element itself (uint16_t or uint32_t). Lengths and strides are in words.
template <class R>
__global__ void embedding_kernel(R* out, int64_t out_ld, const R* table, int64_t table_ld,
                                 int64_t V, int64_t words, const int32_t* ids, int64_t ids_stride) {
  const int64_t t = blockIdx.x;
  const int64_t id = ids[t * ids_stride];
  R* dst = out + t * out_ld;
  const bool valid = id >= 0 && id < V;
  const R* src = table + (valid ? id : 0) * table_ld;
  for (int64_t c = threadIdx.x; c < words; c += blockDim.x) dst[c] = valid ? src[c] : R{};
}

template <class R>
void launch_embedding(void* out, int64_t out_ld, const void* table, int64_t table_ld, int64_t V,
                      int64_t words, const int32_t* ids, int64_t ids_stride, int64_t T) {
  embedding_kernel<R>
      <<<static_cast<unsigned>(T), block_threads_for(words, 256), 0, current_stream()>>>(
          static_cast<R*>(out), out_ld, static_cast<const R*>(table), table_ld, V, words, ids,
          ids_stride);
}

}  // namespace

void embedding(void* out, int64_t out_ld, const void* table, int64_t table_ld, int64_t V, int64_t D,
               int elem_bytes, const int32_t* ids, int64_t ids_stride, int64_t T) {
  if (T == 0 || D == 0) return;
  const int per16 = 16 / elem_bytes;  // elements in a 16-byte word
  const bool vec = D % per16 == 0 && is_aligned(out, 16) && is_aligned(table, 16) &&
                   out_ld % per16 == 0 && table_ld % per16 == 0;
  if (vec) {
    launch_embedding<uint4>(out, out_ld / per16, table, table_ld / per16, V, D / per16, ids,
                            ids_stride, T);
  } else if (elem_bytes == 4) {
    launch_embedding<uint32_t>(out, out_ld, table, table_ld, V, D, ids, ids_stride, T);
  } else {
    launch_embedding<uint16_t>(out, out_ld, table, table_ld, V, D, ids, ids_stride, T);
  }
  check_launch("embedding");
}

}  // namespace llmk::cuda
