// Gemma 3: what sets it apart from the Llama layout, as its GGUF files and its Hugging Face
// config.json describe it. The forward pass is the shared decoder (src/model/decoder.cpp).
#include <cmath>

#include "core/error.h"
#include "core/text.h"
#include "formats/gguf.h"
#include "formats/hf_config.h"
#include "model/family.h"

namespace llmk {

namespace {

// What both formats share.
void gemma3_common(ModelConfig& c) {
  c.activation = ops::Activation::GeluTanh;
  c.qk_norm = true;
  c.sandwich_norms = true;
  c.embed_scale = std::sqrt(static_cast<float>(c.d_model));
  // Some Gemma 3 files (the 270M GGUF of scripts/fetch-models.sh) carry no chat template.
  c.chat_family = "gemma";
}

}  // namespace

void apply_gemma3_gguf(ModelConfig& c, const gguf::File& f) {
  const std::string p = "gemma3.";
  gemma3_common(c);
  // llama.cpp runs Gemma 3 with NeoX RoPE and does not permute its Q/K rows.
  c.rope_layout = ops::RopeLayout::HalfSplit;
  // The converter stores each RMSNorm weight as 1 + w, so the plain norm applies.
  c.norm_add_one = false;
  c.sliding_window = f.get_int(p + "attention.sliding_window", 0);
  // Not in the GGUF metadata: five local layers then one global, and the local RoPE base (its
  // layers unscaled, as llama.cpp runs them).
  c.sliding_pattern = 6;
  c.rope_theta_local = 10000.0f;
  // query_pre_attn_scalar is the head dim for the released sizes but the 27B; the GGUF
  // metadata does not carry it, and llama.cpp uses 1/sqrt(head_dim) as well (0 = that).
  c.attn_scale = 0.0f;
}

void apply_gemma3_hf(ModelConfig& c, const HfConfig& h) {
  gemma3_common(c);
  c.norm_add_one = true;  // transformers' Gemma3RMSNorm scales by (1 + w)
  const std::string act = h.get_string("hidden_activation", "gelu_pytorch_tanh");
  LLMK_CHECK(act == "gelu_pytorch_tanh",
             "{}: hidden_activation '{}' is not supported for gemma3 (supported: "
             "gelu_pytorch_tanh)",
             h.path(), printable(act));
  const double scalar = h.get_float("query_pre_attn_scalar", static_cast<double>(c.head_dim));
  LLMK_CHECK(scalar > 0, "{}: query_pre_attn_scalar {} must be positive", h.path(), scalar);
  c.attn_scale = static_cast<float>(1.0 / std::sqrt(scalar));
  c.attn_softcap = static_cast<float>(h.get_float("attn_logit_softcapping", 0.0));
  LLMK_CHECK(c.attn_softcap >= 0, "{}: attn_logit_softcapping {} must not be negative", h.path(),
             c.attn_softcap);
  // No op caps the final logits yet; Gemma 3 releases set this to null.
  LLMK_CHECK(!h.has("final_logit_softcapping"),
             "{}: final_logit_softcapping is not supported (Gemma 3 sets it to null)", h.path());

  c.sliding_window = h.get_int("sliding_window", 0);
  if (h.has("layer_types")) {  // transformers 5: one entry per layer
    const HfConfig::Json& types = h.get("layer_types");
    LLMK_CHECK(types.is_array() && static_cast<int64_t>(types.size()) == c.n_layers,
               "{}: layer_types must list the {} layers", h.path(), c.n_layers);
    c.local_layers.clear();
    for (size_t i = 0; i < types.size(); ++i) {
      const bool sliding = types[i] == "sliding_attention";
      LLMK_CHECK(sliding || types[i] == "full_attention",
                 "{}: layer_types item {} is {}, expected \"sliding_attention\" or "
                 "\"full_attention\"",
                 h.path(), i, json_io::describe(types[i]));
      c.local_layers.push_back(sliding);
    }
  } else {  // transformers 4
    c.sliding_pattern =
        h.get_int("sliding_window_pattern", h.get_int("_sliding_window_pattern", 6));
    LLMK_CHECK(c.sliding_pattern > 0, "{}: sliding_window_pattern {} must be positive", h.path(),
               c.sliding_pattern);
  }
  LLMK_CHECK(c.sliding_window > 0, "{}: sliding_window must be set for gemma3", h.path());

  // Global layers: rope_theta with the scaling; local ones: their own base, unscaled.
  HfRope global, local;
  if (h.has("rope_parameters") && h.object("rope_parameters").has("full_attention")) {
    const HfConfig r = h.object("rope_parameters");  // transformers 5: one per layer type
    global =
        read_hf_rope(r.object("full_attention"), "rope_parameters.full_attention", 1e6, c.rope_dim);
    local = read_hf_rope(r.object("sliding_attention"), "rope_parameters.sliding_attention", 1e4,
                         c.rope_dim);
  } else {  // transformers 4: rope_theta + rope_scaling for the global layers
    global.theta = checked_theta(h.get_float("rope_theta", 1e6), h.path(), "rope_theta");
    for (const char* key : {"rope_parameters", "rope_scaling"}) {
      if (h.has(key)) global = read_hf_rope(h.object(key), key, global.theta, c.rope_dim);
    }
    local.theta =
        checked_theta(h.get_float("rope_local_base_freq", 1e4), h.path(), "rope_local_base_freq");
  }
  LLMK_CHECK(local.freq_scale == 1.0f && local.freq_factors.empty(),
             "{}: scaled RoPE on the sliding-window layers is not supported", h.path());
  c.rope_theta = static_cast<float>(global.theta);
  c.rope_freq_scale = global.freq_scale;
  c.rope_freq_factors = std::move(global.freq_factors);
  c.rope_theta_local = static_cast<float>(local.theta);

  c.hf_layer_names = {
      {"attn_q_norm.weight", "self_attn.q_norm.weight"},
      {"attn_k_norm.weight", "self_attn.k_norm.weight"},
      {"post_attention_norm.weight", "post_attention_layernorm.weight"},
      {"ffn_norm.weight", "pre_feedforward_layernorm.weight"},
      {"post_ffw_norm.weight", "post_feedforward_layernorm.weight"},
  };
}

}  // namespace llmk
