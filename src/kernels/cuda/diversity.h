// Pairwise cosine diversity on the GPU (llmk.ops.pairwise_cosine_diversity): the CUDA side of
// kernels/cpu/diversity.h, which is the reference and defines the values. O(N d): with
// u_i = x_i / |x_i| and S = sum_i u_i, row i's cosines with all rows sum to u_i . S and all
// ordered pairs' to |S|^2. T: __nv_bfloat16, __half or float; sums in fp32, outputs fp32. Launches
// go on cuda::current_stream(); nothing waits on the host and nothing allocates: the scratch
// comes from the caller (cosine_diversity_workspace bytes).
#pragma once

#include <cstddef>
#include <cstdint>

namespace llmk::cuda::grad {

size_t cosine_diversity_workspace(int64_t N, int64_t d);
// The longest rows the kernels take (the callers check): their sums live in shared memory.
int64_t cosine_diversity_max_dim();

// x: [N, d], contiguous. out: [1] (mean over ordered pairs i != j of 1 - cos) or [N] (rows:
// each row's mean over the others). Fewer than two rows: zeros.
template <class T>
void cosine_diversity_fwd(float* out, const T* x, int64_t N, int64_t d, bool rows, void* workspace);

// dx [N, d] from dout (out's shape). A zero row gets a zero gradient.
template <class T>
void cosine_diversity_bwd(T* dx, const float* dout, const T* x, int64_t N, int64_t d, bool rows,
                          void* workspace);

}  // namespace llmk::cuda::grad
