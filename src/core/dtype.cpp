#include "core/dtype.h"

#include <array>

#include "core/error.h"

namespace llmk {

namespace {
// Block layouts follow ggml: QK_K = 256 for the k-quants.
constexpr std::array<DTypeInfo, 19> kInfo = {{
    {"f32", 1, 4, false},
    {"f16", 1, 2, false},
    {"bf16", 1, 2, false},
    {"i8", 1, 1, false},
    {"i32", 1, 4, false},
    {"q4_0", 32, 18, true},
    {"q4_1", 32, 20, true},
    {"q5_0", 32, 22, true},
    {"q5_1", 32, 24, true},
    {"q8_0", 32, 34, true},
    {"q2_k", 256, 84, true},
    {"q3_k", 256, 110, true},
    {"q4_k", 256, 144, true},
    {"q5_k", 256, 176, true},
    {"q6_k", 256, 210, true},
    {"q8_k", 256, 292, true},
    {"f64", 1, 8, false},
    {"i64", 1, 8, false},
    {"f8e4m3", 1, 1, false},
}};
}  // namespace

const DTypeInfo& dtype_info(DType t) {
  const auto i = static_cast<size_t>(t);
  LLMK_CHECK(i < kInfo.size(), "invalid dtype value {}", i);
  return kInfo[i];
}

size_t element_size(DType t) {
  const DTypeInfo& info = dtype_info(t);
  LLMK_CHECK(!info.quantized, "dtype {} is a block type and has no element size", info.name);
  return static_cast<size_t>(info.block_bytes);
}

int64_t bytes_for(DType t, int64_t n) {
  const DTypeInfo& info = dtype_info(t);
  LLMK_CHECK(n % info.block_size == 0, "{} elements are not a whole number of {} blocks of {}", n,
             info.name, info.block_size);
  return n / info.block_size * info.block_bytes;
}

}  // namespace llmk
