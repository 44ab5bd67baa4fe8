// Host side of the attention kernels: argument checks, the head-dim dispatch and the decode
// split. (Kept out of the .cu files: fmt, and so llmk::Error, does not build under nvcc.)
#include "kernels/cuda/attention/attention.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <mutex>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/cuda/check.h"
#include "core/cuda/device.h"
#include "core/cuda/stream.h"
#include "core/error.h"
#include "kernels/cuda/attention/launch.h"

namespace llmk::cuda {

namespace {

// The head dims the tensor-core kernels are built for (launch.h instantiates each).
using HeadDims = std::integer_sequence<int, 64, 80, 96, 112, 128, 256>;

// Calls fn(std::integral_constant<int, D>{}) for a supported head dim; throws for any other.
template <class Fn, int... kDs>
void dispatch_head_dim(int D, const char* op, Fn&& fn, std::integer_sequence<int, kDs...>) {
  const bool found = ((D == kDs ? (fn(std::integral_constant<int, kDs>{}), true) : false) || ...);
  LLMK_CHECK(found, "{}: head dim {} is not supported by the CUDA kernels ({})", op, D,
             attention_head_dims());
}
template <class Fn>
void dispatch_head_dim(int D, const char* op, Fn&& fn) {
  dispatch_head_dim(D, op, std::forward<Fn>(fn), HeadDims{});
}

std::atomic<PrefillKernel> g_prefill_kernel{PrefillKernel::kAuto};
std::atomic<DecodeLoader> g_decode_loader{DecodeLoader::kAuto};

}  // namespace

const char* attention_head_dims() {
  static const std::string text = [] {
    const std::vector<int> ds = []<int... kDs>(std::integer_sequence<int, kDs...>) {
      return std::vector<int>{kDs...};
    }
    (HeadDims{});
    std::string t;
    for (size_t i = 0; i < ds.size(); ++i) {
      t += (i == 0 ? "" : i + 1 == ds.size() ? " or " : ", ") + std::to_string(ds[i]);
    }
    return t;
  }();
  return text.c_str();
}

bool attention_decode_8bit_supported(int D) { return attn::decode_8bit_supported(D); }

bool attention_head_dim_supported(int D) {
  return [D]<int... kDs>(std::integer_sequence<int, kDs...>) { return ((D == kDs) || ...); }
  (HeadDims{});
}

void attention_prefill(const AttentionArgs& a) {
  if (a.T <= 0 || a.Hq <= 0) return;
  LLMK_CHECK(!a.fp32,
             "attention prefill: the prefill kernels take bf16 or fp16 (f32: "
             "attention_generic)");
  LLMK_CHECK(a.page_table == nullptr,
             "attention prefill: a paged KV cache (page_table) is read by the decode kernel only");
  LLMK_CHECK((a.cu_q == nullptr) == (a.cu_k == nullptr),
             "attention prefill: varlen batches need both cu_q and cu_k");
  LLMK_CHECK(a.causal || a.window == 0,
             "attention prefill: a sliding window (window = {}) needs the causal mask", a.window);
  LLMK_CHECK(a.Hkv > 0 && a.Hq % a.Hkv == 0,
             "attention prefill: {} query heads are not a multiple of {} KV heads", a.Hq, a.Hkv);
  const PrefillKernel k =
      device_info().compute_capability() == 90 ? prefill_kernel() : PrefillKernel::kMmaSync;
  dispatch_head_dim(a.D, "attention prefill",
                    [&](auto d) { attn::launch_prefill<decltype(d)::value>(a, k); });
}

void set_prefill_kernel(PrefillKernel k) { g_prefill_kernel.store(k, std::memory_order_relaxed); }
PrefillKernel prefill_kernel() { return g_prefill_kernel.load(std::memory_order_relaxed); }
void set_decode_loader(DecodeLoader l) { g_decode_loader.store(l, std::memory_order_relaxed); }
DecodeLoader decode_loader() { return g_decode_loader.load(std::memory_order_relaxed); }

namespace {

// Rows per decode block: one tensor-core m-tile (16) of query rows (queries x the G heads of one
// KV group); more rows take several row groups, each reading the keys again.
template <int kD>
attn::DecodePlan decode_shape(const AttentionArgs& a) {
  attn::DecodePlan p;
  const int max_q = a.cu_q != nullptr ? a.max_q_per_seq : a.T;
  const int rows = max_q * (a.Hq / a.Hkv), per_block = attn::decode_max_rows<kD>();
  p.groups = (rows + per_block - 1) / per_block;
  return p;
}

// Keys one sequence can hold: the grid is sized from this host-known bound.
int64_t decode_capacity(const AttentionArgs& a) {
  return a.page_table != nullptr ? static_cast<int64_t>(a.pages_per_seq) * a.page_size : a.L;
}

// Splits: enough blocks to fill every SM's resident slots once (B x Hkv x groups blocks without
// a split), but at least four 64-key tiles per split (a deeper pipeline per block beats more
// blocks: measured on the H100) unless that leaves SMs without a block, and at most
// kDecodeMaxSplit; then no more splits than the capacity's tiles fill. (Phi-3-mini's 32 KV heads
// at 448 keys: 1 split took 11.4 us, 4 splits of 2 tiles 6.7 us; attention_decode_bench --shape
// 1 448 64 S --heads 32 32 96 on an H100.)
template <int kD>
int decode_split(const AttentionArgs& a, const attn::DecodePlan& p) {
  if (a.decode_split > 0) return std::min(a.decode_split, attn::kDecodeMaxSplit);
  const int64_t slots = static_cast<int64_t>(device_info().sm_count) *
                        attn::decode_blocks_per_sm<kD>(p.tma, a.kv_format);
  const int64_t base = static_cast<int64_t>(a.B) * a.Hkv * p.groups;
  const int64_t by_slots = std::max<int64_t>(1, slots / base);
  const int64_t fill = (static_cast<int64_t>(device_info().sm_count) + base - 1) / base;
  const int64_t by_len = std::max<int64_t>(fill, decode_capacity(a) / (4 * 64));
  const int64_t split = std::min({by_slots, by_len, int64_t{attn::kDecodeMaxSplit}});
  // Each split takes ceil(tiles / split) tiles: drop the splits that would be left with none
  // (B1 L32768: 33 -> 32 splits of 16 tiles), which only add blocks and partials to combine.
  const int64_t tiles = std::max<int64_t>(1, (decode_capacity(a) + 63) / 64);
  const int64_t per_split = (tiles + split - 1) / split;
  return static_cast<int>((tiles + per_split - 1) / per_split);
}

// Split workspaces (the arrival counters, zeroed once; the partial results): grow-only, one
// each per stream. Buffers are never freed, so a captured graph keeps valid pointers after a
// later launch needed a larger one. Launches on one stream use them in turn (every counter is
// back at zero when its launch ends); launches on different streams, which may run at once, get
// buffers of their own. (A graph replays with the buffers of the stream it was captured on.)
class GrowOnlyBuffer {
 public:
  void* get(size_t need, const char* what) {
    const cudaStream_t stream = current_stream();
    std::lock_guard<std::mutex> lock(mu_);
    Entry& e = per_stream_[stream];
    if (need <= e.bytes) return e.buffers.back();
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    LLMK_CUDA_CHECK(cudaStreamIsCapturing(stream, &capturing));
    LLMK_CHECK(capturing == cudaStreamCaptureStatusNone,
               "attention decode: the {} workspace must grow to {} bytes while the stream is "
               "being captured; run the same step once outside the capture first",
               what, need);
    const size_t bytes = std::max<size_t>(need * 2, size_t{1} << 20);
    void* p = nullptr;
    LLMK_CUDA_CHECK(cudaMalloc(&p, bytes));
    LLMK_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream));
    e.buffers.push_back(p);
    e.bytes = bytes;
    return p;
  }

