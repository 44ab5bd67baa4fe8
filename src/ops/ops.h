// The single entry point per op. Each checks shapes, dtypes and devices (llmk::Error naming the
// op, the argument and what was expected), then calls the kernel for the tensors' device.
// All tensors of one call live on one device.
//
// CPU: computes in fp32; activations, outputs and KV caches are f32; weights may be any
// supported dtype where noted.
// CUDA: activations, KV caches and weights are bf16, or fp16, or f32 (a model's activation
// dtype, LoadOptions::dtype: one dtype for the tensors of a call, taken from them; "bf16" below
// stands for it where noted), accumulation is fp32; positions and ids are i32 in device memory.
// CUDA ops launch on cuda::current_stream(), never synchronise and never allocate, so a decode step
// built from them can be captured in a CUDA graph; values they need per step (positions) are read
// from device memory.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace llmk::ops {

// out: [T, D]; table: [V, D]; ids: [T] i32 (each in [0, V)).
// CPU: out f32, table f32/f16/bf16/any block type. CUDA: out and table of one dtype, bf16, f16
// or f32 (an id out of range on CUDA writes zeros: the host cannot check device ids without
// waiting).
void embedding(Tensor& out, const Tensor& table, const Tensor& ids);

// out, x: [..., D] (may alias); w: [D] f32. CPU: f32. CUDA: x, out bf16 (or f16, f32).
// y = x / sqrt(mean(x^2) + eps) * w, or * (1 + w) when add_one (Gemma).
void rms_norm(Tensor& out, const Tensor& x, const Tensor& w, float eps, bool add_one = false);

// The pre-norm residual step, fused: x += delta (skipped when delta is undefined), then
// out = rms_norm(x, w). x, delta, out: [T, D] (out must not alias x or delta); w: [D] f32.
// CPU: f32. CUDA: bf16 (or f16, f32), with the sum rounded to that once before the norm reads
// it, exactly as separate add and rms_norm would.
void add_rms_norm(Tensor& x, const Tensor& delta, Tensor& out, const Tensor& w, float eps,
                  bool add_one = false);

enum class RopeLayout {
  Adjacent,   // rotates pairs (2i, 2i+1): GGUF llama files (the converter permuted Q/K)
  HalfSplit,  // rotates pairs (i, i + rot_dim/2): NeoX, HF Llama/Qwen2/Gemma
};
struct RopeParams {
  int rot_dim = 0;         // rotated dims from the start of each head (even, <= head dim); 0 = all
  float theta = 10000.0f;  // base: inv_freq[i] = theta^(-2i/rot_dim)
  RopeLayout layout = RopeLayout::HalfSplit;
  float freq_scale = 1.0f;  // linear position scaling: angle = pos * freq_scale * inv_freq
  const Tensor* freq_factors =
      nullptr;  // optional [rot_dim/2] f32: inv_freq[i] /= factors[i] (llama3)
};
// x: [T, H, D], rotated in place (CPU f32, CUDA bf16, f16 or f32); positions: [T] i32.
void rope(Tensor& x, const Tensor& positions, const RopeParams& p);

// out: [M, N] = x [M, K] @ w^T + bias, with w: [N, K]; bias: optional [N].
// CPU: x, out, bias f32; w f32/f16/bf16/Q8_0/Q4_0/Q4_1/Q5_0/Q4_K/Q6_K (dequantised block by
// block, spread over threads). CUDA (cuBLASLt): x, w of one dtype, bf16 (or f16, f32); out bf16,
// f16 or f32 (for logits); bias bf16, f16 or f32, added in the epilogue; fp32 accumulation.
void linear(Tensor& out, const Tensor& x, const Tensor& w, const Tensor* bias = nullptr);
// out += x @ w^T + bias, the same operands: a layer's residual add done by the linear (on CUDA
// in cuBLASLt's epilogue, the sum rounded once; one row takes cuBLASLt, not the one-row kernel).
void linear_add(Tensor& out, const Tensor& x, const Tensor& w, const Tensor* bias = nullptr);

// The scales of an 8-bit KV cache (kernels/kv_quant.h): caches F8E4M3 or I8 [L, Hkv, D], row j's
// head h of K being k_cache[j, h] x k[j, h] (likewise V), k and v F32 [L, Hkv], contiguous.
struct KvScales {
  Tensor k, v;
};

