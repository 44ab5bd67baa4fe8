// The Llama architecture (pre-norm decoder, RMSNorm, RoPE, grouped-query attention, SwiGLU MLP),
// as GGUF `llama` files store it.
#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"
#include "model/llama.h"
#include "model/weights.h"
#include "ops/ops.h"

namespace llmk {

namespace {

struct LayerWeights {
  Tensor attn_norm;        // [d_model] f32
  Tensor wq, wk, wv, wo;   // [Hq*D, d_model], [Hkv*D, d_model] x2, [d_model, Hq*D]
  Tensor bq, bk, bv;       // optional biases
  Tensor ffn_norm;         // [d_model] f32
  Tensor w_gate, w_up;     // [d_ff, d_model]
  Tensor w_down;           // [d_model, d_ff]
};

// Activations for up to `capacity` tokens, reused across calls so that steady-state decoding
// allocates nothing.
struct Scratch {
  int64_t capacity = 0;
  Tensor x, h, q, k, v, attn, o, gate, up, logits, positions;
};

class LlamaModel final : public Model {
 public:
  LlamaModel(gguf::File file, ModelConfig config, int64_t context)
      : Model(std::move(file), std::move(config), context) {
    load_weights();
    allocate_cache();
  }

  Tensor forward(std::span<const int32_t> tokens, int64_t pos, bool all_logits) override;

 private:
  void load_weights();
  void allocate_cache();
  void ensure_scratch(int64_t t, bool all_logits);