 private:
  struct Entry {
    std::vector<void*> buffers;
    size_t bytes = 0;
  };
  std::mutex mu_;
  std::unordered_map<cudaStream_t, Entry> per_stream_;
};

// Whether the TMA build can read `a`'s cache (DecodeLoader): an sm_90+ device; pages that are
// whole boxes of at most 64 rows starting at 1024-byte multiples in the tile (8, 16, 32, 64) or
// whole multiples of 64 rows; a tensor map's nested strides (rows outside heads, or heads
// outside rows) and 32-bit row coordinates. 8-bit caches also: head dim 128 (one 128-byte
// panel), rows outside heads, and scales whose rows of Hkv floats a tensor map can step (Hkv a
// multiple of 4; 16-byte aligned). Sets p's box rows and stride order.
bool decode_tma_possible(const AttentionArgs& a, attn::DecodePlan& p) {
  if (decode_loader() == DecodeLoader::kCpAsync || device_info().cc_major < 9) return false;
  if (a.L < 1 || a.L > INT32_MAX) return false;
  if (a.page_table != nullptr) {
    const int ps = a.page_size;
    if (!(ps == 8 || ps == 16 || ps == 32 || ps % 64 == 0)) return false;
    p.tma_box_rows = std::min(ps, 64);
  } else {
    p.tma_box_rows = 64;
  }
  if (a.k_t != a.v_t || a.k_h != a.v_h) return false;
  const auto aligned = [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; };
  if (a.kv_format != 0 &&
      !(attn::decode_8bit_tma_supported(a.D) && a.Hkv % 4 == 0 && aligned(a.k) && aligned(a.v) &&
        aligned(a.k_scale) && aligned(a.v_scale))) {
    return false;
  }
  const int64_t D = a.D, H = a.Hkv;
  if (a.k_h >= D && a.k_t >= a.k_h * H) {
    p.tma_head_outer = false;  // [rows][Hkv][D]-like
  } else if (a.kv_format == 0 && a.k_t >= D && a.k_h >= a.k_t * a.L) {
    p.tma_head_outer = true;  // [Hkv][rows][D]-like
  } else {
    return false;
  }
  return true;
}

