// attention_backward's checks (host code: fmt does not compile under nvcc); the kernels are in
// backward.cu.
#include "kernels/cuda/attention/backward.h"

#include "core/error.h"

namespace llmk::cuda {

// False for a head dim it is not built for (backward.cu).
bool launch_attention_backward(const AttentionBwdArgs& a);

bool attention_backward_supported(int D) { return D >= 64 && D <= 128 && D % 16 == 0; }

void attention_backward(const AttentionBwdArgs& a) {
  LLMK_CHECK(attention_backward_supported(a.D),
             "attention backward: head dim {} is not built (64 to 128, multiples of 16)", a.D);
  LLMK_CHECK(a.Hkv > 0 && a.Hq % a.Hkv == 0 && a.B >= 1 && a.cu_q != nullptr && a.cu_k != nullptr &&
                 a.lse != nullptr && a.workspace != nullptr,
             "attention backward: bad arguments (Hq {}, Hkv {}, B {})", a.Hq, a.Hkv, a.B);
  LLMK_CHECK(launch_attention_backward(a), "attention backward: head dim {} is not built", a.D);
}

}  // namespace llmk::cuda
