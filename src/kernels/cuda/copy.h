// Strided copies with dtype conversion on the GPU.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace llmk::cuda {

// Most dimensions copy() takes after merging (dims of size 1 dropped, mergeable neighbours
// joined): any view of up to this many dimensions qualifies.
inline constexpr int kMaxCopyDims = 6;

// dst = src element by element over an n-d index space, both in device memory; strides in
// elements of each side's dtype. Converts between f32, f16 and bf16 (f32 -> 16-bit rounds to
// nearest even); any other plain dtype only copies to itself. dst and src must not overlap.
// Returns false, launching nothing, for a pair of dtypes it does not convert or views that need
// more than kMaxCopyDims dimensions.
bool copy(void* dst, DType dst_type, const int64_t* dst_strides, const void* src, DType src_type,
          const int64_t* src_strides, const int64_t* shape, int ndim);

}  // namespace llmk::cuda
