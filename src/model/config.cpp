#include "model/config.h"

#include <fmt/format.h>

#include "core/error.h"
#include "formats/gguf.h"
#include "formats/hf_config.h"

namespace llmk {

namespace {
constexpr const char* kSupportedArchs = "llama, gemma3";
}

// Family settings beyond the common keys (src/model/<family>.cpp).
void apply_gemma3_gguf(ModelConfig& c, const gguf::File& f);

ModelConfig ModelConfig::from_gguf(const gguf::File& f) {
  ModelConfig c;
  c.arch = f.get_string("general.architecture");
  LLMK_CHECK(c.arch == "llama" || c.arch == "gemma3",
             "{}: unsupported architecture '{}' (supported: {})", f.path(), c.arch,
             kSupportedArchs);
  const std::string p = c.arch + ".";
  c.name = f.get_string("general.name", "");
  c.n_layers = f.get_int(p + "block_count");
  c.d_model = f.get_int(p + "embedding_length");
  c.n_heads = f.get_int(p + "attention.head_count");
  c.n_kv_heads = f.get_int(p + "attention.head_count_kv", c.n_heads);
  c.d_ff = f.get_int(p + "feed_forward_length");
  c.context_length = f.get_int(p + "context_length");
  c.rms_eps = static_cast<float>(f.get_float(p + "attention.layer_norm_rms_epsilon"));
  c.rope_theta = static_cast<float>(f.get_float(p + "rope.freq_base", 10000.0));
  c.head_dim = f.get_int(p + "attention.key_length", c.n_heads > 0 ? c.d_model / c.n_heads : 0);
  c.rope_dim = f.get_int(p + "rope.dimension_count", c.head_dim);
  // GGUF llama files have Q/K rows permuted by the converter so that RoPE rotates adjacent pairs.
  c.rope_layout = ops::RopeLayout::Adjacent;
  if (c.arch == "gemma3") apply_gemma3_gguf(c, f);
  if (const gguf::Value* v = f.find("tokenizer.ggml.tokens")) {
    c.vocab_size = static_cast<int64_t>(v->as_array().size());
  }
  c.vocab_size = f.get_int(p + "vocab_size", c.vocab_size);
  c.tied_embeddings = f.find_tensor("output.weight") == nullptr;
  c.validate(f.path());
  return c;
}

ModelConfig ModelConfig::from_hf(const HfConfig& h) {
  ModelConfig c;
  c.arch = h.get_string("model_type");
  LLMK_CHECK(c.arch == "llama" || c.arch == "qwen2",
             "{}: unsupported model_type '{}' (supported: llama, qwen2)", h.path(), c.arch);
  c.name = h.get_string("_name_or_path", "");
  c.n_layers = h.get_int("num_hidden_layers");
  c.d_model = h.get_int("hidden_size");
  c.n_heads = h.get_int("num_attention_heads");
  c.n_kv_heads = h.get_int("num_key_value_heads", c.n_heads);
  c.d_ff = h.get_int("intermediate_size");
  c.vocab_size = h.get_int("vocab_size");
  c.context_length = h.get_int("max_position_embeddings");
  c.rms_eps = static_cast<float>(h.get_float("rms_norm_eps"));
  c.head_dim = h.get_int("head_dim", c.n_heads > 0 ? c.d_model / c.n_heads : 0);
  c.rope_dim = c.head_dim;
  // transformers 5 keeps rope settings in "rope_parameters", 4 in "rope_theta"/"rope_scaling".
  double theta = h.get_float("rope_theta", 10000.0);
  std::string rope_type = "default";
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (!h.has(key)) continue;
    const HfConfig r = h.object(key);
    theta = r.get_float("rope_theta", theta);
    rope_type = r.get_string("rope_type", r.get_string("type", "default"));
  }
  LLMK_CHECK(rope_type == "default", "{}: unsupported rope scaling type '{}' (supported: default)",
             h.path(), rope_type);
  c.rope_theta = static_cast<float>(theta);
  // Hugging Face checkpoints keep Q/K in the rotate-half layout.
  c.rope_layout = ops::RopeLayout::HalfSplit;
  c.tied_embeddings = h.get_bool("tie_word_embeddings", false);
  c.validate(h.path());
  return c;
}

void ModelConfig::validate(const std::string& where) const {
  LLMK_CHECK(n_layers > 0 && n_layers <= 4096, "{}: {} layers is out of range", where, n_layers);
  LLMK_CHECK(d_model > 0 && n_heads > 0 && n_kv_heads > 0 && d_ff > 0 && vocab_size > 0,
             "{}: non-positive sizes (embedding {}, heads {}, kv heads {}, feed-forward {}, "
             "vocab {})",
             where, d_model, n_heads, n_kv_heads, d_ff, vocab_size);
  LLMK_CHECK(n_heads % n_kv_heads == 0, "{}: {} heads are not a multiple of {} kv heads", where,
             n_heads, n_kv_heads);
  LLMK_CHECK(head_dim > 0 && head_dim % 2 == 0, "{}: head dim {} must be even and positive", where,
             head_dim);
  LLMK_CHECK(rope_dim > 0 && rope_dim <= head_dim && rope_dim % 2 == 0,
             "{}: rope dimension {} must be even and at most the head dim {}", where, rope_dim,
             head_dim);
  LLMK_CHECK(context_length > 0, "{}: context length {} must be positive", where, context_length);
}

std::string ModelConfig::summary() const {
  return fmt::format(
      "{} ({}): {} layers, d_model {}, heads {}/{} (kv), head dim {}, ffn {}, vocab {}, "
      "context {}, rope theta {}{}",
      name.empty() ? "unnamed" : name, arch, n_layers, d_model, n_heads, n_kv_heads, head_dim, d_ff,
      vocab_size, context_length, rope_theta, tied_embeddings ? ", tied embeddings" : "");
}

}  // namespace llmk
