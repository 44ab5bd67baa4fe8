// Element types. Plain types (f32, f16, bf16, i8, i32) have one element per unit; GGUF block
// types pack `block_size` elements into `block_bytes` bytes and are only stored row-major with
// whole blocks per row.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace llmk {

enum class DType : uint8_t {
  F32,
  F16,
  BF16,
  I8,
  I32,
  Q4_0,
  Q4_1,
  Q5_0,
  Q5_1,
  Q8_0,
  Q2_K,
  Q3_K,
  Q4_K,
  Q5_K,
  Q6_K,
  Q8_K,
  // For llmk.ops (python/llmk/ops.py), not model files: float64 references and gradcheck on the
  // CPU, and torch's default integer type.
  F64,
  I64,
  // An 8-bit float (OCP FP8 E4M3: 4 exponent bits, 3 mantissa bits, largest 448): compressed KV
  // caches (kernels/kv_quant.h).
  F8E4M3,
};

// A model's KV cache elements (LoadOptions::kv_type): its activations' type, or 8-bit (FP8 E4M3,
// INT8) with a scale per row and head.
enum class KvType : uint8_t { Auto, FP8, INT8 };

struct DTypeInfo {
  std::string_view name;
  int64_t block_size;   // elements per block (1 for plain types)
  int64_t block_bytes;  // bytes per block
  bool quantized;
};

const DTypeInfo& dtype_info(DType t);
inline std::string_view dtype_name(DType t) { return dtype_info(t).name; }
inline bool is_quantized(DType t) { return dtype_info(t).quantized; }
inline int64_t block_size(DType t) { return dtype_info(t).block_size; }
// f32, f16 or bf16: the plain float types (activations, conversions between them).
inline bool is_float_type(DType t) {
  return t == DType::F32 || t == DType::F16 || t == DType::BF16;
}
// Bytes of one element for plain types; throws for block types.
size_t element_size(DType t);
// Bytes taken by `n` consecutive elements (n must be a multiple of the block size).
int64_t bytes_for(DType t, int64_t n);

}  // namespace llmk
