// The pre-norm decoder shared by every family llmk runs: RMSNorm, RoPE, grouped-query
// attention, a gated MLP. ModelConfig switches the family's differences on: Q/K/V biases
// (Qwen2), QK-norm, norms after attention and MLP, GELU-tanh, a scaled embedding and
// alternating sliding-window/global layers with their own RoPE base (Gemma 3).
#include "model/decoder.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "core/error.h"
#ifdef LLMK_HAS_CUDA
#include "core/cuda/device.h"
#endif
#include "model/blocks.h"
#include "model/memory_check.h"
#include "ops/ops.h"

namespace llmk {

namespace {

// LoadOptions::dtype resolved for the device, or an error naming what it takes.
DType checked_activations(const LoadOptions& opts) {
  if (opts.dtype) {
    const DType t = *opts.dtype;
    LLMK_CHECK(opts.device != Device::CPU || t == DType::F32,
               "load: dtype {}: the CPU computes in f32", dtype_name(t));
    LLMK_CHECK(is_float_type(t), "load: dtype {}: the GPU computes in bf16, f16 or f32",
               dtype_name(t));
  }
  return activation_dtype(opts.device, opts.dtype);
}

struct LayerWeights {
  Tensor attn_norm;                      // [d_model] f32
  Tensor q_norm, k_norm;                 // [D] f32, QK-norm (Gemma 3)
  Tensor post_attn_norm, post_ffw_norm;  // [d_model] f32, norms of the block outputs (Gemma 3)
  Projection qkv;                        // Q|K|V: [Hq*D + 2*Hkv*D, d_model], biases for Qwen2
  Tensor wo;                             // [d_model, Hq*D]
  Tensor ffn_norm;                       // [d_model] f32
  Projection gate_up;                    // gate|up: [2*d_ff, d_model]
  Tensor w_down;                         // [d_model, d_ff]
};

// Activations for up to `capacity` tokens (act dtype: f32 on the CPU, bf16, f16 or f32 on CUDA),
// reused across calls so that steady-state decoding allocates nothing. qkv and attn live in
// gate_up's memory where they fit, act over its gate half (reserve()).
struct Scratch {
  int64_t capacity = 0;
  Tensor x, h, qkv, attn, o, gate_up, act, logits;
};

class DecoderModel final : public Model {
 public:
  DecoderModel(const std::string& path, ModelConfig config, int64_t context,
               const LoadOptions& opts, const WeightSource& src)
      : Model(path, std::move(config), context, opts.sequences, opts.device),
        act_(checked_activations(opts)),
        kv_(opts.kv_type == KvType::FP8    ? DType::F8E4M3
            : opts.kv_type == KvType::INT8 ? DType::I8
                                           : act_),
        kv8_(opts.kv_type != KvType::Auto),
        batch_invariant_(opts.batch_invariant),
        host_embeddings_(opts.host_embeddings && opts.device != Device::CPU),
        page_size_(opts.page_size),
        scratch_(opts.scratch_page ? 1 : 0) {
    LLMK_CHECK(opts.page_size >= 0, "page size {} must be >= 0", opts.page_size);
    check_layer_count(src, this->config().n_layers);
    // Batch-invariant runs keep bf16 weights: the quantised linear takes another path above 8
    // rows (qlinear.h), so a row's bits would depend on the rows beside it.
    WeightLoader loader(src, opts.device, opts.progress, act_,
                        opts.quantized_weights && !opts.batch_invariant);
    load_weights(loader);  // planning pass: shapes checked, bytes counted, nothing copied
    pool_pages_ = sequences() * pages_per_sequence() + scratch_;
    if (opts.kv_memory != 0) size_pool(path, opts.kv_memory, loader.planned_bytes());
    check_device_memory(path, opts.device, loader.planned_bytes(), kv_cache_bytes(),
                        activation_bytes(kPlannedTokens));
    loader.finish_plan();
    load_weights(loader);
    allocate_cache();
    const int64_t cap = std::max(this->context(), sequences());
    allocate_staging(cap);
  }

 protected:
  int32_t cache_row(int64_t seq, int64_t pos) override;
  void on_staged() override;

  Tensor compute(int64_t t, bool all_logits) override;
  void reserve(int64_t t, bool all_logits) override;
  DType kv_dtype() const override { return kv_; }
  DType dtype() const override { return act_; }

 private:
  // Activation memory is checked up front for a prompt of this many tokens.
  static constexpr int64_t kPlannedTokens = 512;

