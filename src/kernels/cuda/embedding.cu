// Embedding gather: block t copies table row ids[t] into out row t, with 16-byte accesses
// where every row start is aligned.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/embedding.h"

namespace llmk::cuda {

namespace {

// kVec 16-bit elements per access (8: 16 bytes; 1: any alignment), moved as raw bits.
template <int kVec>
struct Raw;
template <>
struct Raw<8> {
  using type = uint4;
};
template <>
struct Raw<1> {
  using type = uint16_t;
};

template <int kVec>
__global__ void embedding_kernel(uint16_t* out, int64_t out_ld, const uint16_t* table,
                                 int64_t table_ld, int64_t V, int64_t D, const int32_t* ids,
                                 int64_t ids_stride) {
  using R = typename Raw<kVec>::type;
  const int64_t t = blockIdx.x;
  const int64_t id = ids[t * ids_stride];
  R* dst = reinterpret_cast<R*>(out + t * out_ld);
  const bool valid = id >= 0 && id < V;
  const R* src = reinterpret_cast<const R*>(table + (valid ? id : 0) * table_ld);
  for (int64_t c = threadIdx.x; c < D / kVec; c += blockDim.x) dst[c] = valid ? src[c] : R{};
}

}  // namespace

void embedding(void* out, int64_t out_ld, const void* table, int64_t table_ld, int64_t V, int64_t D,
               const int32_t* ids, int64_t ids_stride, int64_t T) {
  if (T == 0 || D == 0) return;
  auto* o = static_cast<uint16_t*>(out);
  const auto* tab = static_cast<const uint16_t*>(table);
  const bool vec = D % 8 == 0 && is_aligned(out, 16) && is_aligned(table, 16) && out_ld % 8 == 0 &&
                   table_ld % 8 == 0;
  if (vec) {
    embedding_kernel<8>
        <<<static_cast<unsigned>(T), block_threads_for(D / 8, 256), 0, current_stream()>>>(
            o, out_ld, tab, table_ld, V, D, ids, ids_stride);
  } else {
    embedding_kernel<1>
        <<<static_cast<unsigned>(T), block_threads_for(D, 256), 0, current_stream()>>>(
            o, out_ld, tab, table_ld, V, D, ids, ids_stride);
  }
  check_launch("embedding");
}

}  // namespace llmk::cuda
