// Pairwise cosine diversity of N embeddings (llmk.ops.pairwise_cosine_diversity), on the CPU
// in float or double with sums in double: the reference for a CUDA kernel and the path for CPU
// tensors. O(N d): with u_i = x_i / |x_i| and S = sum_i u_i, the cosines of row i with all rows
// sum to u_i . S, and those of all ordered pairs to |S|^2; the diagonal (|u_i|^2, 1 or 0) is
// taken out. A zero row has cosine 0 with every row (distance 1) and gets a zero gradient.
#pragma once

#include <cstdint>

namespace llmk::cpu::grad {

// x: [N, d], contiguous. mean: out[0] = the mean over ordered pairs i != j of
// 1 - cos(x_i, x_j); rows: out[i] = the mean over j != i of 1 - cos(x_i, x_j). With N < 2 there
// are no pairs: the outputs are 0.
template <class T>
void cosine_diversity_fwd(T* out, const T* x, int64_t N, int64_t d, bool rows);

// dx [N, d] (contiguous) from dout (out's shape: one value for mean, N for rows).
template <class T>
void cosine_diversity_bwd(T* dx, const T* dout, const T* x, int64_t N, int64_t d, bool rows);

}  // namespace llmk::cpu::grad
