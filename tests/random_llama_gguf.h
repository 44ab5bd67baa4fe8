// A whole Llama GGUF file of random weights, for tests that need a model of a given shape and
// given tensor types (the quantiser's CLI, quantised weights on the GPU). Weights are
// N(0, 1 / cols), norm weights 1 + N(0, 0.1^2), drawn in the file's tensor order from one seeded
// generator; a block type's rows go through cpu::quantize_row.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "formats/gguf_write.h"
#include "kernels/cpu/quantize.h"

namespace llmk::test {

struct RandomLlama {
  int64_t layers = 1, d = 256, ff = 512, vocab = 256, heads = 4, kv_heads = 2, head_dim = 64;
  uint32_t seed = 3;
};

// Writes `path` and returns it. dtype_of(name): each tensor's type (F32 for the norm vectors).
inline std::string write_random_llama(const std::string& path, const RandomLlama& m,
                                      const std::function<DType(const std::string&)>& dtype_of) {
  gguf::Writer w;
  using gguf::Value;
  using gguf::ValueType;
  const auto u32 = [](int64_t v) { return Value(ValueType::U32, v); };
  w.set("general.architecture", Value(ValueType::STRING, std::string("llama")));
  w.set("llama.block_count", u32(m.layers));
  w.set("llama.embedding_length", u32(m.d));
  w.set("llama.feed_forward_length", u32(m.ff));
  w.set("llama.attention.head_count", u32(m.heads));
  w.set("llama.attention.head_count_kv", u32(m.kv_heads));
  w.set("llama.context_length", u32(128));
  w.set("llama.vocab_size", u32(m.vocab));
  w.set("llama.attention.layer_norm_rms_epsilon", Value(ValueType::F32, 1e-5));
  std::vector<std::pair<std::string, Shape>> tensors = {{"token_embd.weight", {m.vocab, m.d}},
                                                        {"output_norm.weight", {m.d}},
                                                        {"output.weight", {m.vocab, m.d}}};
  const int64_t q = m.heads * m.head_dim, kv = m.kv_heads * m.head_dim;
  for (int64_t i = 0; i < m.layers; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".";
    for (const auto& [n, s] :
         std::vector<std::pair<std::string, Shape>>{{"attn_norm.weight", {m.d}},
                                                    {"attn_q.weight", {q, m.d}},
                                                    {"attn_k.weight", {kv, m.d}},
                                                    {"attn_v.weight", {kv, m.d}},
                                                    {"attn_output.weight", {m.d, q}},
                                                    {"ffn_norm.weight", {m.d}},
                                                    {"ffn_gate.weight", {m.ff, m.d}},
                                                    {"ffn_up.weight", {m.ff, m.d}},
                                                    {"ffn_down.weight", {m.d, m.ff}}}) {
      tensors.emplace_back(b + n, s);
    }
  }
  std::vector<DType> types;
  for (const auto& [n, s] : tensors) {
    types.push_back(dtype_of(n));
    w.add_tensor(n, s, types.back());
  }
  w.open(path);
  std::mt19937 rng(m.seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (size_t t = 0; t < tensors.size(); ++t) {
    const Shape& s = tensors[t].second;
    std::vector<float> x(static_cast<size_t>(shape_numel(s)));
    const bool norm = s.size() == 1;
    // Scaled so that activations keep their size through the layers.
    const float scale = 1.0f / std::sqrt(static_cast<float>(s.back()));
    for (float& e : x) e = norm ? 1.0f + 0.1f * normal(rng) : scale * normal(rng);
    if (types[t] == DType::F32) {
      w.write(x.data(), x.size() * sizeof(float));
      continue;
    }
    const int64_t cols = s.back(), rows = static_cast<int64_t>(x.size()) / cols;
    std::vector<uint8_t> row(static_cast<size_t>(bytes_for(types[t], cols)));
    for (int64_t r = 0; r < rows; ++r) {
      cpu::quantize_row(types[t], x.data() + r * cols, row.data(), cols);
      w.write(row.data(), row.size());
    }
  }
  w.finish();
  return path;
}

}  // namespace llmk::test
