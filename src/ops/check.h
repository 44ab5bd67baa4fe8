// Argument checks shared by the ops, and the row walker for ops over the last dimension.
// Internal to src/ops. Every failure throws llmk::Error starting "ops::<op>: <argument> ...".
#pragma once

#include <array>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"

namespace llmk::ops::detail {

// Defined, and on the CPU (the only backend built so far).
void require_cpu(std::string_view op, std::string_view name, const Tensor& t);
void require_dtype(std::string_view op, std::string_view name, const Tensor& t, DType want);
void require_ndim(std::string_view op, std::string_view name, const Tensor& t, int want);
void require_shape(std::string_view op, std::string_view name, const Tensor& t, const Shape& want);
// Elements of the last dimension are adjacent (stride 1), so kernels can run along rows.
void require_last_dim_contiguous(std::string_view op, std::string_view name, const Tensor& t);
// `out` and `in` either do not overlap, or are the very same elements (exact aliasing).
void require_no_partial_overlap(std::string_view op, std::string_view out_name, const Tensor& out,
                                std::string_view in_name, const Tensor& in);
// `out` and `in` share no bytes.
void require_disjoint(std::string_view op, std::string_view out_name, const Tensor& out,
                      std::string_view in_name, const Tensor& in);

// Calls fn(ptrs, rows, row_strides) over runs of equally spaced rows of the last dimension of
// same-shaped f32 tensors, merging leading dimensions wherever every tensor allows it (one call
// for contiguous tensors). ptrs[k] points at the first row of tensor k, row_strides[k] is in
// elements.
template <size_t N, class Fn>
void for_each_row_run(const std::array<const Tensor*, N>& ts, Fn&& fn) {
  const Tensor& t0 = *ts[0];
  const int nd = t0.ndim();
  struct Dim {
    int64_t size;
    std::array<int64_t, N> stride;
  };
  std::vector<Dim> dims;  // leading dimensions, outermost first
  for (int i = 0; i + 1 < nd; ++i) {
    if (t0.dim(i) == 1) continue;
    Dim d{t0.dim(i), {}};
    for (size_t k = 0; k < N; ++k) d.stride[k] = ts[k]->stride(i);
    if (!dims.empty()) {
      Dim& outer = dims.back();
      bool mergeable = true;
      for (size_t k = 0; k < N; ++k) mergeable &= outer.stride[k] == d.stride[k] * d.size;
      if (mergeable) {
        outer.size *= d.size;
        outer.stride = d.stride;
        continue;
      }
    }
    dims.push_back(d);
  }
  Dim run{1, {}};
  if (!dims.empty()) {
    run = dims.back();
    dims.pop_back();
  }
  int64_t outer = 1;
  for (const Dim& d : dims) outer *= d.size;
  for (int64_t o = 0; o < outer; ++o) {
    std::array<float*, N> ptrs;
    for (size_t k = 0; k < N; ++k) ptrs[k] = static_cast<float*>(ts[k]->data());
    int64_t rem = o;
    for (size_t i = dims.size(); i-- > 0;) {
      const int64_t idx = rem % dims[i].size;
      rem /= dims[i].size;
      for (size_t k = 0; k < N; ++k) ptrs[k] += idx * dims[i].stride[k];
    }
    fn(ptrs, run.size, run.stride);
  }
}

}  // namespace llmk::ops::detail
