// Hyper-parameters of a model, read from GGUF metadata (and, later, config.json).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ops/ops.h"

namespace llmk {
namespace gguf {
class File;
}
class HfConfig;

struct ModelConfig {
  std::string arch;  // "llama", "qwen2", "phi3", "gemma3"
  std::string name;  // general.name, for display
  int64_t n_layers = 0;
  int64_t d_model = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t d_ff = 0;
  int64_t vocab_size = 0;
  int64_t context_length = 0;  // what the model was trained for
  float rms_eps = 1e-5f;
  float rope_theta = 10000.0f;
  int64_t rope_dim = 0;  // rotated dims at the start of each head (partial rotary: < head_dim)
  ops::RopeLayout rope_layout = ops::RopeLayout::Adjacent;
  // RoPE scaling of the global layers (of every layer when rope_theta_local is 0):
  float rope_freq_scale = 1.0f;          // "linear": angle = pos / factor * inv_freq
  std::vector<float> rope_freq_factors;  // [rope_dim/2] inv_freq divisors ("llama3"); empty = none
  // (GGUF files of Llama 3 carry the divisors as the tensor rope_freqs.weight instead.)
  bool tied_embeddings = false;
  ops::Activation activation = ops::Activation::SiLU;  // of the gated MLP
  float attn_scale = 0.0f;                             // multiplies q.k; 0 = 1/sqrt(head_dim)
  float attn_softcap = 0.0f;   // attention logits = cap * tanh(logits / cap); 0 = off
  bool fused_qkv = false;      // one attn_qkv tensor [Hq*D + 2*Hkv*D, d_model] (Phi-3)
  bool fused_gate_up = false;  // ffn_up holds gate|up [2*d_ff, d_model], no ffn_gate (Phi-3)
  // Gemma: RMSNorm scales by (1 + w). GGUF files of Gemma store 1 + w already (llama.cpp's
  // converter adds it), so this is set for Hugging Face checkpoints only.
  bool norm_add_one = false;
  bool qk_norm = false;         // RMSNorm over each head of q and k before RoPE (Gemma 3)
  bool sandwich_norms = false;  // RMSNorm of attention and MLP outputs before the residual add
  float embed_scale = 1.0f;     // embeddings are multiplied by this (Gemma: sqrt(d_model))
  int64_t sliding_window = 0;   // keys within this distance, on the local layers; 0 = none
  // Every sliding_pattern-th layer (the last of each group) is global, the others local;
  // 0 = every layer is local when sliding_window is set.
  int64_t sliding_pattern = 0;
  // When not empty (config.json's layer_types), says for each layer whether it is local;
  // overrides sliding_pattern.
  std::vector<bool> local_layers;
  float rope_theta_local = 0.0f;  // RoPE base of the local layers; 0 = rope_theta
  // The chat format to use when the model file carries no template ("" = none known).
  std::string chat_family;
  // Hugging Face folders: where the family's transformers names differ from Llama's, the GGUF
  // name within a layer ("post_attention_norm.weight") -> transformers' name within
  // "model.layers.<i>." ("post_attention_layernorm.weight").
  std::vector<std::pair<std::string, std::string>> hf_layer_names;

  bool is_local(int64_t layer) const {
    if (sliding_window <= 0) return false;
    if (!local_layers.empty()) return local_layers[static_cast<size_t>(layer)];
    return sliding_pattern <= 0 || (layer + 1) % sliding_pattern != 0;
  }

  // Reads `<arch>.*` keys; throws llmk::Error naming the file and key for missing or
  // inconsistent values, and for architectures llmk does not run.
  static ModelConfig from_gguf(const gguf::File& f);
  // Reads a Hugging Face config.json (model_type llama, qwen2, phi3, gemma3_text;
  // transformers 4 and 5 layouts).
  static ModelConfig from_hf(const HfConfig& c);
  // Checks sizes for consistency; `where` names the file in errors.
  void validate(const std::string& where) const;
  // Only the sizes read first (layers, widths, heads, head and rope dims, vocabulary, context):
  // each within a bound far above released models, so nothing sized by them runs away.
  void validate_sizes(const std::string& where) const;
  std::string summary() const;
};

}  // namespace llmk
