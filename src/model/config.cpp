#include "model/config.h"

#include <fmt/format.h>

#include "core/error.h"
#include "formats/gguf.h"

namespace llmk {

namespace {
constexpr const char* kSupportedArchs = "llama";
}

ModelConfig ModelConfig::from_gguf(const gguf::File& f) {
  ModelConfig c;
  c.arch = f.get_string("general.architecture");
  LLMK_CHECK(c.arch == "llama", "{}: unsupported architecture '{}' (supported: {})", f.path(),
             c.arch, kSupportedArchs);
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
  LLMK_CHECK(c.n_layers > 0 && c.n_layers <= 4096, "{}: {}block_count = {} is out of range",
             f.path(), p, c.n_layers);
  LLMK_CHECK(c.d_model > 0 && c.n_heads > 0 && c.n_kv_heads > 0 && c.d_ff > 0,
             "{}: non-positive sizes (embedding {}, heads {}, kv heads {}, feed-forward {})",
             f.path(), c.d_model, c.n_heads, c.n_kv_heads, c.d_ff);
  LLMK_CHECK(c.n_heads % c.n_kv_heads == 0, "{}: {} heads are not a multiple of {} kv heads",
             f.path(), c.n_heads, c.n_kv_heads);
  c.head_dim = f.get_int(p + "attention.key_length", c.d_model / c.n_heads);
  LLMK_CHECK(c.head_dim > 0 && c.head_dim % 2 == 0, "{}: head dim {} must be even and positive",
             f.path(), c.head_dim);
  c.rope_dim = f.get_int(p + "rope.dimension_count", c.head_dim);
  LLMK_CHECK(c.rope_dim > 0 && c.rope_dim <= c.head_dim && c.rope_dim % 2 == 0,
             "{}: rope dimension {} must be even and at most the head dim {}", f.path(), c.rope_dim,
             c.head_dim);
  LLMK_CHECK(c.context_length > 0, "{}: context length {} must be positive", f.path(),
             c.context_length);
  // GGUF llama files have Q/K rows permuted by the converter so that RoPE rotates adjacent pairs.
  c.rope_layout = ops::RopeLayout::Adjacent;
  if (const gguf::Value* v = f.find("tokenizer.ggml.tokens")) {
    c.vocab_size = static_cast<int64_t>(v->as_array().size());
  }
  c.vocab_size = f.get_int(p + "vocab_size", c.vocab_size);
  c.tied_embeddings = f.find_tensor("output.weight") == nullptr;
  return c;
}

std::string ModelConfig::summary() const {
  return fmt::format(
      "{} ({}): {} layers, d_model {}, heads {}/{} (kv), head dim {}, ffn {}, vocab {}, "
      "context {}, rope theta {}{}",
      name.empty() ? "unnamed" : name, arch, n_layers, d_model, n_heads, n_kv_heads, head_dim,
      d_ff, vocab_size, context_length, rope_theta, tied_embeddings ? ", tied embeddings" : "");
}

}  // namespace llmk
