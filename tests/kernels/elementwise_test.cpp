#include "kernels/cpu/elementwise.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "kernels/cpu/dequant.h"
#include "kernels/cpu/embedding.h"
#include "kernels/test_util.h"

namespace llmk {
namespace {

// f32 add and multiply are correctly rounded: the result must equal the double result rounded
// to f32, bit for bit.
TEST(Add, EqualsRoundedDoubleSum) {
  for (int64_t D : {1, 3, 17, 127}) {
    const int64_t rows = 3, ld = D + 2;
    const auto a = test::random_floats(static_cast<size_t>(rows * ld), 1, -100, 100);
    const auto b = test::random_floats(static_cast<size_t>(rows * ld), 2, -1, 1);
    std::vector<float> y(a.size(), test::kPoison);
    cpu::add(y.data(), ld, a.data(), ld, b.data(), ld, rows, D);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < ld; ++i) {
        const size_t j = static_cast<size_t>(r * ld + i);
        if (i >= D) {
          ASSERT_TRUE(std::isnan(y[j]));
        } else {
          ASSERT_EQ(y[j], static_cast<float>(static_cast<double>(a[j]) + b[j]));
        }
      }
  }
}

TEST(Scale, EqualsRoundedDoubleProduct) {
  const int64_t rows = 4, D = 33, ld = 40;
  auto x = test::random_floats(static_cast<size_t>(rows * ld), 3);
  const auto x0 = x;
  cpu::scale(x.data(), ld, rows, D, 0.37f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < ld; ++i) {
      const size_t j = static_cast<size_t>(r * ld + i);
      ASSERT_EQ(x[j], i < D ? static_cast<float>(static_cast<double>(x0[j]) * 0.37f) : x0[j]);
    }
}

TEST(Copy, ConvertsBetweenFloatTypesThroughStrides) {
  // src: f32 [3, 5] read transposed as [5, 3]; dst: contiguous [5, 3] in each float type.
  const auto src = test::random_floats(15, 4, -70000, 70000);
  const int64_t shape[] = {5, 3};
  const int64_t sstr[] = {1, 5};
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    std::vector<uint8_t> dst(15 * element_size(t), 0xFF);
    const int64_t dstr[] = {3, 1};
    cpu::copy(dst.data(), t, dstr, src.data(), DType::F32, sstr, shape, 2);
    for (int64_t i = 0; i < 5; ++i)
      for (int64_t j = 0; j < 3; ++j) {
        const float s = src[static_cast<size_t>(j * 5 + i)];
        const size_t k = static_cast<size_t>(i * 3 + j);
        if (t == DType::F32) {
          ASSERT_EQ(reinterpret_cast<const float*>(dst.data())[k], s);
        } else {
          const uint16_t got = reinterpret_cast<const uint16_t*>(dst.data())[k];
          ASSERT_EQ(got, t == DType::F16 ? float_to_fp16(s) : float_to_bf16(s)) << s;
        }
      }
    // And back to f32 with a strided destination.
    std::vector<float> back(30, test::kPoison);
    const int64_t bstr[] = {6, 2};
    const int64_t cstr[] = {3, 1};
    cpu::copy(back.data(), DType::F32, bstr, dst.data(), t, cstr, shape, 2);
    for (int64_t i = 0; i < 5; ++i)
      for (int64_t j = 0; j < 3; ++j) {
        const size_t k = static_cast<size_t>(i * 3 + j);
        float want = 0;
        if (t == DType::F32) want = reinterpret_cast<const float*>(dst.data())[k];
        if (t == DType::F16) want = fp16_to_float(reinterpret_cast<const uint16_t*>(dst.data())[k]);
        if (t == DType::BF16)
          want = bf16_to_float(reinterpret_cast<const uint16_t*>(dst.data())[k]);
        ASSERT_EQ(back[static_cast<size_t>(i * 6 + j * 2)], want);
        ASSERT_TRUE(std::isnan(back[static_cast<size_t>(i * 6 + j * 2 + 1)])) << "wrote a gap";
      }
  }
}

TEST(Copy, SameTypeAndUnsupportedPairs) {
  const std::vector<int32_t> src = {1, -2, 3, 4, 5, 6};
  std::vector<int32_t> dst(6, 0);
  const int64_t shape[] = {2, 3}, st[] = {3, 1}, dt[] = {1, 2};
  cpu::copy(dst.data(), DType::I32, dt, src.data(), DType::I32, st, shape, 2);
  EXPECT_EQ(dst, (std::vector<int32_t>{1, 4, -2, 5, 3, 6}));
  EXPECT_THROW(cpu::copy(dst.data(), DType::F32, dt, src.data(), DType::I32, st, shape, 2), Error);
  EXPECT_FALSE(cpu::copy_supports(DType::Q8_0, DType::Q8_0));
  EXPECT_TRUE(cpu::copy_supports(DType::BF16, DType::F16));
}

TEST(Embedding, GathersDequantisedRows) {
  uint32_t seed = 10;
  for (DType t :
       {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_1, DType::Q4_K, DType::Q6_K}) {
    const int64_t V = 11, D = is_quantized(t) ? block_size(t) * 2 : 17;
    const auto table = test::random_weights(t, V, D, seed++);
    const int64_t rb = bytes_for(t, D);
    const std::vector<int32_t> ids = {0, 10, 3, 3, 7};
    const int64_t T = 5, ld = D + 1;
    std::vector<float> out(static_cast<size_t>(T * ld), test::kPoison);
    cpu::embedding(out.data(), ld, table.data(), t, rb, D, ids.data(), 1, T);
    std::vector<float> row(static_cast<size_t>(D));
    for (int64_t i = 0; i < T; ++i) {
      cpu::dequantize_row(t, table.data() + ids[static_cast<size_t>(i)] * rb, row.data(), D);
      test::expect_nontrivial(row);
      for (int64_t d = 0; d < D; ++d)
        ASSERT_EQ(out[static_cast<size_t>(i * ld + d)], row[static_cast<size_t>(d)]);
      ASSERT_TRUE(std::isnan(out[static_cast<size_t>(i * ld + D)])) << "wrote padding";
    }
  }
}

}  // namespace
}  // namespace llmk