template <int kD>
attn::DecodePlan decode_plan(const AttentionArgs& a) {
  attn::DecodePlan p = decode_shape<kD>(a);
  p.tma = decode_tma_possible(a, p);
  p.split = decode_split<kD>(a, p);
  const int64_t sms = device_info().sm_count, base = static_cast<int64_t>(a.B) * a.Hkv * p.groups;
  if (p.tma && decode_loader() == DecodeLoader::kAuto) {
    // One block or fewer per SM: cp.async (attention.h). And at a head dim that is not a multiple
    // of 64, whose last panel's boxes are half zero fill: on an H100 at head dim 96 (32/32 heads,
    // 16-key pages) cp.async ran B1 L32768 at 2,624 GB/s against TMA's 2,259, B8 L4096 at 2,650
    // against 2,527.
    // 8-bit: the TMA build holds 2 blocks an SM to cp.async's 3. On an H100 (E4M3, 32/8 heads)
    // it ran B32 L4096 in 108.0-109.4 us against 113.4-113.8, but B8 L4096 and B1 L32768, whose
    // keys are split, in 33.3-33.5 and 34.2-34.5 against 31.1 and 33.5: TMA only where the
    // sequences' KV heads alone give every SM a block.
    if (base * p.split <= sms || kD % 64 != 0 || (a.kv_format != 0 && base < sms)) {
      p.tma = false;
      p.split = decode_split<kD>(a, p);
    }
  }
  if (a.kv_format != 0) {
    // A grid of fewer blocks than all SMs hold ran as if some SMs took 3 blocks and others none:
    // at most ceil(blocks / SMs) an SM instead. On an H100 at B32 L4096 (256 blocks, 3 fit an SM)
    // the E4M3 cp.async build ran 130.0 us as launched, 112.5-113.6 us capped at 2 an SM
    // (docs/perf.md).
    const int64_t per_sm = (base * p.split + sms - 1) / sms;
    if (per_sm < attn::decode_blocks_per_sm<kD>(p.tma, a.kv_format)) {
      p.per_sm_cap = static_cast<int>(per_sm);
    }
  }
  return p;
}

