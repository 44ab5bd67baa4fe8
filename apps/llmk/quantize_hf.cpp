// llmk quantize from a Hugging Face folder: the model as a GGUF file lays it out, so that llmk's
// GGUF loader (src/model/config.cpp, src/tokenizer/tokenizer_gguf.cpp) runs it as it runs the
// folder, and llama.cpp reads the same keys. What is converted, and why:
//  - names: the GGUF name of each tensor the model uses; WeightSource::file_name (weights.h)
//    gives the transformers name of each, so the mapping is the loader's own.
//  - Llama's Q and K rows: llama.cpp's converter interleaves each head's rotate-half rows into
//    adjacent pairs, and llmk's GGUF loader runs Llama with adjacent-pair RoPE
//    (ModelConfig::from_gguf), so they are interleaved here too. Qwen2, Phi-3 and Gemma 3 keep
//    rotate-half RoPE in GGUF, and their rows stay as they are.
//  - Gemma's RMSNorm weights: GGUF stores 1 + w (the loader then applies the plain norm).
//  - Llama 3 rope scaling: the per-frequency divisors as the tensor rope_freqs.weight; linear
//    scaling as rope.scaling.type / rope.scaling.factor.
//  - the tokenizer: tokenizer.json's vocabulary, types and merges (byte-level BPE) or scores
//    (BPE with byte fallback, as SentencePiece vocabularies are written), the special ids,
//    add_bos_token and the chat template; the vocabulary padded with unused "[PAD<id>]" tokens up
//    to the embedding rows, as llama.cpp's converter does.
// Settings that a GGUF file cannot carry for llmk (Gemma 3's query_pre_attn_scalar other than
// the head dim, a tokenizer that adds a prefix space, ...) are refused with the setting named.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>

#include "apps/llmk/quantize.h"
#include "core/error.h"
#include "core/text.h"
#include "formats/hf_config.h"
#include "formats/hf_quant.h"
#include "formats/safetensors.h"
#include "model/config.h"
#include "model/model.h"
#include "model/weights.h"
#include "tokenizer/tokenizer.h"