  Tensor tok_embd_, output_norm_, output_;
  std::vector<LayerWeights> layers_;
  std::vector<Tensor> k_cache_, v_cache_;  // per layer [context, Hkv, D] f32
  Scratch s_;
};

void LlamaModel::load_weights() {
  const ModelConfig& c = config_;
  const gguf::File& f = file_;
  const int64_t d = c.d_model, qd = c.n_heads * c.head_dim, kvd = c.n_kv_heads * c.head_dim;
  tok_embd_ = require_tensor(f, "token_embd.weight", {c.vocab_size, d});
  output_norm_ = require_f32(f, "output_norm.weight", {d});
  output_ = c.tied_embeddings ? tok_embd_ : require_tensor(f, "output.weight", {c.vocab_size, d});
  layers_.resize(static_cast<size_t>(c.n_layers));
  for (int64_t i = 0; i < c.n_layers; ++i) {
    const std::string b = fmt::format("blk.{}.", i);
    LayerWeights& l = layers_[static_cast<size_t>(i)];
    l.attn_norm = require_f32(f, b + "attn_norm.weight", {d});
    l.wq = require_tensor(f, b + "attn_q.weight", {qd, d});
    l.wk = require_tensor(f, b + "attn_k.weight", {kvd, d});
    l.wv = require_tensor(f, b + "attn_v.weight", {kvd, d});
    l.wo = require_tensor(f, b + "attn_output.weight", {d, qd});
    if (f.find_tensor(b + "attn_q.bias")) {
      l.bq = require_f32(f, b + "attn_q.bias", {qd});
      l.bk = require_f32(f, b + "attn_k.bias", {kvd});
      l.bv = require_f32(f, b + "attn_v.bias", {kvd});
    }
    l.ffn_norm = require_f32(f, b + "ffn_norm.weight", {d});
    l.w_gate = require_tensor(f, b + "ffn_gate.weight", {c.d_ff, d});
    l.w_up = require_tensor(f, b + "ffn_up.weight", {c.d_ff, d});
    l.w_down = require_tensor(f, b + "ffn_down.weight", {d, c.d_ff});
  }
}

void LlamaModel::allocate_cache() {
  const ModelConfig& c = config_;
  for (int64_t i = 0; i < c.n_layers; ++i) {
    k_cache_.push_back(Tensor::empty({context_, c.n_kv_heads, c.head_dim}, DType::F32));
    v_cache_.push_back(Tensor::empty({context_, c.n_kv_heads, c.head_dim}, DType::F32));
  }
}

void LlamaModel::ensure_scratch(int64_t t, bool all_logits) {
  const ModelConfig& c = config_;
  if (t > s_.capacity) {
    s_.capacity = t;
    s_.x = Tensor::empty({t, c.d_model}, DType::F32);
    s_.h = Tensor::empty({t, c.d_model}, DType::F32);
    s_.o = Tensor::empty({t, c.d_model}, DType::F32);
    s_.q = Tensor::empty({t, c.n_heads, c.head_dim}, DType::F32);
    s_.attn = Tensor::empty({t, c.n_heads, c.head_dim}, DType::F32);
    s_.k = Tensor::empty({t, c.n_kv_heads, c.head_dim}, DType::F32);
    s_.v = Tensor::empty({t, c.n_kv_heads, c.head_dim}, DType::F32);
    s_.gate = Tensor::empty({t, c.d_ff}, DType::F32);
    s_.up = Tensor::empty({t, c.d_ff}, DType::F32);
    s_.positions = Tensor::empty({t}, DType::I32);
  }
  const int64_t rows = all_logits ? t : 1;
  if (!s_.logits.defined() || s_.logits.dim(0) < rows) {
    s_.logits = Tensor::empty({rows, c.vocab_size}, DType::F32);
  }
}

Tensor LlamaModel::forward(std::span<const int32_t> tokens, int64_t pos, bool all_logits) {
  const ModelConfig& c = config_;
  const auto t = static_cast<int64_t>(tokens.size());
  LLMK_CHECK(t > 0, "forward: no tokens");
  LLMK_CHECK(pos >= 0 && pos + t <= context_,
             "forward: {} tokens at position {} do not fit the context of {} tokens", t, pos,
             context_);
  ensure_scratch(t, all_logits);

  const int64_t qd = c.n_heads * c.head_dim, kvd = c.n_kv_heads * c.head_dim;
  Tensor ids = Tensor::borrow(const_cast<int32_t*>(tokens.data()), {t}, DType::I32);
  Tensor positions = s_.positions.slice(0, 0, t);
  for (int64_t i = 0; i < t; ++i) positions.data<int32_t>()[i] = static_cast<int32_t>(pos + i);

  Tensor x = s_.x.slice(0, 0, t), h = s_.h.slice(0, 0, t), o = s_.o.slice(0, 0, t);
  Tensor q = s_.q.slice(0, 0, t), k = s_.k.slice(0, 0, t), v = s_.v.slice(0, 0, t);
  Tensor q2 = q.view({t, qd}), k2 = k.view({t, kvd}), v2 = v.view({t, kvd});
  Tensor attn = s_.attn.slice(0, 0, t);
  Tensor gate = s_.gate.slice(0, 0, t), up = s_.up.slice(0, 0, t);

  const ops::RopeParams rope{.rot_dim = static_cast<int>(c.rope_dim),
                             .theta = c.rope_theta,
                             .layout = c.rope_layout};
  const ops::AttentionParams attn_params{};

  ops::embedding(x, tok_embd_, ids);
  for (size_t i = 0; i < layers_.size(); ++i) {
    const LayerWeights& l = layers_[i];
    ops::rms_norm(h, x, l.attn_norm, c.rms_eps);
    ops::linear(q2, h, l.wq, l.bq.defined() ? &l.bq : nullptr);
    ops::linear(k2, h, l.wk, l.bk.defined() ? &l.bk : nullptr);
    ops::linear(v2, h, l.wv, l.bv.defined() ? &l.bv : nullptr);
    ops::rope(q, positions, rope);
    ops::rope(k, positions, rope);
    Tensor k_dst = k_cache_[i].slice(0, pos, pos + t), v_dst = v_cache_[i].slice(0, pos, pos + t);
    ops::copy(k_dst, k);
    ops::copy(v_dst, v);
    ops::attention(attn, q, k_cache_[i].slice(0, 0, pos + t), v_cache_[i].slice(0, 0, pos + t),
                   pos, attn_params);
    ops::linear(o, attn.view({t, qd}), l.wo);
    ops::add(x, x, o);

    ops::rms_norm(h, x, l.ffn_norm, c.rms_eps);
    ops::linear(gate, h, l.w_gate);
    ops::linear(up, h, l.w_up);
    ops::gated_act(gate, gate, up, ops::Activation::SiLU);
    ops::linear(o, gate, l.w_down);
    ops::add(x, x, o);
  }
  Tensor last = all_logits ? x : x.slice(0, t - 1, t);
  Tensor normed = all_logits ? h : h.slice(0, 0, 1);
  ops::rms_norm(normed, last, output_norm_, c.rms_eps);
  Tensor logits = s_.logits.slice(0, 0, normed.dim(0));
  ops::linear(logits, normed, output_);
  return logits;
}

}  // namespace

std::unique_ptr<Model> make_llama(gguf::File file, ModelConfig config, int64_t context) {
  return std::make_unique<LlamaModel>(std::move(file), std::move(config), context);
}

}  // namespace llmk