struct AttentionParams {
  float scale = 0.0f;    // multiplies q.k; 0 = 1/sqrt(D)
  int window = 0;        // sliding window: query at p sees keys in (p - window, p]; 0 = unlimited
  float softcap = 0.0f;  // logits = softcap * tanh(logits / softcap); 0 = off
  // CUDA decode kernel: may read the index tensors (positions, cu_q, page table) and the K/V
  // rows of keys before each sequence's first query before the kernel launched just before it
  // on the stream has finished (cuda::AttentionArgs::decode_early_reads). Set only when that
  // kernel writes none of them.
  bool early_reads = false;
  // attention_paged over 8-bit pools: their scales (CUDA: the fallback kernel reads them).
  const KvScales* kv_scales = nullptr;
};
// Causal grouped-query attention of T new queries over a KV cache.
// q: [T, Hq, D]; k, v: [L, Hkv, D] caches; positions: [T] i32, consecutive
// (positions[t] = positions[0] + t), with positions[T-1] < L. Query t sits at position
// positions[t] and sees cache rows j <= positions[t] (within the window). Hq must be a multiple
// of Hkv; query head h reads KV head h / (Hq / Hkv). out: [T, Hq, D].
// CPU: f32, and the positions are checked. CUDA: bf16 or f16 (f32: the fallback kernel);
// positions are read on the device (not
// checked: a position past the cache is the caller's error), so one captured decode step
// replays at every position.
void attention(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v,
               const Tensor& positions, const AttentionParams& p);

// Attention over a variable-length batch of B packed sequences (prefill). Sequence b owns q rows
// [cu_q[b], cu_q[b+1]) and k/v rows [cu_k[b], cu_k[b+1]); q: [Tq, Hq, D] with Tq = cu_q[B];
// k, v: [Tk, Hkv, D] with Tk >= cu_k[B]; cu_q, cu_k: [B + 1] i32, non-decreasing from 0; out:
// [Tq, Hq, D]. causal: masks bottom-right aligned, so query i of a sequence with nq queries and
// nk keys sits at position i + nk - nq and sees keys j <= that position (within the window;
// none when it is negative: that out row is 0). Not causal: every key of its sequence (window
// must be 0). lse (optional): [Hq, Tq] f32, the natural log-sum-exp of each row's scaled (and
// capped) logits, -inf for a row that sees no key.
// CPU: f32, the offsets are checked. CUDA: q, k, v, out all bf16 or all f16; cu_q, cu_k and lse
// in device memory (the offsets are not checked: wrong ones are the caller's error).
struct AttentionVarlenParams : AttentionParams {
  bool causal = true;
};
void attention_varlen(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v,
                      const Tensor& cu_q, const Tensor& cu_k, const AttentionVarlenParams& p,
                      Tensor* lse = nullptr);

// Attention of B sequences over a paged KV cache (decode steps, or short chunks of a prompt).
// q, out: [T, Hq, D]; k_pool, v_pool: [pages * page_size, Hkv, D]; page_table: [B, P] i32: key j
// of sequence b is pool row page_table[b, j / page_size] * page_size + j % page_size. cu_q:
// [B + 1] i32, sequence b owns q rows [cu_q[b], cu_q[b+1]) (undefined: one sequence, B = 1,
// owning every row); positions: [T] i32, each q row's
// position in its sequence (consecutive within a sequence); sequence b sees its keys 0..(its
// last row's position), causally (within the window). max_q_per_seq: a host-known bound on
// any sequence's rows (sizes the CUDA grid).
// CPU: f32, every index checked. CUDA: bf16 or f16 (f32, and f16 over 8-bit caches: the
// fallback kernel); cu_q, positions and page_table in device memory,
// unchecked (a captured step replays as they change). Up to 8 rows per sequence run in the
// split-KV decode kernel; a single sequence with more runs in chunks of 8 (slow: meant for
// short continuations; prompts should gather their keys and use ops::attention). Head dims
// other than 64/80/96/112/128/256 run the generic fallback kernel, a batch one sequence at a
// time (with more than one row per sequence, after reading cu_q back: that waits for the
// device).
void attention_paged(Tensor& out, const Tensor& q, const Tensor& k_pool, const Tensor& v_pool,
                     const Tensor& page_table, int64_t page_size, const Tensor& cu_q,
                     const Tensor& positions, int64_t max_q_per_seq, const AttentionParams& p);

