#pragma once

#include <memory>

#include "model/model.h"

namespace llmk {
std::unique_ptr<Model> make_decoder(const std::string& path, ModelConfig config, int64_t context,
                                    const LoadOptions& opts, const WeightSource& src);
}
