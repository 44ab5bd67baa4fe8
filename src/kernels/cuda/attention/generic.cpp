// Host side of the fallback attention kernel (generic.cu): argument checks, then the launch.
#include <cstdint>

#include "core/error.h"
#include "kernels/cuda/attention/attention.h"

namespace llmk::cuda {

namespace attn {
void launch_generic(const AttentionArgs& a);  // generic.cu
}

void attention_generic(const AttentionArgs& a) {
  if (a.T <= 0 || a.Hq <= 0) return;
  LLMK_CHECK(a.D > 0 && a.D % 2 == 0 && a.D <= kGenericMaxD,
             "attention (fallback kernel): head dim {} must be even and at most {}", a.D,
             kGenericMaxD);
  LLMK_CHECK(a.Hkv > 0 && a.Hq % a.Hkv == 0,
             "attention (fallback kernel): {} query heads are not a multiple of {} KV heads", a.Hq,
             a.Hkv);
  LLMK_CHECK(a.cu_q == nullptr || a.B > 0,
             "attention (fallback kernel): a batch (cu_q) needs B > 0");
  LLMK_CHECK(a.cu_k != nullptr || a.positions != nullptr,
             "attention (fallback kernel): without cu_k the queries need positions");
  LLMK_CHECK(a.cu_q != nullptr || a.cu_k == nullptr,
             "attention (fallback kernel): cu_k without cu_q");
  LLMK_CHECK(a.page_table == nullptr || (a.page_size > 0 && a.pages_per_seq > 0),
             "attention (fallback kernel): a page table needs page_size and pages_per_seq");
  attn::launch_generic(a);
}

}  // namespace llmk::cuda
