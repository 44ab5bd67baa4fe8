#include <vector>

#include "core/half.h"
#include "core/thread_pool.h"
#include "kernels/cpu/dequant.h"
#include "ops/check.h"
#include "ops/ops.h"

namespace llmk::ops {

void dequantize(Tensor& out, const Tensor& src) {
  constexpr std::string_view op = "dequantize";
  detail::require_cpu(op, "out", out);
  detail::require_cpu(op, "src", src);
  LLMK_CHECK(is_float_type(out.dtype()), "ops::dequantize: out is {}, expected f32, bf16 or f16",
             out.str());
  LLMK_CHECK(cpu::can_dequantize(src.dtype()), "ops::dequantize: cannot read dtype {} of src {}",
             dtype_name(src.dtype()), src.str());
  detail::require_shape(op, "out", out, src.shape());
  LLMK_CHECK(out.is_contiguous() && src.is_contiguous(),
             "ops::dequantize: out {} and src {} must be contiguous", out.str(), src.str());
  if (src.numel() == 0) return;
  const int64_t k = src.dim(-1), rows = src.numel() / k;
  const int64_t src_row = src.row_bytes();
  const auto* in = static_cast<const uint8_t*>(src.data());
  cpu_pool().parallel_for(rows, 16, [&](int64_t r0, int64_t r1) {
    std::vector<float> buf(out.dtype() != DType::F32 ? static_cast<size_t>(k) : 0);
    for (int64_t r = r0; r < r1; ++r) {
      if (out.dtype() == DType::F32) {
        cpu::dequantize_row(src.dtype(), in + r * src_row, out.data<float>() + r * k, k);
      } else {
        cpu::dequantize_row(src.dtype(), in + r * src_row, buf.data(), k);
        uint16_t* o = out.data<uint16_t>() + r * k;
        const bool bf16 = out.dtype() == DType::BF16;
        for (int64_t i = 0; i < k; ++i) {
          const float v = buf[static_cast<size_t>(i)];
          o[i] = bf16 ? float_to_bf16(v) : float_to_fp16(v);
        }
      }
    }
  });
}

}  // namespace llmk::ops
