// kernels/quant_layout.h: the GPU layout of block-quantised matrices, on the host.
#include "kernels/quant_layout.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"

namespace llmk {
namespace {

constexpr DType kKept[] = {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1,
                           DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K};

// Each layout splits the GGUF block exactly: sizes agree with dtype_info, the values are whole
// 16-byte units, and they sit inside the block.
TEST(QuantLayout, SplitsEachKeptBlockIntoAlignedValuesAndMeta) {
  for (DType t : kKept) {
    const qlayout::Layout l = qlayout::layout(t);
    EXPECT_TRUE(qlayout::gpu_keeps(t)) << dtype_name(t);
    EXPECT_EQ(l.block_elems, block_size(t)) << dtype_name(t);
    EXPECT_EQ(l.block_bytes, dtype_info(t).block_bytes) << dtype_name(t);
    EXPECT_EQ(l.q_bytes % 16, 0) << dtype_name(t);
    EXPECT_LE(l.q_off + l.q_bytes, l.block_bytes) << dtype_name(t);
    EXPECT_GT(l.meta_bytes(), 0) << dtype_name(t);
  }
  for (DType t : {DType::F32, DType::BF16, DType::Q2_K, DType::Q3_K, DType::Q8_K}) {
    EXPECT_FALSE(qlayout::gpu_keeps(t)) << dtype_name(t);
  }
}

// repack moves every byte once: values first (row after row, bytes 1 and 2 of each word
// swapped), then the meta in block order; and unpack undoes it.
TEST(QuantLayout, RepackPlacesEveryByteAndUnpackRestoresTheFile) {
  std::mt19937 rng(5);
  for (DType t : kKept) {
    const qlayout::Layout l = qlayout::layout(t);
    const int64_t rows = 3, k = 2 * l.block_elems, blocks = rows * 2;
    std::vector<uint8_t> file(static_cast<size_t>(blocks * l.block_bytes));
    for (uint8_t& b : file) b = static_cast<uint8_t>(rng());
    std::vector<uint8_t> gpu(file.size(), 0), back(file.size(), 0);
    qlayout::repack(t, file.data(), gpu.data(), rows, k);
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* block = file.data() + b * l.block_bytes;
      // Q5_K's fifth bits (its first 32 value bytes) are regrouped: checked below, bit by bit.
      const int first = t == DType::Q5_K ? 32 : 0;
      for (int i = first; i < l.q_bytes; ++i) {  // bytes 1 and 2 of each word trade places
        const int from = i % 4 == 1 ? i + 1 : i % 4 == 2 ? i - 1 : i;
        ASSERT_EQ(gpu[b * l.q_bytes + i], block[l.q_off + from])
            << dtype_name(t) << " block " << b << " value byte " << i;
      }
      const uint8_t* meta = gpu.data() + blocks * l.q_bytes + b * l.meta_bytes();
      // Q5_0's and Q5_1's qh (the 4 bytes before the values) is permuted: checked below.
      const bool q5 = t == DType::Q5_0 || t == DType::Q5_1;
      int m = 0;
      for (int i = 0; i < l.block_bytes; ++i) {
        if (i >= l.q_off && i < l.q_off + l.q_bytes) continue;
        if (!(q5 && i >= l.q_off - 4 && i < l.q_off)) {
          ASSERT_EQ(meta[m], block[i]) << dtype_name(t) << " block " << b << " byte " << i;
        }
        ++m;
      }
    }
    // regions(): where the kernels find each row's values and meta.
    const qlayout::Regions w = qlayout::regions(t, gpu.data(), rows, k);
    for (int64_t n = 0; n < rows; ++n) {
      EXPECT_EQ(w.q + n * w.qrow, gpu.data() + n * 2 * l.q_bytes) << dtype_name(t) << " row " << n;
      EXPECT_EQ(w.meta + n * w.mrow, gpu.data() + blocks * l.q_bytes + n * 2 * l.meta_bytes())
          << dtype_name(t) << " row " << n;
    }
    qlayout::unpack(t, gpu.data(), back.data(), rows, k);
    EXPECT_EQ(back, file) << dtype_name(t);
  }
}

// Q5_0's and Q5_1's fifth bits on the GPU: weight k = 16 hi + 4 t + 2 h + e (the lane t that
// reads word t of the values holds it in pair h of its nibbles, the low ones or hi) has its bit
// at 4 t + 2 h + hi + 16 e of the meta's permuted qh word.
TEST(QuantLayout, Q5FifthBitsSitWhereTheLaneLooks) {
  std::mt19937 rng(11);
  for (DType t : {DType::Q5_0, DType::Q5_1}) {
    const qlayout::Layout l = qlayout::layout(t);
    const int64_t rows = 2, k = 64, blocks = 4;
    std::vector<uint8_t> file(static_cast<size_t>(blocks * l.block_bytes)), gpu(file.size());
    for (uint8_t& b : file) b = static_cast<uint8_t>(rng());
    qlayout::repack(t, file.data(), gpu.data(), rows, k);
    for (int64_t b = 0; b < blocks; ++b) {
      uint32_t qh = 0, got = 0;
      std::memcpy(&qh, file.data() + b * l.block_bytes + l.q_off - 4, 4);
      std::memcpy(&got, gpu.data() + blocks * l.q_bytes + b * l.meta_bytes() + l.q_off - 4, 4);
      for (int hi = 0; hi < 2; ++hi)
        for (int lane = 0; lane < 4; ++lane)
          for (int h = 0; h < 2; ++h)
            for (int e = 0; e < 2; ++e) {
              const int w = 16 * hi + 4 * lane + 2 * h + e;
              ASSERT_EQ((got >> (4 * lane + 2 * h + hi + 16 * e)) & 1u, (qh >> w) & 1u)
                  << dtype_name(t) << " block " << b << " weight " << w;
            }
    }
  }
}

// Q5_K's fifth bits on the GPU: the file's bit 2g + hi of qh[l] (group g's low or high nibble
// of qs byte 32 g + l) is, in half n = g / 2's 16-byte vector (at 16 n in the block's values),
// bit 4 (l / 16) + 2 (g % 2) + hi of byte l % 16, before the swap of each word's bytes 1 and 2.
TEST(QuantLayout, Q5KFifthBitsSitBesideTheirNibbles) {
  std::mt19937 rng(9);
  const qlayout::Layout l = qlayout::layout(DType::Q5_K);
  const int64_t rows = 2, k = 512, blocks = 4;
  std::vector<uint8_t> file(static_cast<size_t>(blocks * l.block_bytes)), gpu(file.size());
  for (uint8_t& b : file) b = static_cast<uint8_t>(rng());
  qlayout::repack(DType::Q5_K, file.data(), gpu.data(), rows, k);
  const auto unswapped = [](int i) { return i % 4 == 1 ? i + 1 : i % 4 == 2 ? i - 1 : i; };
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* qh = file.data() + b * l.block_bytes + 16;
    const uint8_t* vec = gpu.data() + b * l.q_bytes;
    for (int g = 0; g < 4; ++g) {
      for (int byte = 0; byte < 32; ++byte) {
        for (int hi = 0; hi < 2; ++hi) {
          const int want = (qh[byte] >> (2 * g + hi)) & 1;
          const int at = unswapped(16 * (g / 2) + byte % 16);
          const int got = (vec[at] >> (4 * (byte / 16) + 2 * (g % 2) + hi)) & 1;
          ASSERT_EQ(got, want) << "block " << b << " group " << g << " byte " << byte << " hi "
                               << hi;
        }
      }
    }
  }
}

}  // namespace
}  // namespace llmk
