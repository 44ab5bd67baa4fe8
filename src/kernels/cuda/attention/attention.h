// Causal grouped-query attention on the GPU: bf16 or fp16 q, KV caches and output (f32 in the
// fallback kernel), fp32 accumulation.
//
// Kernels behind one argument struct:
//   prefill: flash attention (online softmax, O(T) memory) for T > 8, in two builds of one
//            algorithm: warpgroup MMA (wgmma, Hopper sm_90) and mma.sync (sm_80 and later, the
//            portable one; set_prefill_kernel chooses it on Hopper too);
//   decode:  up to 8 queries per sequence over a contiguous or paged cache, each KV group's query
//            heads sharing one pass over the keys, the keys split over blocks whose partial
//            results the last block to finish combines;
//   generic: any even head dim up to 256, no tensor cores (the fallback).
// All launch on cuda::current_stream() and never wait on the host. Positions are read on the
// device and the grid depends only on host-known sizes, so one captured launch replays at every
// position; blocks skip the keys past the position.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace llmk::cuda {

struct AttentionArgs {
  // Defaults give one sequence over a contiguous cache, causal, bf16.

  // Tensors. Strides in elements; the last dimension (D) is contiguous. Pointers and strides
  // must allow 16-byte loads: pointers 16-byte aligned, row and head strides multiples of 8.
  __nv_bfloat16* out = nullptr;  // [T, Hq, D]
  int64_t out_t = 0, out_h = 0;
  const __nv_bfloat16* q = nullptr;  // [T, Hq, D]
  int64_t q_t = 0, q_h = 0;
  const __nv_bfloat16* k = nullptr;  // [L, Hkv, D]
  int64_t k_t = 0, k_h = 0;
  const __nv_bfloat16* v = nullptr;  // [L, Hkv, D]
  int64_t v_t = 0, v_h = 0;
  // Element type of q, k, v and out: bf16 (default), fp16 or f32 (the pointers above then hold
  // __half or float data). f32 runs the fallback kernel only (attention_generic).
  bool fp16 = false;
  bool fp32 = false;
  // 8-bit K and V (the fallback kernel only): 1 E4M3, 2 int8 (kernels/kv_quant.h), k and v then
  // holding bytes (strides in bytes), row j's head h scaled by k_scale / v_scale[j * Hkv + h].
  // 0: k and v are of q's type.
  int kv_format = 0;
  const float* k_scale = nullptr;
  const float* v_scale = nullptr;
  // Optional log-sum-exp of each query row's scaled logits (natural log), [Hq, T] fp32.
  float* lse = nullptr;

  // Sizes.
  int T = 0, Hq = 0, Hkv = 0, D = 0;
  int64_t L = 0;  // cache capacity (rows of k and v)

  // Where the queries sit. One sequence (cu_q null): query t is at positions[t], consecutive.
  // Batches: `B` sequences. Query rows of sequence b are q rows [cu_q[b], cu_q[b+1]) (T is then
  // cu_q[B], the total); its keys are cu_k[b+1]-cu_k[b] rows (varlen prefill: rows cu_k[b].. of k
  // and v) or, with a page table, rows 0..len-1 of its pages. Causal masks are bottom-right
  // aligned: query i of a sequence with Tq queries and Tk keys sits at position Tk - Tq + i.
  // With cu_q and no cu_k (batched decode), positions[] (length T) gives each query row's
  // position within its sequence (consecutive inside a sequence) and sequence b sees its keys
  // 0..(position of its last query): one batched decode step reads the positions the model
  // staged.
  const int32_t* positions = nullptr;  // [T] on the device
  int B = 1;
  const int32_t* cu_q = nullptr;  // [B + 1] on the device
  const int32_t* cu_k = nullptr;  // [B + 1] on the device (key counts; see page_table)
  // The most query rows of any one sequence (decode with cu_q: required, 1..kDecodeMaxQueries;
  // the grid is sized by it, so it must be known on the host).
  int max_q_per_seq = 0;

  // Paged KV cache: k and v are pools of pages [num_pages * page_size, Hkv, D] (row stride k_t);
  // row j of sequence b lives at pool row page_table[b * pages_per_seq + j / page_size] *
  // page_size + j % page_size. Null: contiguous as above.
  const int32_t* page_table = nullptr;  // [B, pages_per_seq] on the device
  int page_size = 0;
  int pages_per_seq = 0;

  // Scores and masks.
  float scale = 0.0f;    // multiplies q.k (resolved: no 0 = default here)
  int window = 0;        // > 0: query at p sees keys (p - window, p]
  float softcap = 0.0f;  // > 0: logits = softcap * tanh(logits / softcap)
  // false: every query sees every key of its sequence (no causal mask; window must be 0).
  // Prefill only; the decode kernel is always causal.
  bool causal = true;