void check_decode_args(const AttentionArgs& a) {
  LLMK_CHECK(!a.fp32,
             "attention decode: the decode kernel takes bf16 or fp16 (f32: attention_generic)");
  LLMK_CHECK(a.Hkv > 0 && a.Hq % a.Hkv == 0 && a.B >= 1,
             "attention decode: {} query heads, {} KV heads, {} sequences", a.Hq, a.Hkv, a.B);
  if (a.cu_q != nullptr) {
    LLMK_CHECK(a.max_q_per_seq >= 1 && a.max_q_per_seq <= kDecodeMaxQueries,
               "attention decode: max_q_per_seq = {} must be in [1, {}] with cu_q", a.max_q_per_seq,
               kDecodeMaxQueries);
    LLMK_CHECK(a.cu_k != nullptr || a.positions != nullptr,
               "attention decode: cu_q needs cu_k or positions");
  } else {
    LLMK_CHECK(a.B == 1 && a.T <= kDecodeMaxQueries && a.positions != nullptr,
               "attention decode: {} queries of {} sequences without cu_q (one sequence, at most "
               "{} queries, with positions)",
               a.T, a.B, kDecodeMaxQueries);
  }
  if (a.page_table != nullptr) {
    LLMK_CHECK(a.page_size >= 1 && a.pages_per_seq >= 1,
               "attention decode: page_size {} and pages_per_seq {} must be >= 1", a.page_size,
               a.pages_per_seq);
  }
  LLMK_CHECK(decode_capacity(a) <= INT32_MAX, "attention decode: {} keys per sequence is too many",
             decode_capacity(a));
  LLMK_CHECK(a.kv_format == 0 || (attn::decode_8bit_supported(a.D) && a.k_scale && a.v_scale),
             "attention decode: 8-bit caches need their scales and head dim 64 or 128 (not {})",
             a.D);
}

}  // namespace

namespace {

// The plan attention_decode would launch `a` with (checked arguments; no workspaces).
attn::DecodePlan checked_decode_plan(const AttentionArgs& a) {
  check_decode_args(a);
  attn::DecodePlan plan;
  dispatch_head_dim(a.D, "attention decode",
                    [&](auto d) { plan = decode_plan<decltype(d)::value>(a); });
  return plan;
}

}  // namespace

int attention_decode_split(const AttentionArgs& a) { return checked_decode_plan(a).split; }

bool attention_decode_uses_tma(const AttentionArgs& a) { return checked_decode_plan(a).tma; }

void attention_decode(const AttentionArgs& a) {
  if (a.T <= 0 || a.Hq <= 0) return;
  check_decode_args(a);
  dispatch_head_dim(a.D, "attention decode", [&](auto d) {
    constexpr int kD = decltype(d)::value;
    const DeviceInfo& dev = device_info();
    attn::DecodePlan plan = decode_plan<kD>(a);
    const size_t smem = attn::decode_smem_bytes<kD>(plan.tma, a.kv_format);
    LLMK_CHECK(smem <= dev.max_smem_per_block_optin,
               "attention decode: {} bytes of shared memory at head dim {}; the device allows {}",
               smem, kD, dev.max_smem_per_block_optin);
    if (plan.split > 1) {
      const size_t rows = static_cast<size_t>(a.T) * a.Hq * plan.split;
      const size_t counters = static_cast<size_t>(a.B) * a.Hkv * plan.groups;
      static GrowOnlyBuffer counter_ws, partial_ws;
      plan.counters = static_cast<int*>(counter_ws.get(counters * sizeof(int), "counter"));
      plan.part_ml =
          static_cast<float*>(partial_ws.get(rows * (kD + 4) * sizeof(float), "partial"));
      plan.part_o = plan.part_ml + (rows * 2 + 3) / 4 * 4;  // 16-byte aligned
    }
    // decode_tma_possible admits only caches a tensor map describes: a refusal is a bug there
    // (or a driver without the encoder), not a reason to run another kernel unannounced.
    LLMK_CHECK(
        attn::launch_decode<kD>(a, plan),
        "attention decode: the CUDA driver refused the K/V tensor maps (head dim {}, {} rows, "
        "row stride {}, head stride {}); DecodeLoader::kCpAsync avoids them",
        kD, a.L, a.k_t, a.k_h);
  });
}

}  // namespace llmk::cuda