// Batch invariance on CUDA: while a BatchInvariance scope that is on lives on this thread, the
// ops compute each output row the same way whatever the rows beside it (linear: one cuBLASLt
// algorithm for every row count, cuda::LinearArgs::batch_invariant; the decode kernel: one key
// split per sequence), so a sequence's results do not depend on the batch it runs in, bit for
// bit. Slower (docs/perf.md). No effect on the CPU.
class BatchInvariance {
 public:
  explicit BatchInvariance(bool on);
  ~BatchInvariance();
  BatchInvariance(const BatchInvariance&) = delete;
  BatchInvariance& operator=(const BatchInvariance&) = delete;

 private:
  bool prev_;
};
bool batch_invariant();  // whether a scope that is on is alive on this thread

// How many attention calls (attention, attention_paged, attention_varlen) ran each way since the
// last reset (process-wide). A CUDA graph replay calls no op: a captured step counts once, when
// it was captured.
struct AttentionStats {
  uint64_t prefill = 0;   // CUDA flash prefill kernel
  uint64_t decode = 0;    // CUDA split-KV decode kernel
  uint64_t chunked = 0;   // CUDA decode kernel over chunks of 8 queries (paged, > 8 queries)
  uint64_t fallback = 0;  // CUDA generic kernel: head dims the fast kernels lack (e.g. 96)
  uint64_t cpu = 0;       // CPU reference kernel
};
AttentionStats attention_stats();
void reset_attention_stats();

// Writes k, v: [T, Hkv, D] into rows positions[t] of the caches k_cache, v_cache: [L, Hkv, D].
// CPU: f32. CUDA: caches bf16, f16 or f32, k and v any of the three (converted, rounded to
// nearest). With scales the caches are 8-bit
// (F8E4M3 or I8, KvScales) and each row's heads are encoded with their scales written there.
void kv_append(Tensor& k_cache, Tensor& v_cache, const Tensor& k, const Tensor& v,
               const Tensor& positions, KvScales* scales = nullptr);

// out_k, out_v [n, Hkv, D] (CPU f32, CUDA bf16, f16 or f32) <- the pool rows `rows` ([n] I32) of
// k_pool, v_pool [L, Hkv, D], decoded with `scales` where the pools are 8-bit.
void kv_gather(Tensor& out_k, Tensor& out_v, const Tensor& k_pool, const Tensor& v_pool,
               const Tensor& rows, const KvScales* scales = nullptr);

// RoPE on the queries and keys of one projection, then the rotated keys and the values written
// to the caches: rope(qk, positions, p), then kv_append(k_cache, v_cache, keys, v, cache_rows)
// where keys are the last k_cache.dim(1) heads of qk: [T, Hq + Hkv, D]. One launch on CUDA
// (v bf16 there). positions give the rotation angles, cache_rows the rows written.
// With scales (8-bit caches, as kv_append) two launches on CUDA: the rotation, then the append.
void rope_kv_append(Tensor& qk, const Tensor& positions, const RopeParams& p, Tensor& k_cache,
                    Tensor& v_cache, const Tensor& v, const Tensor& cache_rows,
                    KvScales* scales = nullptr);

// The Q|K|V projection with the above: qkv = linear(x, w, bias) ([T, (n_heads + 2 Hkv) D]: query
// heads, key heads, value heads), then rope_kv_append on its heads with Hkv, D from k_cache. On
// CUDA one token with every dim rotated takes one launch: the one-row linear kernel rotates and
// appends in its epilogue, with the same roundings (its frequencies in device double precision).
// With scales (8-bit caches): the linear, then rope_kv_append.
void linear_rope_kv_append(Tensor& qkv, const Tensor& x, const Tensor& w, const Tensor* bias,
                           int64_t n_heads, const Tensor& positions, const RopeParams& p,
                           Tensor& k_cache, Tensor& v_cache, const Tensor& cache_rows,
                           KvScales* scales = nullptr);

enum class Activation { SiLU, GeluTanh };
// out, gate, up: [T, F] (out may alias either); out = act(gate) * up. CPU f32, CUDA bf16, f16 or
// f32.
void gated_act(Tensor& out, const Tensor& gate, const Tensor& up, Activation act);

