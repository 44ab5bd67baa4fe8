#include "model/config.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <numbers>
#include <string_view>

#include "core/error.h"
#include "core/text.h"
#include "formats/gguf.h"
#include "formats/hf_config.h"
#include "model/family.h"

namespace llmk {

namespace {
constexpr const char* kSupportedArchs = "llama, qwen2, phi3, gemma3";
constexpr const char* kSupportedModelTypes = "llama, qwen2, phi3, gemma3_text";

bool one_of(const std::string& s, std::initializer_list<const char*> options) {
  for (const char* o : options) {
    if (s == o) return true;
  }
  return false;
}

// GGUF rope scaling keys (llama.cpp's `<arch>.rope.scaling.*`): linear scaling only. Llama 3
// files need none: their per-frequency divisors are the tensor rope_freqs.weight.
void read_gguf_rope_scaling(ModelConfig& c, const gguf::File& f, const std::string& p) {
  const std::string type = f.get_string(p + "rope.scaling.type", "none");
  if (type == "linear") {
    const double factor = f.get_float(p + "rope.scaling.factor");
    LLMK_CHECK(std::isfinite(factor) && factor > 0, "{}: {}rope.scaling.factor = {} must be > 0",
               f.path(), p, factor);
    c.rope_freq_scale = static_cast<float>(1.0 / factor);
  } else {
    LLMK_CHECK(type == "none",
               "{}: {}rope.scaling.type '{}' is not supported (supported: none, "
               "linear)",
               f.path(), p, printable(type));
  }
}

double checked_eps(double eps, const std::string& where, std::string_view key) {
  LLMK_CHECK(std::isfinite(eps) && eps >= 0 && eps < 1, "{}: {} = {} must be in [0, 1)", where, key,
             eps);
  return eps;
}

}  // namespace

// Above 1: below it every frequency is 1 or more and the angles no longer fall with the dimension.
double checked_theta(double theta, const std::string& where, std::string_view key) {
  LLMK_CHECK(std::isfinite(theta) && theta > 1, "{}: {} = {} must be a finite number > 1", where,
             key, theta);
  return theta;
}

std::vector<float> llama3_rope_factors(double theta, int64_t rope_dim, double factor,
                                       double low_freq_factor, double high_freq_factor,
                                       double original_context) {
  const double low_freq_wavelen = original_context / low_freq_factor;
  const double high_freq_wavelen = original_context / high_freq_factor;
  std::vector<float> out;
  for (int64_t i = 0; i < rope_dim / 2; ++i) {
    const double inv_freq = std::pow(theta, -2.0 * static_cast<double>(i) / rope_dim);
    const double wavelen = 2 * std::numbers::pi / inv_freq;
    double divisor = 1.0;  // high frequencies (wavelen < high_freq_wavelen) keep theirs
    if (wavelen > low_freq_wavelen) {
      divisor = factor;
    } else if (wavelen >= high_freq_wavelen) {  // between: interpolated
      const double smooth =
          (original_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
      divisor = 1.0 / ((1 - smooth) / factor + smooth);
    }
    out.push_back(static_cast<float>(divisor));
  }
  return out;
}

HfRope read_hf_rope(const HfConfig& r, const std::string& key, double theta, int64_t rope_dim) {
  HfRope out;
  out.theta = checked_theta(r.get_float("rope_theta", theta), r.path(), key + ".rope_theta");
  const char* type_key = r.has("rope_type") || !r.has("type") ? "rope_type" : "type";
  const std::string type = r.get_string(type_key, "default");
  if (type == "linear") {
    const double factor = r.get_float("factor");
    LLMK_CHECK(std::isfinite(factor) && factor > 0, "{}: {}.factor = {} must be > 0", r.path(), key,
               factor);
    out.freq_scale = static_cast<float>(1.0 / factor);
  } else if (type == "llama3") {
    const double factor = r.get_float("factor"), low = r.get_float("low_freq_factor");
    const double high = r.get_float("high_freq_factor");
    const double original = r.get_float("original_max_position_embeddings");
    LLMK_CHECK(std::isfinite(factor) && factor > 0 && low > 0 && high > low && original > 0,
               "{}: {}: llama3 rope scaling needs factor > 0, 0 < low_freq_factor < "
               "high_freq_factor and original_max_position_embeddings > 0 (got {}, {}, {}, {})",
               r.path(), key, factor, low, high, original);
    out.freq_factors = llama3_rope_factors(out.theta, rope_dim, factor, low, high, original);
  } else {
    LLMK_CHECK(type == "default",
               "{}: {}.{} '{}' is not supported (supported: default, "
               "linear, llama3)",
               r.path(), key, type_key, printable(type));
  }
  return out;
}

ModelConfig ModelConfig::from_gguf(const gguf::File& f) {
  ModelConfig c;
  c.arch = f.get_string("general.architecture");
  LLMK_CHECK(one_of(c.arch, {"llama", "qwen2", "phi3", "gemma3"}),
             "{}: unsupported architecture '{}' (supported: {})", f.path(), printable(c.arch),
             kSupportedArchs);
  const std::string p = c.arch + ".";
  c.name = f.get_string("general.name", "");
  c.n_layers = f.get_int(p + "block_count");
  c.d_model = f.get_int(p + "embedding_length");
  c.n_heads = f.get_int(p + "attention.head_count");
  c.n_kv_heads = f.get_int(p + "attention.head_count_kv", c.n_heads);
  c.d_ff = f.get_int(p + "feed_forward_length");
  c.context_length = f.get_int(p + "context_length");
  c.rms_eps = static_cast<float>(checked_eps(f.get_float(p + "attention.layer_norm_rms_epsilon"),
                                             f.path(), p + "attention.layer_norm_rms_epsilon"));
  c.rope_theta = static_cast<float>(
      checked_theta(f.get_float(p + "rope.freq_base", 10000.0), f.path(), p + "rope.freq_base"));
  c.head_dim = f.get_int(p + "attention.key_length", c.n_heads > 0 ? c.d_model / c.n_heads : 0);
  c.rope_dim = f.get_int(p + "rope.dimension_count", c.head_dim);
  // GGUF llama files have Q/K rows permuted by the converter so that RoPE rotates adjacent pairs;
  // llama.cpp runs the other families with NeoX RoPE (rotate-half) on unpermuted rows.
  c.rope_layout = c.arch == "llama" ? ops::RopeLayout::Adjacent : ops::RopeLayout::HalfSplit;
  read_gguf_rope_scaling(c, f, p);
  if (c.arch == "gemma3") apply_gemma3_gguf(c, f);
  if (c.arch == "phi3") apply_phi3_gguf(c, f);
  if (const gguf::Value* v = f.find("tokenizer.ggml.tokens")) {
    c.vocab_size = static_cast<int64_t>(v->as_array().size());
  }
  c.vocab_size = f.get_int(p + "vocab_size", c.vocab_size);
  c.validate_sizes(f.path());
  c.tied_embeddings = f.find_tensor("output.weight") == nullptr;
  c.validate(f.path());
  return c;
}

ModelConfig ModelConfig::from_hf(const HfConfig& h) {
  ModelConfig c;
  const std::string model_type = h.get_string("model_type");
  LLMK_CHECK(one_of(model_type, {"llama", "qwen2", "phi3", "gemma3_text"}),
             "{}: unsupported model_type '{}' (supported: {})", h.path(), printable(model_type),
             kSupportedModelTypes);
  c.arch = model_type == "gemma3_text" ? "gemma3" : model_type;
  c.name = h.get_string("_name_or_path", "");
  c.n_layers = h.get_int("num_hidden_layers");
  c.d_model = h.get_int("hidden_size");
  c.n_heads = h.get_int("num_attention_heads");
  c.n_kv_heads = h.get_int("num_key_value_heads", c.n_heads);
  c.d_ff = h.get_int("intermediate_size");
  c.vocab_size = h.get_int("vocab_size");
  c.context_length = h.get_int("max_position_embeddings");
  c.rms_eps =
      static_cast<float>(checked_eps(h.get_float("rms_norm_eps"), h.path(), "rms_norm_eps"));
  c.head_dim = h.get_int("head_dim", c.n_heads > 0 ? c.d_model / c.n_heads : 0);
  // transformers 5 keeps rope settings in "rope_parameters" (partial_rotary_factor too), 4 in
  // "rope_theta" / "rope_scaling" / "partial_rotary_factor".
  const char* rope_key = h.has("rope_parameters") ? "rope_parameters"
                         : h.has("rope_scaling")  ? "rope_scaling"
                                                  : nullptr;
  double partial = h.get_float("partial_rotary_factor", 1.0);
  if (rope_key != nullptr) {
    partial = h.object(rope_key).get_float("partial_rotary_factor", partial);
  }
  LLMK_CHECK(partial > 0 && partial <= 1, "{}: partial_rotary_factor {} must be in (0, 1]",
             h.path(), partial);
  c.rope_dim = static_cast<int64_t>(static_cast<double>(c.head_dim) * partial);  // as int() does
  c.validate_sizes(h.path());  // before any work sized by them (llama3 rope factors)
  // Hugging Face checkpoints keep Q/K in the rotate-half layout.
  c.rope_layout = ops::RopeLayout::HalfSplit;
  if (c.arch != "gemma3") {  // Gemma 3 has one rope per layer type (src/model/gemma3.cpp)
    HfRope rope;
    rope.theta = checked_theta(h.get_float("rope_theta", rope.theta), h.path(), "rope_theta");
    if (rope_key != nullptr)
      rope = read_hf_rope(h.object(rope_key), rope_key, rope.theta, c.rope_dim);
    c.rope_theta = static_cast<float>(rope.theta);
    c.rope_freq_scale = rope.freq_scale;
    c.rope_freq_factors = std::move(rope.freq_factors);
    const std::string act = h.get_string("hidden_act", "silu");
    LLMK_CHECK(act == "silu", "{}: hidden_act '{}' is not supported for {} (supported: silu)",
               h.path(), printable(act), model_type);
  }
  if (c.arch == "llama") {
    for (const char* key : {"attention_bias", "mlp_bias"}) {
      LLMK_CHECK(!h.get_bool(key, false), "{}: {} = true is not supported for llama", h.path(),
                 key);
    }
  }
  if (c.arch == "qwen2") {
    // Qwen2.5 releases ship use_sliding_window false; the windowed variant is not run here.
    LLMK_CHECK(!h.get_bool("use_sliding_window", false),
               "{}: use_sliding_window = true is not supported for qwen2", h.path());
  }
  c.tied_embeddings = h.get_bool("tie_word_embeddings", c.arch == "gemma3");
  if (c.arch == "phi3") apply_phi3_hf(c, h);
  if (c.arch == "gemma3") apply_gemma3_hf(c, h);
  c.validate(h.path());
  return c;
}

void ModelConfig::validate_sizes(const std::string& where) const {
  // Far above any released model, low enough that no product of them overflows an int64.
  const auto in_range = [&where](std::string_view what, int64_t v, int64_t max) {
    LLMK_CHECK(v > 0 && v <= max, "{}: {} {} is out of range (1 to {})", where, what, v, max);
  };
  in_range("layer count", n_layers, 4096);
  in_range("embedding length", d_model, int64_t{1} << 17);
  in_range("head count", n_heads, 1024);
  in_range("kv head count", n_kv_heads, 1024);
  in_range("head dim", head_dim, 1024);
  in_range("feed-forward length", d_ff, int64_t{1} << 20);
  in_range("vocabulary size", vocab_size, int64_t{1} << 24);
  in_range("context length", context_length, std::numeric_limits<int32_t>::max());
  LLMK_CHECK(rope_dim > 0 && rope_dim <= head_dim && rope_dim % 2 == 0,
             "{}: rope dimension {} must be even and at most the head dim {}", where, rope_dim,
             head_dim);
}

void ModelConfig::validate(const std::string& where) const {
  validate_sizes(where);
  LLMK_CHECK(n_heads % n_kv_heads == 0, "{}: {} heads are not a multiple of {} kv heads", where,
             n_heads, n_kv_heads);
  LLMK_CHECK(head_dim > 0 && head_dim % 2 == 0, "{}: head dim {} must be even and positive", where,
             head_dim);
  LLMK_CHECK(
      rope_freq_factors.empty() || static_cast<int64_t>(rope_freq_factors.size()) == rope_dim / 2,
      "{}: {} rope frequency factors for a rope dimension of {}", where, rope_freq_factors.size(),
      rope_dim);
  LLMK_CHECK(local_layers.empty() || static_cast<int64_t>(local_layers.size()) == n_layers,
             "{}: {} layer types for {} layers", where, local_layers.size(), n_layers);
  LLMK_CHECK(sliding_window >= 0 && sliding_window <= (int64_t{1} << 30),
             "{}: sliding window {} is out of range", where, sliding_window);
}

std::string ModelConfig::summary() const {
  return fmt::format(
      "{} ({}): {} layers, d_model {}, heads {}/{} (kv), head dim {}, ffn {}, vocab {}, "
      "context {}, rope theta {}{}{}{}{}",
      name.empty() ? "unnamed" : name, arch, n_layers, d_model, n_heads, n_kv_heads, head_dim, d_ff,
      vocab_size, context_length, rope_theta, rope_freq_factors.empty() ? "" : " (llama3 scaling)",
      rope_freq_scale != 1.0f ? fmt::format(" (linear scaling x{})", 1.0f / rope_freq_scale) : "",
      sliding_window > 0 ? fmt::format(", sliding window {}", sliding_window) : "",
      tied_embeddings ? ", tied embeddings" : "");
}

}  // namespace llmk
