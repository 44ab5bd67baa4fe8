// Host side of the attention kernels: argument checks, the head-dim dispatch and the decode
// split. (Kept out of the .cu files: fmt, and so llmk::Error, does not build under nvcc.)
#include "kernels/cuda/attention/attention.h"

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/cuda/device.h"
#include "core/error.h"
#include "kernels/cuda/attention/launch.h"

namespace llmk::cuda {

namespace {

// Calls fn(std::integral_constant<int, D>{}) for a supported head dim; throws for any other.
template <class Fn>
void dispatch_head_dim(int D, const char* op, Fn&& fn) {
  switch (D) {
    case 64:
      return fn(std::integral_constant<int, 64>{});
    case 128:
      return fn(std::integral_constant<int, 128>{});
    case 256:
      return fn(std::integral_constant<int, 256>{});
    default:
      LLMK_FAIL("{}: head dim {} is not supported by the CUDA kernels (64, 128 or 256)", op, D);
  }
}

}  // namespace

bool attention_head_dim_supported(int D) { return D == 64 || D == 128 || D == 256; }

void attention_prefill(const AttentionArgs& a) {
  if (a.T <= 0 || a.Hq <= 0) return;
  LLMK_CHECK(a.page_table == nullptr,
             "attention prefill: a paged KV cache (page_table) is read by the decode kernel only");
  LLMK_CHECK((a.cu_q == nullptr) == (a.cu_k == nullptr),
             "attention prefill: varlen batches need both cu_q and cu_k");
  LLMK_CHECK(a.causal || a.window == 0,
             "attention prefill: a sliding window (window = {}) needs the causal mask", a.window);
  LLMK_CHECK(a.Hkv > 0 && a.Hq % a.Hkv == 0,
             "attention prefill: {} query heads are not a multiple of {} KV heads", a.Hq, a.Hkv);
  dispatch_head_dim(a.D, "attention prefill",
                    [&](auto d) { attn::launch_prefill<decltype(d)::value>(a); });
}

void attention_decode(const AttentionArgs& a) {
  if (a.T <= 0 || a.Hq <= 0) return;
  LLMK_CHECK(a.T <= kDecodeMaxQueries, "attention decode: {} queries, at most {}", a.T,
             kDecodeMaxQueries);
  dispatch_head_dim(a.D, "attention decode", [&](auto d) {
    constexpr int kD = decltype(d)::value;
    const DeviceInfo& dev = device_info();
    const int group = a.Hq / a.Hkv;
    const size_t smem = attn::decode_smem_bytes<kD>(group);
    LLMK_CHECK(smem <= dev.max_smem_per_block_optin,
               "attention decode: {} query heads per KV head need {} bytes of shared memory at "
               "head dim {}; the device allows {}",
               group, smem, kD, dev.max_smem_per_block_optin);
    // Enough blocks to cover the SMs, but no more splits than key tiles the cache could hold
    // (64 keys a tile at most). Host-known values only, so a captured launch fits any position.
    const int64_t blocks = static_cast<int64_t>(a.Hkv) * a.T;
    const int64_t by_sms = std::max<int64_t>(1, dev.sm_count / blocks);
    const int64_t by_len = std::max<int64_t>(1, (a.L + 63) / 64);
    const int64_t max_split = attn::kDecodeMaxSplit;
    const int split = static_cast<int>(std::min({by_sms, by_len, max_split}));
    attn::launch_decode<kD>(a, split);
  });
}

}  // namespace llmk::cuda