// The first half of a gated MLP: out = act(x Wg^T + bg) * (x Wu^T + bu) with w = [Wg; Wu]
// ([2F, K], the stacked gate|up weight) and bias likewise [2F] (optional). out: [T, F]. Runs
// linear(scratch, x, w, bias) then gated_act(out, scratch's halves); scratch: [T, 2F]. On CUDA a
// single row (a decode step) takes one launch that leaves scratch alone: the one-row linear
// kernel applies the activation as it writes, with the same roundings.
void linear_gated(Tensor& out, const Tensor& x, const Tensor& w, Activation act, Tensor& scratch,
                  const Tensor* bias = nullptr);

// out, a, b: same shape (out may alias a or b). out = a + b. CPU f32, CUDA bf16, f16 or f32.
void add(Tensor& out, const Tensor& a, const Tensor& b);
// x *= s, in place. CPU f32, CUDA bf16, f16 or f32.
void scale(Tensor& x, float s);
// Softmax over the last dimension; out, x: [..., N] (may alias). CPU f32; CUDA f32 or bf16.
void softmax(Tensor& out, const Tensor& x);
// out: [M] i32 = index of the largest element of each row of x: [M, N] (the lowest index among
// equals). CPU f32; CUDA f32 or bf16.
void argmax(Tensor& out, const Tensor& x);
// out: [M] i32 = a token drawn from each row of logits [M, N] f32 at temperature[r] among the
// tokens within min_p[r] of the most likely one (0: all), by the Gumbel-max trick with noise
// keyed by seed[r] (kernels/gumbel.h): the same seed and logits give the same token, on the CPU
// and CUDA alike. temperature, min_p: [M] f32 (> 0; [0, 1), checked on the CPU); seed: [M] i64.
void sample_gumbel(Tensor& out, const Tensor& logits, const Tensor& temperature,
                   const Tensor& min_p, const Tensor& seed);
// The sampler's penalties (engine/sampler.h) applied to logits [M, N] f32 (last dimension
// contiguous) in place: for each row i of at ([n, 2] i32: row, column; distinct places) the
// logit there becomes penalty::apply(logit, by[i][0], by[i][1]) (kernels/penalty.h: the
// repetition factor, then the amount subtracted); the same bits on the CPU and CUDA. at and by
// (f32 [n, 2]) contiguous, on the logits' device.
void apply_penalties(Tensor& logits, const Tensor& at, const Tensor& by);
// The largest k of ops::topk_lse.
inline constexpr int64_t kMaxTopk = 1024;
// Per row of logits: [rows, vocab] f32 (last dimension contiguous), the k largest logits and
// their columns, and the log-sum-exp (a teacher's top-k logits for offline distillation; a
// log-probability is logit - lse). ids: [rows, k] i32, values: [rows, k] f32 (both contiguous),
// values descending and equal values by ascending id; lse: [rows] f32 (contiguous).
// 1 <= k <= min(vocab, kMaxTopk). CPU and CUDA give the same ids and values bit for bit, and
// lse within float rounding; non-finite logits as kernels/cpu/topk.h says. lse_scale ([rows] f32,
// finite and > 0, contiguous): lse is that of each row times its scale (the normaliser of a
// sampler's softmax at temperature 1 / scale); ids and values stay the logits'.
void topk_lse(Tensor& ids, Tensor& values, Tensor& lse, const Tensor& logits,
              const Tensor* lse_scale = nullptr);
// dst = src, same shape and device; either may be strided; converts between f32/f16/bf16.
void copy(Tensor& dst, const Tensor& src);

}  // namespace llmk::ops

namespace llmk::ops {

// dst = src between the host and a device (either direction), same shape and dtype, both
// contiguous. Host-to-device copies are queued on cuda::current_stream() and return at once
// (CUDA stages pageable memory first); device-to-host copies wait for the stream, since the
// host is about to read the result.
void transfer(Tensor& dst, const Tensor& src);

// out = src converted to out's dtype (f32 or bf16), dequantising block types row by row.
// CPU only (used at load time); src: [..., K] of any dtype llmk reads; out: same shape.
void dequantize(Tensor& out, const Tensor& src);

}  // namespace llmk::ops
