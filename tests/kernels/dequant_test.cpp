// Dequantisation against fixtures written by tests/fixtures/quant/make_quant.py with the gguf
// Python package, an implementation independent of llmk's.
#include "kernels/cpu/dequant.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/test_util.h"

namespace llmk {
namespace {

struct Fixture {
  uint32_t ggml_type = 0;
  std::vector<uint8_t> raw;
  std::vector<float> expected;
};

Fixture load_fixture(const std::string& name) {
  const std::string path = std::string(LLMK_SOURCE_DIR) + "/tests/fixtures/quant/" + name + ".bin";
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << "missing fixture " << path
                        << " (regenerate with tests/fixtures/quant/make_quant.py)";
  const std::vector<char> bytes((std::istreambuf_iterator<char>(f)), {});
  Fixture fx;
  if (bytes.size() < 20 || std::memcmp(bytes.data(), "LLMKQFX1", 8) != 0) {
    ADD_FAILURE() << path << " is not a quant fixture";
    return fx;
  }
  uint32_t hdr[3];
  std::memcpy(hdr, bytes.data() + 8, sizeof hdr);
  fx.ggml_type = hdr[0];
  const size_t n = hdr[1], nraw = hdr[2];
  if (bytes.size() != 20 + nraw + 4 * n) {
    ADD_FAILURE() << path << " has the wrong size";
    return fx;
  }
  fx.raw.assign(bytes.begin() + 20, bytes.begin() + 20 + static_cast<std::ptrdiff_t>(nraw));
  fx.expected.resize(n);
  std::memcpy(fx.expected.data(), bytes.data() + 20 + nraw, 4 * n);
  return fx;
}

struct Case {
  const char* file;
  DType dtype;
  uint32_t ggml_type;  // GGMLQuantizationType value stored in the fixture
};

class DequantFixture : public ::testing::TestWithParam<Case> {};

// Expected to be bit-exact: the gguf package and llmk both compute scale * q, rounded, then
// + min, rounded, in f32 (llmk keeps the compiler from fusing them into an FMA). So the bits are
// compared, the sign of zero included.
void expect_bits_equal(const std::vector<float>& got, const std::vector<float>& want,
                       const char* what) {
  ASSERT_EQ(got.size(), want.size());
  int bad = 0;
  for (size_t i = 0; i < got.size() && bad < 10; ++i) {
    uint32_t a, b;
    std::memcpy(&a, &got[i], 4);
    std::memcpy(&b, &want[i], 4);
    if (a != b) {
      ++bad;
      ADD_FAILURE() << what << ": weight " << i << " is " << got[i] << " but gguf gives "
                    << want[i];
    }
  }
}

TEST_P(DequantFixture, MatchesGgufBitExactly) {
  const Case c = GetParam();
  const Fixture fx = load_fixture(c.file);
  ASSERT_FALSE(fx.expected.empty());
  ASSERT_EQ(fx.ggml_type, c.ggml_type);
  ASSERT_EQ(static_cast<int64_t>(fx.raw.size()),
            bytes_for(c.dtype, static_cast<int64_t>(fx.expected.size())));
  test::expect_nontrivial(fx.expected);
  const auto n = static_cast<int64_t>(fx.expected.size());

  std::vector<float> got(fx.expected.size(), test::kPoison);
  cpu::dequantize_row(c.dtype, fx.raw.data(), got.data(), n);
  expect_bits_equal(got, fx.expected, "dequantize_row");

  std::fill(got.begin(), got.end(), test::kPoison);
  cpu::dequantize_row_scalar(c.dtype, fx.raw.data(), got.data(), n);
  expect_bits_equal(got, fx.expected, "dequantize_row_scalar");

  // A row that starts at the second block, ends one block early, and leaves its neighbours be.
  const int64_t bs = block_size(c.dtype), bb = bytes_for(c.dtype, bs);
  if (n >= 3 * bs) {
    std::vector<float> part(static_cast<size_t>(n), test::kPoison);
    cpu::dequantize_row(c.dtype, fx.raw.data() + bb, part.data() + bs, n - 2 * bs);
    for (int64_t i = 0; i < n; ++i) {
      if (i < bs || i >= n - bs) {
        ASSERT_TRUE(std::isnan(part[static_cast<size_t>(i)])) << "wrote outside the row at " << i;
      } else {
        ASSERT_EQ(part[static_cast<size_t>(i)], fx.expected[static_cast<size_t>(i)]) << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllTypes, DequantFixture,
    ::testing::Values(Case{"f16", DType::F16, 1}, Case{"bf16", DType::BF16, 30},
                      Case{"q4_0", DType::Q4_0, 2}, Case{"q4_1", DType::Q4_1, 3},
                      Case{"q5_0", DType::Q5_0, 6}, Case{"q5_1", DType::Q5_1, 7},
                      Case{"q8_0", DType::Q8_0, 8}, Case{"q2_k", DType::Q2_K, 10},
                      Case{"q3_k", DType::Q3_K, 11}, Case{"q4_k", DType::Q4_K, 12},
                      Case{"q5_k", DType::Q5_K, 13}, Case{"q6_k", DType::Q6_K, 14}),
    [](const auto& p) { return std::string(p.param.file); });

TEST(Dequant, F32IsACopy) {
  const std::vector<float> src = test::random_floats(37, 1);
  std::vector<float> dst(37, test::kPoison);
  cpu::dequantize_row(DType::F32, src.data(), dst.data(), 37);
  EXPECT_EQ(dst, src);
}

TEST(Dequant, RejectsPartialBlocksAndUnsupportedTypes) {
  std::vector<uint8_t> raw(1024, 0);
  std::vector<float> dst(512);
  EXPECT_THROW(cpu::dequantize_row(DType::Q4_0, raw.data(), dst.data(), 48), Error);
  EXPECT_THROW(cpu::dequantize_row(DType::Q6_K, raw.data(), dst.data(), 128), Error);
  EXPECT_THROW(cpu::dequantize_row(DType::Q8_K, raw.data(), dst.data(), 256), Error);
  EXPECT_THROW(cpu::dequantize_row(DType::I32, raw.data(), dst.data(), 4), Error);
  EXPECT_FALSE(cpu::can_dequantize(DType::Q8_K));
  EXPECT_FALSE(cpu::can_dequantize(DType::I8));
  EXPECT_TRUE(cpu::can_dequantize(DType::Q5_K));
  EXPECT_TRUE(cpu::can_dequantize(DType::BF16));
}

}  // namespace
}  // namespace llmk
