// Tokenizer::from_gguf: fills a TokenizerData from the tokenizer.* keys of a GGUF file.
#include <fmt/format.h>

#include <cmath>
#include <cstdint>

#include "core/error.h"
#include "formats/gguf.h"
#include "tokenizer/tokenizer.h"

namespace llmk {
namespace {

const gguf::Value::Array* find_array(const gguf::File& f, std::string_view key,
                                     gguf::ValueType elem, bool required) {
  const gguf::Value* v = required ? &f.get(key) : f.find(key);
  if (v == nullptr) return nullptr;
  const gguf::Value::Array& a = v->as_array();
  LLMK_CHECK(a.elem == elem, "{}: {} is an array of {}, expected {}", f.path(), key,
             gguf::value_type_name(a.elem), gguf::value_type_name(elem));
  return &a;
}

std::vector<int32_t> to_int32(const gguf::File& f, std::string_view key,
                              const std::vector<int64_t>& v) {
  std::vector<int32_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    LLMK_CHECK(v[i] >= INT32_MIN && v[i] <= INT32_MAX, "{}: {}[{}] = {} is out of range", f.path(),
               key, i, v[i]);
    out[i] = static_cast<int32_t>(v[i]);
  }
  return out;
}

int32_t optional_id(const gguf::File& f, std::string_view key) {
  const int64_t id = f.get_int(key, -1);
  LLMK_CHECK(id >= -1 && id <= INT32_MAX, "{}: {} = {} is out of range", f.path(), key, id);
  return static_cast<int32_t>(id);
}

}  // namespace

Tokenizer Tokenizer::from_gguf(const gguf::File& f) {
  TokenizerData d;
  d.model = f.get_string("tokenizer.ggml.model");
  // Files written before llama.cpp had pre-tokenizer types carry no key: GPT-2's split is what
  // they meant (and what Hugging Face does for them).
  d.pre = f.get_string("tokenizer.ggml.pre", "gpt2");
  d.tokens = find_array(f, "tokenizer.ggml.tokens", gguf::ValueType::STRING, true)->strings;
  if (const auto* types = f.find("tokenizer.ggml.token_type")) {
    const gguf::Value::Array& a = types->as_array();
    LLMK_CHECK(a.elem != gguf::ValueType::STRING && a.elem != gguf::ValueType::ARRAY &&
                   a.elem != gguf::ValueType::F32 && a.elem != gguf::ValueType::F64,
               "{}: tokenizer.ggml.token_type is an array of {}, expected integers", f.path(),
               gguf::value_type_name(a.elem));
    d.token_types = to_int32(f, "tokenizer.ggml.token_type", a.ints);
  }
  if (const auto* merges = find_array(f, "tokenizer.ggml.merges", gguf::ValueType::STRING, false)) {
    d.merges = merges->strings;
  }
  if (const auto* scores = find_array(f, "tokenizer.ggml.scores", gguf::ValueType::F32, false)) {
    d.scores.assign(scores->floats.begin(), scores->floats.end());
    // Scores rank SentencePiece merges; a NaN has no place in that order.
    for (size_t i = 0; i < d.scores.size(); ++i) {
      LLMK_CHECK(!std::isnan(d.scores[i]), "{}: tokenizer.ggml.scores[{}] is NaN", f.path(), i);
    }
  }
  d.bos_id = optional_id(f, "tokenizer.ggml.bos_token_id");
  d.eos_id = optional_id(f, "tokenizer.ggml.eos_token_id");
  d.unk_id = optional_id(f, "tokenizer.ggml.unknown_token_id");
  d.pad_id = optional_id(f, "tokenizer.ggml.padding_token_id");
  d.add_bos = f.get_bool("tokenizer.ggml.add_bos_token", false);
  d.chat_template = f.get_string("tokenizer.chat_template", "");
  // llama.cpp adds a prefix space to SentencePiece text unless told not to; llmk does not.
  LLMK_CHECK(d.model != "llama" || !f.get_bool("tokenizer.ggml.add_space_prefix", true),
             "{}: tokenizer.ggml.add_space_prefix is not supported (Gemma's files set it false)",
             f.path());
  try {
    return from_data(std::move(d));
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", f.path(), e.what()));
  }
}

}  // namespace llmk
