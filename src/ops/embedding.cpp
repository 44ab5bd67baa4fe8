#include "kernels/cpu/embedding.h"

#include "kernels/cpu/dequant.h"
#include "ops/check.h"
#include "ops/ops.h"

#ifdef LLMK_HAS_CUDA
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/gemm/qlinear.h"
#include "kernels/quant_layout.h"
#endif

namespace llmk::ops {

using namespace detail;

void embedding(Tensor& out, const Tensor& table, const Tensor& ids) {
  constexpr std::string_view op = "embedding";
  const bool cuda = on_cuda(op, {{"out", &out}, {"table", &table}, {"ids", &ids}});
  require_ndim(op, "table", table, 2);
  const bool quantized = is_quantized(table.dtype());
  if (cuda && quantized) {
#ifdef LLMK_HAS_CUDA
    LLMK_CHECK(qlayout::gpu_keeps(table.dtype()),
               "ops::embedding: table is {} on the GPU, but the CUDA embedding reads the block "
               "types Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K only",
               table.str());
    require_dtype(op, "out", out, DType::BF16);
    LLMK_CHECK(table.is_contiguous(),
               "ops::embedding: table is {}: a quantised table must be contiguous", table.str());
#endif
  } else if (cuda) {
    require_activations(op, cuda, {{"table", &table}, {"out", &out}});
  } else {
    LLMK_CHECK(cpu::can_dequantize(table.dtype()),
               "ops::embedding: table dtype {} is not supported", dtype_name(table.dtype()));
  }
  require_last_dim_contiguous(op, "table", table);
  require_ndim(op, "ids", ids, 1);
  require_dtype(op, "ids", ids, DType::I32);
  if (!cuda) require_dtype(op, "out", out, DType::F32);
  const int64_t V = table.dim(0), D = table.dim(1), T = ids.dim(0);
  require_shape(op, "out", out, {T, D});
  require_last_dim_contiguous(op, "out", out);
  require_disjoint(op, "out", out, "table", table);
  require_disjoint(op, "out", out, "ids", ids);
  const auto* id = ids.data<const int32_t>();
  if (cuda) {
#ifdef LLMK_HAS_CUDA
    // Ids stay on the device: out-of-range ones write zeros (ops.h).
    if (quantized) {
      LLMK_CHECK(out.stride(0) % 8 == 0 && reinterpret_cast<uintptr_t>(out.data()) % 16 == 0,
                 "ops::embedding: out is {}: rows of a quantised table's output must start "
                 "16-byte aligned",
                 out.str());
      cuda::qembedding(out.data(), out.stride(0), table.data(), table.dtype(), V, D, id,
                       ids.stride(0), T);
      return;
    }
    cuda::embedding(out.data(), out.stride(0), table.data(), table.stride(0), V, D,
                    static_cast<int>(element_size(table.dtype())), id, ids.stride(0), T);
#endif
    return;
  }
  for (int64_t t = 0; t < T; ++t) {
    const int32_t v = id[t * ids.stride(0)];
    LLMK_CHECK(v >= 0 && v < V,
               "ops::embedding: ids[{}] = {} is out of range for a vocabulary of "
               "{} (table {})",
               t, v, V, table.str());
  }
  // Block types are stored whole rows back to back; plain types may have a row stride.
  const int64_t row_bytes =
      is_quantized(table.dtype())
          ? table.row_bytes()
          : table.stride(0) * static_cast<int64_t>(element_size(table.dtype()));
  cpu::embedding(out.data<float>(), out.stride(0), table.data(), table.dtype(), row_bytes, D, id,
                 ids.stride(0), T);
}

}  // namespace llmk::ops
