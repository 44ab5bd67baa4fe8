#include "model/weights.h"

#include "core/error.h"
#include "ops/ops.h"

namespace llmk {

Tensor optional_tensor(const gguf::File& f, const std::string& name, const Shape& shape) {
  if (f.find_tensor(name) == nullptr) return Tensor();
  Tensor t = f.tensor(name);
  LLMK_CHECK(t.shape() == shape, "{}: tensor '{}' has shape {} but the model config needs {}",
             f.path(), name, shape_str(t.shape()), shape_str(shape));
  return t;
}

Tensor require_tensor(const gguf::File& f, const std::string& name, const Shape& shape) {
  LLMK_CHECK(f.find_tensor(name) != nullptr, "{}: missing tensor '{}'", f.path(), name);
  return optional_tensor(f, name, shape);
}

Tensor require_f32(const gguf::File& f, const std::string& name, const Shape& shape) {
  Tensor t = require_tensor(f, name, shape);
  if (t.dtype() == DType::F32) return t;
  LLMK_CHECK(t.dtype() == DType::F16 || t.dtype() == DType::BF16,
             "{}: tensor '{}' is {}; norms and biases must be f32, f16 or bf16", f.path(), name,
             dtype_name(t.dtype()));
  Tensor out = Tensor::empty(shape, DType::F32);
  ops::copy(out, t);
  return out;
}

}  // namespace llmk
