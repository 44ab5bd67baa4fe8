// Gemma 3: what sets it apart from the Llama layout, as its GGUF files describe it. The forward
// pass is the shared decoder (src/model/decoder.cpp).
#include <cmath>

#include "formats/gguf.h"
#include "model/config.h"

namespace llmk {

void apply_gemma3_gguf(ModelConfig& c, const gguf::File& f) {
  const std::string p = "gemma3.";
  // llama.cpp runs Gemma 3 with NeoX RoPE and does not permute its Q/K rows.
  c.rope_layout = ops::RopeLayout::HalfSplit;
  c.activation = ops::Activation::GeluTanh;
  c.qk_norm = true;
  c.sandwich_norms = true;
  c.embed_scale = std::sqrt(static_cast<float>(c.d_model));
  // The converter stores each RMSNorm weight as 1 + w, so the plain norm applies.
  c.norm_add_one = false;
  c.sliding_window = f.get_int(p + "attention.sliding_window", 0);
  // Not in the GGUF metadata: five local layers then one global, and the local RoPE base.
  c.sliding_pattern = 6;
  c.rope_theta_local = 10000.0f;
  // query_pre_attn_scalar is the head dim for the released sizes but the 27B; the GGUF
  // metadata does not carry it, and llama.cpp uses 1/sqrt(head_dim) as well (0 = that).
  c.attn_scale = 0.0f;
  // Some Gemma 3 GGUF files (the 270M one of scripts/fetch-models.sh) carry no chat template.
  c.chat_family = "gemma";
}

}  // namespace llmk
