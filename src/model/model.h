// A loaded model: configuration, weights, KV cache and the forward pass.
//
// forward() runs T tokens at positions pos..pos+T-1, appends their keys and values to the
// cache and returns logits. The model code calls ops only; it never branches on the device.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "formats/gguf.h"
#include "model/config.h"

namespace llmk {

struct LoadOptions {
  int64_t context = 0;  // KV cache length in tokens; 0 = min(model's context, 4096)
};

class Model {
 public:
  virtual ~Model() = default;

  // Opens a GGUF file and builds the model for its architecture.
  static std::unique_ptr<Model> load(const std::string& path, const LoadOptions& opts = {});

  const ModelConfig& config() const { return config_; }
  const gguf::File& file() const { return file_; }
  int64_t context() const { return context_; }

  // tokens: T ids at positions pos..pos+T-1 (pos + T <= context()). Returns logits
  // [T, vocab] f32 when all_logits, else [1, vocab] for the last token. The returned tensor is
  // a view into model-owned scratch, valid until the next forward().
  virtual Tensor forward(std::span<const int32_t> tokens, int64_t pos, bool all_logits) = 0;

 protected:
  Model(gguf::File file, ModelConfig config, int64_t context)
      : file_(std::move(file)), config_(std::move(config)), context_(context) {}

  gguf::File file_;
  ModelConfig config_;
  int64_t context_;
};

}  // namespace llmk
