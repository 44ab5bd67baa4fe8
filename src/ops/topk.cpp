#include "kernels/cpu/topk.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "ops/check.h"
#include "ops/ops.h"

#ifdef LLMK_HAS_CUDA
#include "kernels/cuda/topk.h"
#endif

namespace llmk::ops {

using namespace detail;

void topk_lse(Tensor& ids, Tensor& values, Tensor& lse, const Tensor& logits,
              const Tensor* lse_scale) {
  constexpr std::string_view op = "topk_lse";
  const bool cuda =
      lse_scale
          ? on_cuda(op, {{"ids", &ids},
                         {"values", &values},
                         {"lse", &lse},
                         {"logits", &logits},
                         {"lse_scale", lse_scale}})
          : on_cuda(op, {{"ids", &ids}, {"values", &values}, {"lse", &lse}, {"logits", &logits}});
  require_dtype(op, "logits", logits, DType::F32);
  require_ndim(op, "logits", logits, 2);
  require_last_dim_contiguous(op, "logits", logits);
  const int64_t rows = logits.dim(0), vocab = logits.dim(1);
  LLMK_CHECK(vocab >= 1 && vocab <= std::numeric_limits<int32_t>::max(),
             "ops::topk_lse: logits is {}: rows must hold 1 to 2^31 - 1 elements", logits.str());
  require_dtype(op, "ids", ids, DType::I32);
  require_ndim(op, "ids", ids, 2);
  const int64_t k = ids.dim(1);
  LLMK_CHECK(k >= 1 && k <= std::min(vocab, kMaxTopk),
             "ops::topk_lse: ids is {}: k = {} must be in [1, min(vocab = {}, {})]", ids.str(), k,
             vocab, kMaxTopk);
  require_shape(op, "ids", ids, {rows, k});
  require_dtype(op, "values", values, DType::F32);
  require_shape(op, "values", values, {rows, k});
  require_dtype(op, "lse", lse, DType::F32);
  require_shape(op, "lse", lse, {rows});
  for (const auto& [name, t] :
       {NamedTensor{"ids", &ids}, NamedTensor{"values", &values}, NamedTensor{"lse", &lse}}) {
    LLMK_CHECK(t->is_contiguous(), "ops::topk_lse: {} ({}) must be contiguous", name, t->str());
    require_disjoint(op, name, *t, "logits", logits);
  }
  require_disjoint(op, "ids", ids, "values", values);
  require_disjoint(op, "ids", ids, "lse", lse);
  require_disjoint(op, "values", values, "lse", lse);
  if (lse_scale) {
    require_dtype(op, "lse_scale", *lse_scale, DType::F32);
    require_shape(op, "lse_scale", *lse_scale, {rows});
    LLMK_CHECK(lse_scale->is_contiguous(), "ops::topk_lse: lse_scale ({}) must be contiguous",
               lse_scale->str());
  }
  if (rows == 0) return;
  const int kk = static_cast<int>(k);
  const float* scale = lse_scale ? lse_scale->data<const float>() : nullptr;
  if (cuda) {
#ifdef LLMK_HAS_CUDA
    cuda::topk_lse(ids.data<int32_t>(), values.data<float>(), lse.data<float>(),
                   logits.data<const float>(), rows, vocab, logits.stride(0), kk, scale);
#endif
    return;
  }
  for (int64_t r = 0; scale != nullptr && r < rows; ++r) {
    LLMK_CHECK(std::isfinite(scale[r]) && scale[r] > 0,
               "ops::topk_lse: lse_scale[{}] = {} must be finite and > 0", r, scale[r]);
  }
  cpu::topk_lse(ids.data<int32_t>(), values.data<float>(), lse.data<float>(),
                logits.data<const float>(), rows, vocab, logits.stride(0), kk, scale);
}

}  // namespace llmk::ops