namespace llmk::cli::quantize {

namespace {

using gguf::Value;
using gguf::ValueType;

Value u32(int64_t v) { return Value(ValueType::U32, v); }
Value f32(double v) { return Value(ValueType::F32, v); }
Value text(std::string s) { return Value(ValueType::STRING, std::move(s)); }
Value strings(std::vector<std::string> v) {
  Value::Array a;
  a.elem = ValueType::STRING;
  a.strings = std::move(v);
  return Value(ValueType::ARRAY, std::move(a));
}

// What a GGUF file cannot say for llmk's loader, which fixes these for each architecture.
void check_gguf_can_hold(const ModelConfig& c, const std::string& config) {
  if (c.arch != "gemma3") return;
  // apply_gemma3_gguf: attention scale 1/sqrt(head_dim), no soft-capping, five local layers then
  // a global one, local RoPE base 10000 (what llama.cpp assumes for Gemma 3 as well).
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  LLMK_CHECK(std::abs(c.attn_scale - scale) <= 1e-6 * scale,
             "{}: query_pre_attn_scalar {} differs from the head dim {}: GGUF files of Gemma 3 "
             "carry no attention scale (llama.cpp and llmk use 1/sqrt(head_dim))",
             config,
             fmt::format("{:.6g}", 1.0 / (static_cast<double>(c.attn_scale) * c.attn_scale)),
             c.head_dim);
  LLMK_CHECK(c.attn_softcap == 0.0f,
             "{}: attn_logit_softcapping is not carried by GGUF files of Gemma 3", config);
  LLMK_CHECK(c.rope_theta_local == 10000.0f,
             "{}: a local RoPE base of {} is not carried by GGUF files of Gemma 3 (they assume "
             "10000)",
             config, c.rope_theta_local);
  for (int64_t i = 0; i < c.n_layers; ++i) {
    LLMK_CHECK(c.is_local(i) == ((i + 1) % 6 != 0),
               "{}: layer {} is {}, but GGUF files of Gemma 3 assume five sliding-window layers "
               "then one global layer",
               config, i, c.is_local(i) ? "sliding-window" : "global");
  }
}

void add_model_keys(Source& s, const ModelConfig& c, const std::string& folder) {
  const std::string p = c.arch + ".";
  auto set = [&s](std::string key, Value v) {
    s.metadata.emplace_back(std::move(key), std::move(v));
  };
  set("general.architecture", text(c.arch));
  set("general.name",
      text(c.name.empty() ? std::filesystem::path(folder).filename().string() : c.name));
  set(p + "context_length", u32(c.context_length));
  set(p + "embedding_length", u32(c.d_model));
  set(p + "feed_forward_length", u32(c.d_ff));
  set(p + "block_count", u32(c.n_layers));
  set(p + "attention.head_count", u32(c.n_heads));
  set(p + "attention.head_count_kv", u32(c.n_kv_heads));
  set(p + "attention.key_length", u32(c.head_dim));
  set(p + "attention.value_length", u32(c.head_dim));
  set(p + "attention.layer_norm_rms_epsilon", f32(c.rms_eps));
  set(p + "rope.freq_base", f32(c.rope_theta));
  set(p + "rope.dimension_count", u32(c.rope_dim));
  if (c.rope_freq_scale != 1.0f) {
    set(p + "rope.scaling.type", text("linear"));
    set(p + "rope.scaling.factor", f32(1.0 / c.rope_freq_scale));
  }
  if (c.sliding_window > 0) set(p + "attention.sliding_window", u32(c.sliding_window));
  set(p + "vocab_size", u32(c.vocab_size));
}

// SentencePiece-style vocabularies merge by the score of the merged token, tokenizer.json's BPE
// by the rank of the merge: a token made by merge r scores -r, so both pick the same pair first.
std::vector<double> scores_from_merges(const TokenizerData& d) {
  std::map<std::string, size_t, std::less<>> rank;
  for (size_t r = 0; r < d.merges.size(); ++r) {
    const std::string& m = d.merges[r];
    const size_t space = m.find(' ');
    const std::string merged = m.substr(0, space) + m.substr(space + 1);
    rank.try_emplace(merged, r);
  }
  std::vector<double> scores(d.tokens.size(), 0.0);
  for (size_t i = 0; i < d.tokens.size(); ++i) {
    const auto it = rank.find(d.tokens[i]);
    if (it != rank.end()) scores[i] = -static_cast<double>(it->second);
  }
  return scores;
}

void add_tokenizer_keys(Source& s, const std::string& folder, int64_t vocab_size) {
  const Tokenizer tok = load_tokenizer(folder);
  TokenizerData d = tok.data();
  const std::string where = folder + "/tokenizer.json";
  auto set = [&s](std::string key, Value v) {
    s.metadata.emplace_back(std::move(key), std::move(v));
  };
  std::vector<double> scores;
  if (d.model == "gpt2") {
    set("tokenizer.ggml.model", text("gpt2"));
    // llmk reads a missing key as "gpt2", llama.cpp as its default split; the others go by the
    // names both know (llmk's table lists llama.cpp's "llama-bpe" for Llama 3).
    if (d.pre != "gpt2") set("tokenizer.ggml.pre", text(d.pre == "llama3" ? "llama-bpe" : d.pre));
  } else {
    using Metaspace = TokenizerData::Metaspace;
    LLMK_CHECK(!d.normalizer.prepend_space && d.metaspace != Metaspace::Always &&
                   d.metaspace != Metaspace::First,
               "{}: the tokenizer adds a space before the text (SentencePiece's dummy prefix, as "
               "Phi-3 and Llama 2 have): llmk's GGUF loader does not support that "
               "(tokenizer.ggml.add_space_prefix), so it cannot be written",
               where);
    set("tokenizer.ggml.model", text("llama"));
    set("tokenizer.ggml.add_space_prefix", Value(ValueType::BOOL, false));
    scores = scores_from_merges(d);
  }
  LLMK_CHECK(static_cast<int64_t>(d.tokens.size()) <= vocab_size,
             "{}: {} tokens, but the model's embeddings have only {} rows", where, d.tokens.size(),
             vocab_size);
  std::vector<int64_t> types(d.tokens.size(), static_cast<int64_t>(TokenType::Normal));
  for (size_t i = 0; i < d.token_types.size(); ++i) types[i] = d.token_types[i];
  for (auto i = static_cast<int64_t>(d.tokens.size()); i < vocab_size; ++i) {
    d.tokens.push_back(fmt::format("[PAD{}]", i));
    types.push_back(static_cast<int64_t>(TokenType::Unused));
    if (!scores.empty()) scores.push_back(-1e9);
  }
  set("tokenizer.ggml.tokens", strings(std::move(d.tokens)));
  Value::Array type_array;
  type_array.elem = ValueType::I32;
  type_array.ints = std::move(types);
  set("tokenizer.ggml.token_type", Value(ValueType::ARRAY, std::move(type_array)));
  if (!scores.empty()) {
    Value::Array a;
    a.elem = ValueType::F32;
    a.floats = std::move(scores);
    set("tokenizer.ggml.scores", Value(ValueType::ARRAY, std::move(a)));
  } else {
    set("tokenizer.ggml.merges", strings(std::move(d.merges)));
  }
  const std::pair<const char*, int32_t> ids[] = {{"tokenizer.ggml.bos_token_id", d.bos_id},
                                                 {"tokenizer.ggml.eos_token_id", d.eos_id},
                                                 {"tokenizer.ggml.unknown_token_id", d.unk_id},
                                                 {"tokenizer.ggml.padding_token_id", d.pad_id}};
  for (const auto& [key, id] : ids) {
    if (id >= 0) set(key, u32(id));
  }
  set("tokenizer.ggml.add_bos_token", Value(ValueType::BOOL, d.add_bos));
  if (!d.chat_template.empty()) set("tokenizer.chat_template", text(d.chat_template));
}

struct Wanted {
  std::string name;
  Shape shape;
  bool required = true;
  Edit edit = Edit::None;
  int64_t heads = 0;
};

// The tensors llmk's decoder reads (src/model/decoder.cpp), with the shapes it expects.
std::vector<Wanted> wanted_tensors(const ModelConfig& c) {
  const int64_t d = c.d_model, hd = c.head_dim, qd = c.n_heads * hd, kvd = c.n_kv_heads * hd;
  const bool gemma = c.arch == "gemma3", llama = c.arch == "llama";
  const Edit norm = gemma ? Edit::AddOne : Edit::None;
  std::vector<Wanted> w = {{"token_embd.weight", {c.vocab_size, d}},
                           {"output_norm.weight", {d}, true, norm}};
  if (!c.tied_embeddings) w.push_back({"output.weight", {c.vocab_size, d}});
  for (int64_t i = 0; i < c.n_layers; ++i) {
    const std::string b = fmt::format("blk.{}.", i);
    w.push_back({b + "attn_norm.weight", {d}, true, norm});
    if (c.fused_qkv) {
      w.push_back({b + "attn_qkv.weight", {qd + 2 * kvd, d}});
      w.push_back({b + "attn_qkv.bias", {qd + 2 * kvd}, false});
    } else {
      const Edit rope = llama ? Edit::InterleaveRopeHalves : Edit::None;
      w.push_back({b + "attn_q.weight", {qd, d}, true, rope, c.n_heads});
      w.push_back({b + "attn_k.weight", {kvd, d}, true, rope, c.n_kv_heads});
      w.push_back({b + "attn_v.weight", {kvd, d}});
      // Biases: Qwen2's (rotate-half in GGUF too); from_hf refuses Llama with biases.
      w.push_back({b + "attn_q.bias", {qd}, false});
      w.push_back({b + "attn_k.bias", {kvd}, false});
      w.push_back({b + "attn_v.bias", {kvd}, false});
    }
    w.push_back({b + "attn_output.weight", {d, qd}});
    w.push_back({b + "ffn_norm.weight", {d}, true, norm});
    if (c.qk_norm) {
      w.push_back({b + "attn_q_norm.weight", {hd}, true, norm});
      w.push_back({b + "attn_k_norm.weight", {hd}, true, norm});
    }
    if (c.sandwich_norms) {
      w.push_back({b + "post_attention_norm.weight", {d}, true, norm});
      w.push_back({b + "post_ffw_norm.weight", {d}, true, norm});
    }
    if (c.fused_gate_up) {
      w.push_back({b + "ffn_up.weight", {2 * c.d_ff, d}});
    } else {
      w.push_back({b + "ffn_gate.weight", {c.d_ff, d}});
      w.push_back({b + "ffn_up.weight", {c.d_ff, d}});
    }
    w.push_back({b + "ffn_down.weight", {d, c.d_ff}});
  }
  return w;
}

}  // namespace

Source read_hf_folder(const std::string& path) {
  const HfConfig hf = HfConfig::open(path);
  const ModelConfig c = ModelConfig::from_hf(hf);
  check_gguf_can_hold(c, hf.path());
  const safetensors::Folder folder = safetensors::Folder::open(path);
  const std::unique_ptr<WeightSource> src = hf_source(folder, c.hf_layer_names, read_hf_quant(hf));
  check_layer_count(*src, c.n_layers);

  Source s;
  add_model_keys(s, c, path);
  add_tokenizer_keys(s, path, c.vocab_size);

  std::set<std::string> used;
  for (const Wanted& w : wanted_tensors(c)) {
    const std::string origin = src->file_name(w.name);
    Tensor t = src->find(w.name);
    if (!t.defined()) {
      LLMK_CHECK(!w.required, "{}: missing tensor '{}'", path, printable(origin));
      continue;
    }
    LLMK_CHECK(t.shape() == w.shape, "{}: tensor '{}' has shape {} but {} needs {}",
               src->file_of(w.name), printable(origin), shape_str(t.shape()), hf.path(),
               shape_str(w.shape));
    used.insert(origin);
    const std::string_view packed = kPackedParts[0];  // AWQ / GPTQ: read with its companions
    if (origin.ends_with(packed)) {
      const std::string base = origin.substr(0, origin.size() - packed.size());
      for (const char* part : kPackedParts) used.insert(base + part);
    }
    s.tensors.push_back({w.name, origin, std::move(t), w.edit, w.heads});
  }
  // Llama 3 scaling: GGUF files carry the divisors as a tensor (the loader reads it first).
  if (!c.rope_freq_factors.empty()) {
    const auto n = static_cast<int64_t>(c.rope_freq_factors.size());
    Tensor f = Tensor::empty({n}, DType::F32);
    std::copy(c.rope_freq_factors.begin(), c.rope_freq_factors.end(), f.data<float>());
    s.tensors.insert(s.tensors.begin() + 1, {"rope_freqs.weight", hf.path() + " rope scaling",
                                             std::move(f), Edit::None, 0});
  }
  for (const std::string& name : folder.names()) {
    if (used.count(name) != 0) continue;
    const char* why = name == "lm_head.weight" && c.tied_embeddings
                          ? "tie_word_embeddings: the embeddings serve as the output"
                          : "not read by llmk's model";
    s.skipped.push_back(fmt::format("{} ({})", printable(name), why));
  }
  return s;
}

}  // namespace llmk::cli::quantize
