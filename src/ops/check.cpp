#include "ops/check.h"

#include <algorithm>
#include <cstdint>

#include "ops/ops.h"

namespace llmk::ops::detail {

namespace {

// [first, last] byte addresses an f32-or-other plain tensor touches; block types are contiguous.
struct ByteSpan {
  uintptr_t first, last;
};
ByteSpan byte_span(const Tensor& t) {
  const auto base = reinterpret_cast<uintptr_t>(t.data());
  if (t.numel() == 0) return {base, base};
  if (is_quantized(t.dtype())) return {base, base + static_cast<uintptr_t>(t.nbytes()) - 1};
  const auto es = static_cast<int64_t>(element_size(t.dtype()));
  int64_t lo = 0, hi = 0;
  for (int i = 0; i < t.ndim(); ++i) {
    const int64_t reach = (t.dim(i) - 1) * t.stride(i);
    (reach < 0 ? lo : hi) += reach;
  }
  return {static_cast<uintptr_t>(static_cast<int64_t>(base) + lo * es),
          static_cast<uintptr_t>(static_cast<int64_t>(base) + hi * es + es - 1)};
}

// Rows of `width` contiguous elements `pitch` elements apart (every dimension but the last
// collapsing into rows), as a column range of a wider matrix is; false for other layouts.
bool row_layout(const Tensor& t, int64_t& width, int64_t& pitch) {
  const int n = t.ndim();
  if (n < 2 || is_quantized(t.dtype()) || t.stride(n - 1) != 1) return false;
  width = t.dim(n - 1);
  pitch = t.stride(n - 2);
  for (int i = 0; i + 2 < n; ++i) {
    if (t.dim(i) != 1 && t.stride(i) != t.stride(i + 1) * t.dim(i + 1)) return false;
  }
  return pitch >= width;
}

bool overlaps(const Tensor& a, const Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0) return false;
  const ByteSpan x = byte_span(a), y = byte_span(b);
  if (x.first > y.last || y.first > x.last) return false;
  // Column ranges of one matrix (act's gate half and up half of gate|up): their spans interleave
  // but their elements are disjoint when the ranges do not meet within a row.
  int64_t wa = 0, pa = 0, wb = 0, pb = 0;
  const auto es = static_cast<intptr_t>(element_size(a.dtype()));
  const intptr_t diff = reinterpret_cast<intptr_t>(b.data()) - reinterpret_cast<intptr_t>(a.data());
  if (a.dtype() == b.dtype() && row_layout(a, wa, pa) && row_layout(b, wb, pb) && pa == pb &&
      diff % es == 0) {
    const int64_t d = diff / es;
    const int64_t col = ((d % pa) + pa) % pa;  // b's first column within a's rows
    if (col >= wa && col + wb <= pa) return false;
  }
  return true;
}

}  // namespace

bool on_cuda(std::string_view op, std::initializer_list<NamedTensor> tensors) {
  for (const auto& [name, t] : tensors) {
    LLMK_CHECK(t->defined(), "ops::{}: {} is undefined (no data)", op, name);
#ifndef LLMK_HAS_CUDA
    LLMK_CHECK(t->device() == Device::CPU,
               "ops::{}: {} is {} on the GPU, but llmk was not built with CUDA kernels", op, name,
               t->str());
#endif
  }
  if (tensors.size() == 0) return false;
  const auto& [first_name, first] = *tensors.begin();
  for (const auto& [name, t] : tensors) {
    LLMK_CHECK(t->device() == first->device(),
               "ops::{}: {} is {} on {} but {} is {} on {}; all tensors of one call must be on "
               "one device",
               op, name, t->str(), device_name(t->device()), first_name, first->str(),
               device_name(first->device()));
  }
  return first->device() == Device::CUDA;
}

void require_cpu(std::string_view op, std::string_view name, const Tensor& t) {
  LLMK_CHECK(t.defined(), "ops::{}: {} is undefined (no data)", op, name);
  LLMK_CHECK(t.device() == Device::CPU,
             "ops::{}: {} is {} on the GPU, but llmk was not built with CUDA kernels", op, name,
             t.str());
}

void require_dtype(std::string_view op, std::string_view name, const Tensor& t, DType want) {
  LLMK_CHECK(t.dtype() == want, "ops::{}: {} is {} but must be {}", op, name, t.str(),
             dtype_name(want));
}

DType require_activations(std::string_view op, bool cuda,
                          std::initializer_list<NamedTensor> tensors) {
  LLMK_CHECK(tensors.size() > 0, "ops::{}: no activation tensors to check", op);
  const auto& [first_name, first] = *tensors.begin();
  const DType dt = first->dtype();
  if (cuda) {
    LLMK_CHECK(is_float_type(dt), "ops::{}: {} is {} but must be bf16, f16 or f32 on CUDA", op,
               first_name, first->str());
  } else {
    require_dtype(op, first_name, *first, DType::F32);
  }
  for (const auto& [name, t] : tensors) {
    LLMK_CHECK(t->dtype() == dt, "ops::{}: {} is {} but {} is {}: they must share one dtype", op,
               name, t->str(), first_name, first->str());
  }
  return dt;
}

void require_ndim(std::string_view op, std::string_view name, const Tensor& t, int want) {
  LLMK_CHECK(t.ndim() == want, "ops::{}: {} is {} but must have {} dimensions", op, name, t.str(),
             want);
}

void require_shape(std::string_view op, std::string_view name, const Tensor& t, const Shape& want) {
  LLMK_CHECK(t.shape() == want, "ops::{}: {} is {} but must have shape {}", op, name, t.str(),
             shape_str(want));
}

void require_last_dim_contiguous(std::string_view op, std::string_view name, const Tensor& t) {
  LLMK_CHECK(t.ndim() == 0 || t.dim(-1) <= 1 || t.stride(-1) == 1,
             "ops::{}: {} ({}) must have a contiguous last dimension, got strides [{}]", op, name,
             t.str(), fmt::join(t.strides(), ", "));
}

void require_no_partial_overlap(std::string_view op, std::string_view out_name, const Tensor& out,
                                std::string_view in_name, const Tensor& in) {
  if (!overlaps(out, in)) return;
  const bool same = out.data() == in.data() && out.shape() == in.shape() &&
                    out.strides() == in.strides() && out.dtype() == in.dtype();
  LLMK_CHECK(same,
             "ops::{}: {} ({}) partially overlaps {} ({}); they must be the same view or "
             "disjoint",
             op, out_name, out.str(), in_name, in.str());
}

void require_disjoint(std::string_view op, std::string_view out_name, const Tensor& out,
                      std::string_view in_name, const Tensor& in) {
  LLMK_CHECK(!overlaps(out, in), "ops::{}: {} ({}) overlaps {} ({}); they must be disjoint", op,
             out_name, out.str(), in_name, in.str());
}

}  // namespace llmk::ops::detail

namespace llmk::ops {

namespace {
thread_local bool t_batch_invariant = false;
}  // namespace

BatchInvariance::BatchInvariance(bool on) : prev_(t_batch_invariant) {
  t_batch_invariant = on || prev_;
}
BatchInvariance::~BatchInvariance() { t_batch_invariant = prev_; }
bool batch_invariant() { return t_batch_invariant; }

}  // namespace llmk::ops
