#pragma once

#include <memory>

#include "model/model.h"

namespace llmk {
std::unique_ptr<Model> make_llama(gguf::File file, ModelConfig config, int64_t context);
}
