#include <gtest/gtest.h>

#include <numeric>

#include "core/dtype.h"
#include "core/error.h"
#include "core/half.h"
#include "core/tensor.h"

namespace llmk {
namespace {

TEST(DType, SizesOfPlainAndBlockTypes) {
  EXPECT_EQ(element_size(DType::F32), 4u);
  EXPECT_EQ(element_size(DType::BF16), 2u);
  EXPECT_EQ(bytes_for(DType::Q4_0, 64), 36);
  EXPECT_EQ(bytes_for(DType::Q6_K, 512), 420);
  EXPECT_THROW(bytes_for(DType::Q4_K, 100), Error);
  EXPECT_THROW(element_size(DType::Q8_0), Error);
}

TEST(Tensor, ViewsShareStorageAndCheckBounds) {
  Tensor t = Tensor::empty({3, 4}, DType::F32);
  float* p = t.data<float>();
  std::iota(p, p + 12, 0.0f);
  Tensor row = t.select(0, 1);
  ASSERT_EQ(row.shape(), (Shape{4}));
  EXPECT_EQ(row.data<float>()[0], 4.0f);
  Tensor col = t.slice(1, 2, 3);
  EXPECT_FALSE(col.is_contiguous());
  Tensor c = t.transpose(0, 1).contiguous();
  ASSERT_EQ(c.shape(), (Shape{4, 3}));
  EXPECT_EQ(c.data<float>()[1], 4.0f);  // element (0, 1) of the transpose is (1, 0) of t
  EXPECT_EQ(c.data<float>()[5], 9.0f);  // (1, 2) -> (2, 1)
  EXPECT_EQ(t.view({2, -1}).shape(), (Shape{2, 6}));
  EXPECT_THROW(t.view({5, -1}), Error);
  EXPECT_THROW(t.slice(0, 2, 4), Error);
  EXPECT_THROW(t.dim(2), Error);
  EXPECT_THROW(col.view({3}), Error);
}

TEST(Tensor, UnflattenSplitsStridedColumns) {
  Tensor t = Tensor::empty({2, 10}, DType::F32);
  float* p = t.data<float>();
  std::iota(p, p + 20, 0.0f);
  // Columns 4..9 of each row as [2, 3 heads, 2].
  Tensor v = t.slice(1, 4, 10).unflatten(1, {3, 2});
  ASSERT_EQ(v.shape(), (Shape{2, 3, 2}));
  EXPECT_EQ(v.strides(), (std::vector<int64_t>{10, 2, 1}));
  Tensor c = v.contiguous();
  EXPECT_EQ(c.data<float>()[0], 4.0f);
  EXPECT_EQ(c.data<float>()[5], 9.0f);
  EXPECT_EQ(c.data<float>()[6], 14.0f);
  EXPECT_THROW(t.unflatten(1, {3, 3}), Error);
}

TEST(Tensor, BlockTypesSliceByRows) {
  Tensor q = Tensor::empty({4, 64}, DType::Q8_0);
  EXPECT_EQ(q.nbytes(), 4 * 2 * 34);
  EXPECT_EQ(q.row_bytes(), 68);
  Tensor rows = q.slice(0, 1, 3);
  EXPECT_EQ(static_cast<char*>(rows.data()) - static_cast<char*>(q.data()), 68);
  EXPECT_THROW(q.slice(1, 0, 32), Error);
  EXPECT_THROW(Tensor::empty({2, 33}, DType::Q4_0), Error);
}

TEST(Half, RoundTripsAndRounding) {
  for (float f : {0.0f, 1.0f, -2.5f, 65504.0f, 6.1035156e-05f, 5.9604645e-08f, 0.333333f}) {
    EXPECT_EQ(fp16_to_float(float_to_fp16(f)), f == 0.333333f ? 0.33325195f : f) << f;
  }
  EXPECT_EQ(float_to_fp16(1e6f), 0x7c00);
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f)), 1.0f);
  // 1 + 2^-8 is halfway between two bf16 values: ties go to even (1.0).
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.00390625f)), 1.0f);
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.01171875f)), 1.015625f);
}

}  // namespace
}  // namespace llmk
