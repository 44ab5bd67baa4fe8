// Hyper-parameters of a model, read from GGUF metadata (and, later, config.json).
#pragma once

#include <cstdint>
#include <string>

#include "ops/ops.h"

namespace llmk {
namespace gguf {
class File;
}
class HfConfig;

struct ModelConfig {
  std::string arch;  // "llama" or "qwen2"
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
  int64_t rope_dim = 0;
  ops::RopeLayout rope_layout = ops::RopeLayout::Adjacent;
  bool tied_embeddings = false;

  // Reads `<arch>.*` keys; throws llmk::Error naming the file and key for missing or
  // inconsistent values, and for architectures llmk does not run.
  static ModelConfig from_gguf(const gguf::File& f);
  // Reads a Hugging Face config.json (model_type llama or qwen2; transformers 4 and 5 layouts).
  static ModelConfig from_hf(const HfConfig& c);
  // Checks sizes for consistency; `where` names the file in errors.
  void validate(const std::string& where) const;
  std::string summary() const;
};

}  // namespace llmk