  void load_weights(WeightLoader& w);
  void allocate_cache();
  uint64_t kv_cache_bytes() const;  // the pool and the gather buffers
  uint64_t gather_bytes() const;    // k_gather_ and v_gather_ (CUDA)
  uint64_t activation_bytes(int64_t t) const;
  // Keys per page of the KV pool: on CUDA a page a few tiles of the decode kernel long; on the
  // CPU one page per sequence (its keys stay contiguous for the CPU kernel).
  int64_t page_size() const {
    if (page_size_ > 0) return page_size_;
    return device() == Device::CUDA ? kPageSizeCuda : context();
  }
  int64_t kv_page_size() const override { return page_size(); }
  int64_t kv_pages() const override { return pool_pages_ - scratch_; }
  int32_t kv_scratch_page() const override {
    return scratch_ > 0 ? static_cast<int32_t>(pool_pages_ - 1) : -1;
  }
  void copy_kv_page(int32_t src, int32_t dst, int64_t rows) override;
  int64_t pages_per_sequence() const { return (context() + page_size() - 1) / page_size(); }
  int64_t pool_rows() const { return pool_pages_ * page_size(); }
  // Sizes the pool from LoadOptions::kv_memory (see there) before the memory check.
  void size_pool(const std::string& path, int64_t kv_memory, uint64_t weight_bytes);
  // Prompts longer than this (CUDA) gather their sequence's keys for the prefill kernel.
  bool gathers(int64_t t) const {
    return device() == Device::CUDA && t > kMaxPagedQueries && !staged_.one_per_sequence;
  }
  static constexpr int64_t kPageSizeCuda = 64;
  static constexpr int64_t kMaxPagedQueries = 8;

