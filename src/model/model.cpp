#include "model/model.h"

#include <algorithm>

#include "core/error.h"
#include "model/llama.h"

namespace llmk {

std::unique_ptr<Model> Model::load(const std::string& path, const LoadOptions& opts) {
  gguf::File file = gguf::File::open(path);
  ModelConfig config = ModelConfig::from_gguf(file);
  LLMK_CHECK(opts.context >= 0, "context {} must not be negative", opts.context);
  const int64_t context =
      opts.context > 0 ? opts.context : std::min<int64_t>(config.context_length, 4096);
  LLMK_CHECK(context <= config.context_length,
             "{}: a context of {} tokens exceeds the model's {} tokens", path, context,
             config.context_length);
  // ModelConfig::from_gguf has rejected every architecture but those below.
  return make_llama(std::move(file), std::move(config), context);
}

}  // namespace llmk