  // How the decode kernel runs.
  // Blocks the keys of one (sequence, KV head) are split over; 0 = the heuristic (benchmarks
  // sweep it).
  int decode_split = 0;
  // Programmatic dependent launch (sm_90): read positions, cu_q, cu_k, the page table and the
  // K/V rows of keys before each sequence's first query position *before* waiting for the
  // kernel launched just before this one on the stream, so that those loads overlap its tail.
  // Only when that kernel writes none of them (the model runner: it is kv_append, which writes
  // the new keys' rows). q, out and the split workspace are always touched after the wait.
  bool decode_early_reads = false;

  // Set by the prefill launcher (callers leave it 0): where the whole grid is resident at once,
  // `resident_rounds` rounds of one block per SM (`sms` each) fill the SMs, and odd rounds take
  // their work items in reverse order, so that the SM given one of the longest (causal) query
  // tiles in the first round is given one of the shortest in the second. 0: one order
  // throughout, longest first.
  int resident_rounds = 0, sms = 0;
};

// The fallback for what the kernels below are not built for: any even head dim up to
// kGenericMaxD, every field of AttentionArgs, no tensor cores (generic.cu). Slow; for odd shapes
// (head dims the tensor-core kernels are not built for: 80, 112, test models) and as a second
// reference in the GPU tests.
constexpr int kGenericMaxD = 256;
void attention_generic(const AttentionArgs& a);

// Head dims the kernels are built for, and their list for messages ("64, 80, 96, 112, 128 or 256").
bool attention_head_dim_supported(int D);
// Head dims at which the decode kernel reads 8-bit caches (kv_format 1, 2) itself; at others
// they go to the fallback kernel.
bool attention_decode_8bit_supported(int D);
const char* attention_head_dims();

// Any T >= 1; meant for T > 8. Throws llmk::Error for an unsupported head dim.
void attention_prefill(const AttentionArgs& a);
// Which prefill kernel attention_prefill runs: kAuto, on an sm_90 device the warp-specialised
// kernel (TMA, head dims 96 and 128) or the wgmma kernel (the other head dims), and the mma.sync
// kernel elsewhere; kWgmma, the wgmma kernel at every head dim on sm_90; kMmaSync, the mma.sync
// kernel everywhere. The attention backward (backward.h) takes its Hopper kernels unless kMmaSync.
// Process-wide; for the tests and benchmarks that compare them.
enum class PrefillKernel { kAuto, kMmaSync, kWgmma };
void set_prefill_kernel(PrefillKernel k);
PrefillKernel prefill_kernel();

// At most kDecodeMaxQueries query rows per sequence, bf16, contiguous or paged cache, B >= 1.
// Throws llmk::Error for an unsupported head dim or dtype, or when a workspace for the split
// would have to grow while the stream is being captured (run one step outside capture first).
constexpr int kDecodeMaxQueries = 8;
void attention_decode(const AttentionArgs& a);
// The split attention_decode would choose for `a` (1 = no split); for benchmarks and stats.
int attention_decode_split(const AttentionArgs& a);
// How the decode kernel loads K/V tiles. Two builds of one kernel: the bulk tensor copy engine
// (TMA: one copy per page, or 64 keys, and 64-dim panel, landing on a shared-memory barrier;
// sm_90+, and a cache it can describe: page size 8, 16, 32, 64 or a multiple of 64, or a
// contiguous cache; nested row and head strides; at most 2^31 rows) and cp.async (16-byte copies
// by every thread; any cache). kAuto: TMA where it can run, the grid has more blocks than the
// device has SMs and the head dim is a multiple of 64, else cp.async (measured on the H100: with
// one block or fewer per SM the cp.async build is faster, B1 L4096 10.7 against 11.4 us; with
// two, TMA is, B1 L32768 49.3 against 51.4 us, B32 L4096 179 against 189; at head dim 96, whose
// second 64-dim panel is half zero fill, cp.async is, B1 L32768 2,624 against 2,259 GB/s). kTma:
// TMA wherever it can run; kCpAsync: cp.async everywhere. Process-wide; for the tests and
// benchmarks that compare the two.
enum class DecodeLoader { kAuto, kTma, kCpAsync };
void set_decode_loader(DecodeLoader l);
DecodeLoader decode_loader();
// Whether attention_decode would load `a`'s tiles with TMA.
bool attention_decode_uses_tma(const AttentionArgs& a);

}  // namespace llmk::cuda