  DType act_;
  DType kv_;  // the KV pool's elements: act_, or 8-bit (kv8_) with kv_scales_
  bool kv8_;
  bool batch_invariant_;  // LoadOptions::batch_invariant
  bool host_embeddings_;  // LoadOptions::host_embeddings, on CUDA
  // Bytes of one pool row's K or V: its heads' elements and, 8-bit, their float scales.
  int64_t kv_row_bytes() const {
    const ModelConfig& c = config();
    return bytes_for(kv_, c.n_kv_heads * c.head_dim) + (kv8_ ? 4 * c.n_kv_heads : 0);
  }
  // The 8-bit pools' scales per layer ([pool rows, Hkv] f32 each for K and V); empty otherwise.
  std::vector<ops::KvScales> kv_scales_;
  ops::KvScales* scales(size_t layer) { return kv8_ ? &kv_scales_[layer] : nullptr; }
  int64_t page_size_;       // LoadOptions::page_size (0: page_size()'s default)
  int64_t scratch_;         // 1: the pool's last page is kv_scratch_page()
  int64_t pool_pages_ = 0;  // pages in the KV pool, the scratch page's included
  Tensor tok_embd_, output_norm_, output_;
  Tensor rope_freqs_;  // [rope_dim/2] f32 divisors of the global layers' frequencies, or undefined
  std::vector<LayerWeights> layers_;
  // The paged KV cache. Per layer a pool [pool_rows, Hkv, D] of pages of page_size() rows; key j
  // of sequence s is row page_table_[s, j / page_size] * page_size + j % page_size. Pages are
  // handed out in the order sequences first reach them (so sequences' pages interleave) and are
  // kept for reuse; the pool holds every sequence's full context, so it never runs out.
  std::vector<Tensor> k_cache_, v_cache_;
  std::vector<int32_t> host_pages_;  // [sequences, pages_per_sequence], -1 = not yet given out
  int32_t next_page_ = 0;
  bool pages_dirty_ = true;
  Tensor page_table_;  // [sequences, pages_per_sequence] i32 (device), fixed address
  Tensor cu_batch_;    // [sequences + 1] i32: 0, 1, ..., one query per sequence
  // Pool rows of the keys gathered for the prefill kernel (i32): keys 0.. of the staged sequence,
  // or of each long run after position 0 one after another (run_attention_'s rows_at); grown as
  // needed from a context's worth.
  Tensor gather_rows_;
  std::vector<int32_t> host_gather_;
  void upload_gather_rows();  // host_gather_ -> gather_rows_
  // attention(out, q) over n keys gathered into k_gather_ / v_gather_ by gather_rows_[at, at + n).
  void attend_gathered(Tensor& out, const Tensor& q, const Tensor& positions, int64_t at, int64_t n,
                       size_t layer, const ops::AttentionParams& ap);
  Tensor k_gather_, v_gather_;  // [context, Hkv * D]: a prompt's keys, contiguous (CUDA)
  // Staged runs on CUDA where some run has more than kMaxPagedQueries tokens (no paged kernel
  // takes those together with others): the leading runs of at most that many go to the paged
  // kernel in one launch (the scheduler puts decode tokens first), each later run alone: a short
  // one through the paged kernel, a long one through the prefill kernel over its keys (the
  // projection's own from position 0, else gathered from its pages).
  struct RunAttention {
    int64_t run, q0, n, pos;
    int64_t rows_at;  // offset of its key rows in gather_rows_ (-1: none gathered)
  };
  int64_t lead_runs_ = -1;  // -1: one launch for all staged runs
  int64_t lead_max_ = 0;
  std::vector<RunAttention> run_attention_;
  void plan_run_attention();
  void attention_by_run(Tensor& attn, const Tensor& q, const Tensor& k, const Tensor& v,
                        size_t layer, const ops::AttentionParams& ap);
  Scratch s_;
};

void DecoderModel::load_weights(WeightLoader& w) {
  const ModelConfig& c = config();
  const int64_t d = c.d_model, qd = c.n_heads * c.head_dim, kvd = c.n_kv_heads * c.head_dim;
  tok_embd_ = host_embeddings_ && !c.tied_embeddings
                  ? w.host_matrix("token_embd.weight", {c.vocab_size, d})
                  : w.matrix("token_embd.weight", {c.vocab_size, d});
  output_norm_ = w.vector("output_norm.weight", {d});
  // GGUF files leave out output.weight when it is tied; HF configs say so explicitly
  // (tie_word_embeddings), and a missing lm_head.weight is then an error, not the embeddings.
  output_ = c.tied_embeddings ? tok_embd_ : w.matrix("output.weight", {c.vocab_size, d});
  // Llama 3 rope scaling: GGUF files carry the divisors as a tensor, config.json as numbers.
  if (w.has("rope_freqs.weight")) {
    rope_freqs_ = w.vector("rope_freqs.weight", {c.rope_dim / 2});
  } else if (!c.rope_freq_factors.empty() && !w.planning()) {
    const auto n = static_cast<int64_t>(c.rope_freq_factors.size());
    rope_freqs_ = Tensor::empty({n}, DType::F32, device());
    ops::transfer(rope_freqs_,
                  Tensor::borrow(const_cast<float*>(c.rope_freq_factors.data()), {n}, DType::F32));
  }
  layers_.resize(static_cast<size_t>(c.n_layers));
  for (int64_t i = 0; i < c.n_layers; ++i) {
    const std::string b = fmt::format("blk.{}.", i);
    LayerWeights& l = layers_[static_cast<size_t>(i)];
    l.attn_norm = w.vector(b + "attn_norm.weight", {d});
    if (c.fused_qkv) {  // one stored tensor: a projection of one part
      l.qkv.load(w, {b + "attn_qkv.weight"}, {{qd + 2 * kvd, d}}, {b + "attn_qkv.bias"});
    } else {
      l.qkv.load(w, {b + "attn_q.weight", b + "attn_k.weight", b + "attn_v.weight"},
                 {{qd, d}, {kvd, d}, {kvd, d}},
                 {b + "attn_q.bias", b + "attn_k.bias", b + "attn_v.bias"});
    }
    l.wo = w.matrix(b + "attn_output.weight", {d, qd});
    l.ffn_norm = w.vector(b + "ffn_norm.weight", {d});
    if (c.qk_norm) {
      l.q_norm = w.vector(b + "attn_q_norm.weight", {c.head_dim});
      l.k_norm = w.vector(b + "attn_k_norm.weight", {c.head_dim});
    }
    if (c.sandwich_norms) {
      l.post_attn_norm = w.vector(b + "post_attention_norm.weight", {d});
      l.post_ffw_norm = w.vector(b + "post_ffw_norm.weight", {d});
    }
    if (c.fused_gate_up) {  // ffn_up holds gate|up
      l.gate_up.load(w, {b + "ffn_up.weight"}, {{2 * c.d_ff, d}});
    } else {
      l.gate_up.load(w, {b + "ffn_gate.weight", b + "ffn_up.weight"}, {{c.d_ff, d}, {c.d_ff, d}});
    }
    l.w_down = w.matrix(b + "ffn_down.weight", {d, c.d_ff});
  }
}

void DecoderModel::size_pool(const std::string& path, int64_t kv_memory, uint64_t weight_bytes) {
  const ModelConfig& c = config();
  const auto page_bytes = static_cast<uint64_t>(2 * c.n_layers * page_size() * kv_row_bytes());
  (void)weight_bytes;  // read where CUDA is built
  uint64_t budget = 0;
  if (kv_memory > 0) {
    budget = static_cast<uint64_t>(kv_memory);
  } else {
    LLMK_CHECK(kv_memory == LoadOptions::kKvMemoryFree, "{}: kv_memory {} must be >= 0 or {}", path,
               kv_memory, LoadOptions::kKvMemoryFree);
    if (device() == Device::CPU) return;  // sequences x context
#ifdef LLMK_HAS_CUDA
    const uint64_t free = cuda::mem_info().first;
    const uint64_t taken =
        weight_bytes + activation_bytes(kPlannedTokens) + gather_bytes() + kDeviceMemoryMargin;
    budget = free > taken ? (free - taken) / 10 * 9 : 0;
#endif
  }
  constexpr int64_t kMaxRows = std::numeric_limits<int32_t>::max();  // the kernels' row index
  const int64_t pages =
      std::min<int64_t>(static_cast<int64_t>(budget / page_bytes), kMaxRows / page_size());
  // (The scratch page, an engine's, is not counted as the sequences'.)
  LLMK_CHECK(pages - scratch_ >= pages_per_sequence(),
             "{}: a KV pool of {:.2f} GiB holds {} pages of {} tokens ({:.2f} MiB each), fewer "
             "than one context of {} tokens needs ({}); grant more memory or a shorter context",
             path, static_cast<double>(budget) / (1ull << 30),
             std::max<int64_t>(0, pages - scratch_), page_size(),
             static_cast<double>(page_bytes) / (1ull << 20), context(), pages_per_sequence());
  pool_pages_ = pages;
}

uint64_t DecoderModel::gather_bytes() const {
  const ModelConfig& c = config();
  const int64_t rows = device() == Device::CUDA ? context() : 0;
  return 2ull * static_cast<uint64_t>(bytes_for(act_, rows * c.n_kv_heads * c.head_dim));
}

uint64_t DecoderModel::kv_cache_bytes() const {
  const ModelConfig& c = config();
  return 2ull * static_cast<uint64_t>(c.n_layers * pool_rows() * kv_row_bytes()) + gather_bytes();
}

uint64_t DecoderModel::activation_bytes(int64_t t) const {
  const ModelConfig& c = config();
  const int64_t qkv_attn = 2 * c.n_heads * c.head_dim + 2 * c.n_kv_heads * c.head_dim;
  const int64_t per_token = 3 * c.d_model + 2 * c.d_ff + (qkv_attn <= 2 * c.d_ff ? 0 : qkv_attn);
  return static_cast<uint64_t>(bytes_for(act_, t * per_token) + 4 * c.vocab_size);
}

void DecoderModel::allocate_cache() {
  const ModelConfig& c = config();
  // One allocation for every layer's keys and values: separate ones would each be rounded up to
  // the allocator's 2 MiB (126 MiB over 64 caches of 4k rows of Llama-3-8B).
  const Tensor pool =
      Tensor::empty({2 * c.n_layers, pool_rows(), c.n_kv_heads, c.head_dim}, kv_, device());
  for (int64_t i = 0; i < c.n_layers; ++i) {
    k_cache_.push_back(pool.select(0, 2 * i));
    v_cache_.push_back(pool.select(0, 2 * i + 1));
    if (kv8_) {                 // zeros: a row read before it is written (never, but) decodes to 0
      const auto zeros = [&] {  // on the CPU to(CPU) is the host tensor itself: one each
        return Tensor::zeros({pool_rows(), c.n_kv_heads}, DType::F32).to(device());
      };
      kv_scales_.push_back({zeros(), zeros()});
    }
  }
  const int64_t S = sequences(), P = pages_per_sequence();
  host_pages_.assign(static_cast<size_t>(S * P), -1);
  page_table_ = Tensor::empty({S, P}, DType::I32, device());
  Tensor cu = Tensor::empty({S + 1}, DType::I32);
  for (int64_t b = 0; b <= S; ++b) cu.data<int32_t>()[b] = static_cast<int32_t>(b);
  cu_batch_ = Tensor::empty({S + 1}, DType::I32, device());
  ops::transfer(cu_batch_, cu);
  if (device() == Device::CUDA) {
    gather_rows_ = Tensor::empty({context()}, DType::I32, device());
    k_gather_ = Tensor::empty({context(), c.n_kv_heads * c.head_dim}, act_, device());
    v_gather_ = Tensor::empty({context(), c.n_kv_heads * c.head_dim}, act_, device());
  }
}

int32_t DecoderModel::cache_row(int64_t seq, int64_t pos) {
  const int64_t ps = page_size();
  int32_t& page = host_pages_[static_cast<size_t>(seq * pages_per_sequence() + pos / ps)];
  if (page < 0) {
    LLMK_CHECK(next_page_ < kv_pages(),
               "forward: the KV pool's {} pages of {} tokens are all in use (it was sized for the "
               "many-sequence engine, which hands pages out itself)",
               kv_pages(), ps);
    page = next_page_++;
    pages_dirty_ = true;
  }
  return static_cast<int32_t>(page * ps + pos % ps);
}

void DecoderModel::copy_kv_page(int32_t src, int32_t dst, int64_t rows) {
  const int64_t ps = page_size();
  LLMK_CHECK(src >= 0 && dst >= 0 && src < kv_pages() && dst < kv_pages() && src != dst &&
                 rows >= 0 && rows <= ps,
             "copy_kv_page: {} rows of page {} to page {} (pool of {} pages of {})", rows, src, dst,
             kv_pages(), ps);
  for (size_t i = 0; i < k_cache_.size(); ++i) {
    std::vector<Tensor*> pools = {&k_cache_[i], &v_cache_[i]};
    if (kv8_) pools.insert(pools.end(), {&kv_scales_[i].k, &kv_scales_[i].v});
    for (Tensor* pool : pools) {
      Tensor to = pool->slice(0, dst * ps, dst * ps + rows);
      ops::copy(to, pool->slice(0, src * ps, src * ps + rows));
    }
  }
}

namespace {
// The paged attention call follows kv_append, which writes only the new tokens' K/V rows; the
// indices (positions, cu_q, page table) are staged from the host before the step. So the decode
// kernel may read those and the older keys' rows while kv_append finishes.
ops::AttentionParams paged_params(const ops::AttentionParams& p) {
  ops::AttentionParams q = p;
  q.early_reads = true;
  return q;
}
}  // namespace

void DecoderModel::plan_run_attention() {
  lead_runs_ = -1;
  run_attention_.clear();
  if (device() != Device::CUDA || runs_.max_run <= kMaxPagedQueries) return;
  // Batch-invariant: every run's queries through the decode kernel (longer runs in chunks of 8),
  // so that a row's attention does not depend on how its prompt was cut into chunks.
  const auto b = static_cast<int64_t>(runs_.pos.size());
  const int64_t ps = page_size();
  const auto cu = [&](int64_t r) {
    return static_cast<int64_t>(runs_.host_cu[static_cast<size_t>(r)]);
  };
  int64_t lead = 0;
  lead_max_ = 0;
  while (lead < b && cu(lead + 1) - cu(lead) <= kMaxPagedQueries) {
    lead_max_ = std::max(lead_max_, cu(lead + 1) - cu(lead));
    ++lead;
  }
  lead_runs_ = lead;
  host_gather_.clear();
  for (int64_t r = lead; r < b; ++r) {
    const int64_t q0 = cu(r), n = cu(r + 1) - q0, pos = runs_.pos[static_cast<size_t>(r)];
    int64_t at = -1;
    if (n > kMaxPagedQueries && (pos > 0 || kv8_) && !batch_invariant_) {  // 8-bit: as cached
      at = static_cast<int64_t>(host_gather_.size());
      const int32_t* table = runs_.host_table.data() + r * runs_.width;
      for (int64_t j = 0; j < pos + n; ++j)
        host_gather_.push_back(static_cast<int32_t>(table[j / ps] * ps + j % ps));
    }
    run_attention_.push_back({r, q0, n, pos, at});
  }
  upload_gather_rows();
}

void DecoderModel::upload_gather_rows() {
  const auto rows = static_cast<int64_t>(host_gather_.size());
  if (rows == 0) return;
  if (gather_rows_.dim(0) < rows) gather_rows_ = Tensor::empty({rows}, DType::I32, device());
  Tensor dst = gather_rows_.slice(0, 0, rows);
  ops::transfer(dst, Tensor::borrow(host_gather_.data(), {rows}, DType::I32));
}

void DecoderModel::attend_gathered(Tensor& out, const Tensor& q, const Tensor& positions,
                                   int64_t at, int64_t n, size_t layer,
                                   const ops::AttentionParams& ap) {
  const int64_t hkv = config().n_kv_heads, d = config().head_dim;
  Tensor kg = k_gather_.slice(0, 0, n), vg = v_gather_.slice(0, 0, n);
  const Tensor rows = gather_rows_.slice(0, at, at + n);
  if (kv8_) {  // decoded
    Tensor kg3 = kg.view({n, hkv, d}), vg3 = vg.view({n, hkv, d});
    ops::kv_gather(kg3, vg3, k_cache_[layer], v_cache_[layer], rows, scales(layer));
  } else {
    ops::embedding(kg, k_cache_[layer].view({pool_rows(), hkv * d}), rows);
    ops::embedding(vg, v_cache_[layer].view({pool_rows(), hkv * d}), rows);
  }
  ops::attention(out, q, kg.view({n, hkv, d}), vg.view({n, hkv, d}), positions, ap);
}

void DecoderModel::attention_by_run(Tensor& attn, const Tensor& q, const Tensor& k, const Tensor& v,
                                    size_t layer, const ops::AttentionParams& ap) {
  const Tensor positions = staged_positions();
  if (lead_runs_ > 0) {
    const int64_t rows = runs_.host_cu[static_cast<size_t>(lead_runs_)];
    Tensor out = attn.slice(0, 0, rows);
    ops::attention_paged(out, q.slice(0, 0, rows), k_cache_[layer], v_cache_[layer],
                         runs_.table.slice(0, 0, lead_runs_), page_size(),
                         runs_.cu.slice(0, 0, lead_runs_ + 1), positions.slice(0, 0, rows),
                         lead_max_, paged_params(ap));
  }
  for (const RunAttention& ra : run_attention_) {
    Tensor out = attn.slice(0, ra.q0, ra.q0 + ra.n);
    const Tensor qr = q.slice(0, ra.q0, ra.q0 + ra.n);
    const Tensor pr = positions.slice(0, ra.q0, ra.q0 + ra.n);
    if (ra.n <= kMaxPagedQueries || batch_invariant_) {
      ops::attention_paged(out, qr, k_cache_[layer], v_cache_[layer],
                           runs_.table.slice(0, ra.run, ra.run + 1), page_size(), Tensor{}, pr,
                           ra.n, paged_params(ap));
    } else if (ra.rows_at < 0) {  // its keys are exactly the projection's (rotated) K and V
      ops::attention(out, qr, k.slice(0, ra.q0, ra.q0 + ra.n), v.slice(0, ra.q0, ra.q0 + ra.n), pr,
                     ap);
    } else {
      attend_gathered(out, qr, pr, ra.rows_at, ra.pos + ra.n, layer, ap);
    }
  }
}

void DecoderModel::on_staged() {
  if (staged_.runs) plan_run_attention();
  // The prompt's sequence, keys 0 .. pos + T - 1 (none to gather from position 0: compute()
  // reads the new keys from the projection).
  if (!staged_.runs && gathers(staged_.tokens) && (staged_.pos > 0 || kv8_)) {
    const int64_t n = staged_.pos + staged_.tokens;
    host_gather_.resize(static_cast<size_t>(n));
    for (int64_t j = 0; j < n; ++j)
      host_gather_[static_cast<size_t>(j)] = cache_row(staged_.seq, j);
    upload_gather_rows();
  }
  if (pages_dirty_) {  // pages not yet given out read as page 0: no key of theirs is visible
    std::vector<int32_t> table(host_pages_.size());
    for (size_t i = 0; i < table.size(); ++i) table[i] = std::max(host_pages_[i], 0);
    ops::transfer(page_table_, Tensor::borrow(table.data(), page_table_.shape(), DType::I32));
    pages_dirty_ = false;
  }
}

void DecoderModel::reserve(int64_t t, bool all_logits) {
  const ModelConfig& c = config();
  const Device dev = device();
  if (t > s_.capacity) {
    s_.capacity = t;
    moved_buffers();
    const int64_t qkv = (c.n_heads + 2 * c.n_kv_heads) * c.head_dim;
    const int64_t qd = c.n_heads * c.head_dim;
    s_.x = Tensor::empty({t, c.d_model}, act_, dev);
    s_.h = Tensor::empty({t, c.d_model}, act_, dev);
    s_.o = Tensor::empty({t, c.d_model}, act_, dev);
    s_.gate_up = Tensor::empty({t, 2 * c.d_ff}, act_, dev);
    // act(gate) * up goes over the gate half (gated_act runs in place); the down projection
    // reads it with gate|up's row stride.
    s_.act = s_.gate_up.slice(1, 0, c.d_ff);
    if (qkv + qd <= 2 * c.d_ff) {
      // Q|K|V and the attention's output share gate|up's memory: a layer is done with them
      // before its gate|up is written, and with gate|up before the next layer's Q|K|V.
      const Tensor flat = s_.gate_up.view({t * 2 * c.d_ff});
      s_.qkv = flat.slice(0, 0, t * qkv).view({t, qkv});
      s_.attn = flat.slice(0, t * qkv, t * (qkv + qd)).view({t, c.n_heads, c.head_dim});
    } else {
      s_.qkv = Tensor::empty({t, qkv}, act_, dev);
      s_.attn = Tensor::empty({t, c.n_heads, c.head_dim}, act_, dev);
    }
  }
  const int64_t rows = all_logits ? t : 1;
  if (!s_.logits.defined() || s_.logits.dim(0) < rows) {
    s_.logits = Tensor::empty({rows, c.vocab_size}, DType::F32, dev);
    moved_buffers();
  }
}

Tensor DecoderModel::compute(int64_t t, bool all_logits) {
  const ModelConfig& c = config();
  LLMK_CHECK(t > 0 && t == staged_.tokens, "compute: {} tokens requested but {} staged", t,
             staged_.tokens);
  reserve(t, all_logits || staged_.runs);
  const ops::BatchInvariance invariance(batch_invariant_);
  const int64_t H = c.n_heads, Hkv = c.n_kv_heads, D = c.head_dim;
  const int64_t qd = H * D, kvd = Hkv * D;
  const Tensor ids = staged_ids(), positions = staged_positions();
  const Tensor cache_rows = staged_rows();
  Tensor x = s_.x.slice(0, 0, t), h = s_.h.slice(0, 0, t), o = s_.o.slice(0, 0, t);
  // Views into the Q|K|V output: [T, heads, D] with the row stride of the whole projection.
  Tensor qkv = s_.qkv.slice(0, 0, t);
  Tensor q = qkv.slice(1, 0, qd).unflatten(1, {H, D});
  Tensor k = qkv.slice(1, qd, qd + kvd).unflatten(1, {Hkv, D});
  Tensor v = qkv.slice(1, qd + kvd, qd + 2 * kvd).unflatten(1, {Hkv, D});
  Tensor qk = qkv.slice(1, 0, qd + kvd).unflatten(1, {H + Hkv, D});  // RoPE for both at once
  Tensor attn = s_.attn.slice(0, 0, t), attn2 = attn.view({t, qd});
  Tensor gate_up = s_.gate_up.slice(0, 0, t), act = s_.act.slice(0, 0, t);

  const bool one = c.norm_add_one;
  const ops::RopeParams rope_global{.rot_dim = static_cast<int>(c.rope_dim),
                                    .theta = c.rope_theta,
                                    .layout = c.rope_layout,
                                    .freq_scale = c.rope_freq_scale,
                                    .freq_factors = rope_freqs_.defined() ? &rope_freqs_ : nullptr};
  // Local layers with a base of their own (Gemma 3) are unscaled; else they share the global's.
  ops::RopeParams rope_local = rope_global;
  if (c.rope_theta_local > 0) {
    rope_local = {
        .rot_dim = rope_global.rot_dim, .theta = c.rope_theta_local, .layout = c.rope_layout};
  }
  const ops::AttentionParams attn_global{.scale = c.attn_scale, .softcap = c.attn_softcap};
  const ops::AttentionParams attn_local{.scale = c.attn_scale,
                                        .window = static_cast<int>(c.sliding_window),
                                        .softcap = c.attn_softcap};

  // Each half-layer ends with x += src @ w^T and h = norm(x). The linear adds its product to x
  // itself where it can (on CUDA in cuBLASLt's epilogue: x is read there instead of the product
  // being written and read back by the add). Not with sandwich norms (the product is normalised
  // before the add), nor for one row on CUDA, whose one-row kernel has no such epilogue: there
  // the add rides in the norm's launch; batch-invariant, one row adds in cuBLASLt too, as more do.
  // On the CPU both orders give the same f32 sums.
  const bool add_in_linear =
      !c.sandwich_norms && (t > 1 || device() == Device::CPU || batch_invariant_);
  auto residual = [&](const Tensor& src, const Tensor& w, const Tensor& post_norm,
                      const Tensor& norm) {
    if (add_in_linear) {
      ops::linear_add(x, src, w);
      ops::rms_norm(h, x, norm, c.rms_eps, one);
      return;
    }
    ops::linear(o, src, w);
    if (c.sandwich_norms) ops::rms_norm(o, o, post_norm, c.rms_eps, one);
    ops::add_rms_norm(x, o, h, norm, c.rms_eps, one);
  };

  ops::embedding(x, tok_embd_, ids);
  if (c.embed_scale != 1.0f) ops::scale(x, c.embed_scale);
  ops::rms_norm(h, x, layers_[0].attn_norm, c.rms_eps, one);
  for (size_t i = 0; i < layers_.size(); ++i) {
    const LayerWeights& l = layers_[i];
    const bool local = c.is_local(static_cast<int64_t>(i));
    // h holds attn_norm(x) here.
    const ops::RopeParams& rp = local ? rope_local : rope_global;
    if (!c.qk_norm && l.qkv.ws.empty()) {  // one launch for a decode step on CUDA
      ops::linear_rope_kv_append(qkv, h, l.qkv.w, l.qkv.bias(), H, positions, rp, k_cache_[i],
                                 v_cache_[i], cache_rows, scales(i));
    } else {
      l.qkv.apply(qkv, h);
      if (c.qk_norm) {
        ops::rms_norm(q, q, l.q_norm, c.rms_eps, one);
        ops::rms_norm(k, k, l.k_norm, c.rms_eps, one);
      }
      ops::rope_kv_append(qk, positions, rp, k_cache_[i], v_cache_[i], v, cache_rows, scales(i));
    }
    ops::AttentionParams ap = local ? attn_local : attn_global;
    ap.kv_scales = scales(i);
    if (staged_.runs && lead_runs_ >= 0) {  // CUDA, some run too long for the paged kernel
      attention_by_run(attn, q, k, v, i, ap);
    } else if (staged_.runs) {  // several sequences, each a run of tokens, keys in their pages
      ops::attention_paged(attn, q, k_cache_[i], v_cache_[i], runs_.table, page_size(), runs_.cu,
                           positions, runs_.max_run, paged_params(ap));
    } else if (gathers(t) && staged_.pos == 0 && !kv8_) {
      // A prompt from position 0: its keys are exactly the projection's (rotated) K and V.
      ops::attention(attn, q, k, v, positions, ap);
    } else if (gathers(t)) {
      // A prompt after earlier keys (or any, 8-bit: its keys as the cache holds them): its
      // sequence's keys gathered from the pages into one contiguous block for the prefill kernel.
      attend_gathered(attn, q, positions, 0, staged_.pos + t, i, ap);
    } else if (staged_.one_per_sequence) {  // token b belongs to sequence b: one launch for all
      ops::attention_paged(attn, q, k_cache_[i], v_cache_[i], page_table_.slice(0, 0, t),
                           page_size(), cu_batch_.slice(0, 0, t + 1), positions, 1,
                           paged_params(ap));
    } else {  // a step (or a short chunk) of one sequence
      const int64_t s = staged_.seq;
      ops::attention_paged(attn, q, k_cache_[i], v_cache_[i], page_table_.slice(0, s, s + 1),
                           page_size(), Tensor{}, positions, t, paged_params(ap));
    }
    residual(attn2, l.wo, l.post_attn_norm, l.ffn_norm);

    l.gate_up.apply_gated(act, h, c.activation, gate_up);
    residual(act, l.w_down, l.post_ffw_norm,
             i + 1 < layers_.size() ? layers_[i + 1].attn_norm : output_norm_);
  }
  // h = output_norm(x) for every token; the head runs on the rows whose logits are wanted.
  if (staged_.runs) {
    const int64_t n = runs_.logit_rows.dim(0);
    if (n == 0) return s_.logits.slice(0, 0, 0);
    Tensor picked = s_.o.slice(0, 0, n);  // o is free after the last layer
    ops::embedding(picked, h, runs_.logit_rows);
    Tensor logits = s_.logits.slice(0, 0, n);
    ops::linear(logits, picked, output_);
    return logits;
  }
  const Tensor normed = all_logits ? h : h.slice(0, t - 1, t);
  Tensor logits = s_.logits.slice(0, 0, normed.dim(0));
  ops::linear(logits, normed, output_);
  return logits;
}

}  // namespace

std::unique_ptr<Model> make_decoder(const std::string& path, ModelConfig config, int64_t context,
                                    const LoadOptions& opts, const WeightSource& src) {
  return std::make_unique<DecoderModel>(path, std::move(config), context, opts, src);
}

}  // namespace llmk
