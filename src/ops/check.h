// Argument checks shared by the ops, and the row walker for ops over the last dimension.
// Internal to src/ops. Every failure throws llmk::Error starting "ops::<op>: <argument> ...".
#pragma once

#include <array>
#include <initializer_list>
#include <string_view>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"

namespace llmk::ops::detail {

// A named tensor argument, for checks over several at once.
using NamedTensor = std::pair<std::string_view, const Tensor*>;

// Where an op runs: checks that every tensor is defined and that all are on one device, and
// returns true for Device::CUDA. In builds without CUDA (no LLMK_HAS_CUDA) any CUDA tensor
// throws "ops::<op>: <name> is ... on the GPU, but llmk was not built with CUDA kernels".
// Optional tensors that are absent are simply left out of the list. Every op dispatches with
// it, so that CPU builds still compile and the CUDA call sits in one #ifdef:
//
//   const bool cuda = on_cuda(op, {{"out", &out}, {"x", &x}, {"w", &w}});
//   const DType dt = require_activations(op, cuda, {{"out", &out}, {"x", &x}});  // ops.h
//   ...                                                           // checks common to both
//   if (cuda) {
//   #ifdef LLMK_HAS_CUDA
//     cuda::rms_norm(...);  // the launcher of kernels/cuda/<op>.h
//   #endif
//     return;
//   }
//   cpu::rms_norm(...);
bool on_cuda(std::string_view op, std::initializer_list<NamedTensor> tensors);

// Defined, and on the CPU.
void require_cpu(std::string_view op, std::string_view name, const Tensor& t);
void require_dtype(std::string_view op, std::string_view name, const Tensor& t, DType want);
// The activations of one call: all of one dtype, f32 on the CPU and bf16, f16 or f32 on CUDA
// (a model's activation dtype, LoadOptions::dtype). Returns that dtype.
DType require_activations(std::string_view op, bool cuda,
                          std::initializer_list<NamedTensor> tensors);
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
// same-shaped tensors of plain dtypes (any mix), merging leading dimensions wherever every tensor
// allows it (one call for contiguous tensors). ptrs[k] (void*) points at the first row of tensor
// k, row_strides[k] is in elements of tensor k's dtype.
template <size_t N, class Fn>
void for_each_row_run_raw(const std::array<const Tensor*, N>& ts, Fn&& fn) {
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
  std::array<int64_t, N> es;
  for (size_t k = 0; k < N; ++k) es[k] = static_cast<int64_t>(element_size(ts[k]->dtype()));
  for (int64_t o = 0; o < outer; ++o) {
    std::array<void*, N> ptrs;
    for (size_t k = 0; k < N; ++k) {
      int64_t offset = 0;  // elements
      int64_t rem = o;
      for (size_t i = dims.size(); i-- > 0;) {
        const int64_t idx = rem % dims[i].size;
        rem /= dims[i].size;
        offset += idx * dims[i].stride[k];
      }
      ptrs[k] = static_cast<char*>(ts[k]->data()) + offset * es[k];
    }
    fn(ptrs, run.size, run.stride);
  }
}

// for_each_row_run_raw over f32 tensors, with float* row pointers.
template <size_t N, class Fn>
void for_each_row_run(const std::array<const Tensor*, N>& ts, Fn&& fn) {
  for_each_row_run_raw<N>(
      ts, [&](const std::array<void*, N>& raw, int64_t rows, const std::array<int64_t, N>& ld) {
        std::array<float*, N> ptrs;
        for (size_t k = 0; k < N; ++k) ptrs[k] = static_cast<float*>(raw[k]);
        fn(ptrs, rows, ld);
      });
}

}  // namespace llmk::ops::detail
