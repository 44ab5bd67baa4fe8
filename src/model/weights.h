// Looking up model tensors by name with their expected shapes checked.
#pragma once

#include <string>

#include "core/tensor.h"
#include "formats/gguf.h"

namespace llmk {

// The tensor `name` of `f`, which must have exactly `shape` (row-major); a missing tensor or a
// different shape throws llmk::Error naming the file, the tensor and both shapes.
Tensor require_tensor(const gguf::File& f, const std::string& name, const Shape& shape);
// Like require_tensor, but an absent tensor gives an undefined Tensor.
Tensor optional_tensor(const gguf::File& f, const std::string& name, const Shape& shape);
// Norm weights and biases are used in f32; other dtypes are converted once at load.
Tensor require_f32(const gguf::File& f, const std::string& name, const Shape& shape);

}  // namespace llmk
