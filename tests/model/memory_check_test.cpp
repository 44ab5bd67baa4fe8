// The GPU memory check at its boundary, on the CPU: a need that equals the free memory fits, one
// byte more does not, and the refusal names every figure.
#include "model/memory_check.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>

#include "core/error.h"

namespace llmk {
namespace {

constexpr uint64_t kMiB = 1 << 20;
// 1 GiB of weights, 512 MiB of KV cache, 64 MiB of activations, plus the margin.
constexpr DeviceMemoryNeed kNeed{1024 * kMiB, 512 * kMiB, 64 * kMiB};
constexpr uint64_t kNeedTotal = 1600 * kMiB + kDeviceMemoryMargin;
constexpr uint64_t kTotal = 80ull << 30;

std::string refusal(const DeviceMemoryNeed& need, uint64_t free_bytes) {
  try {
    check_memory_fits("m.gguf", need, free_bytes, kTotal);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(MemoryCheck, ANeedEqualToTheFreeMemoryFits) {
  EXPECT_NO_THROW(check_memory_fits("m.gguf", kNeed, kNeedTotal, kTotal));
  EXPECT_NO_THROW(check_memory_fits("m.gguf", kNeed, kNeedTotal + 1, kTotal));
}

TEST(MemoryCheck, OneByteShortIsRefusedWithEveryFigure) {
  const std::string m = refusal(kNeed, kNeedTotal - 1);
  ASSERT_FALSE(m.empty()) << "a need one byte over the free memory passed";
  EXPECT_NE(m.find("not enough GPU memory for m.gguf"), std::string::npos) << m;
  EXPECT_NE(m.find("needs 1856 MiB"), std::string::npos) << m;  // 1600 + the 256 MiB margin
  EXPECT_NE(m.find("weights 1024, KV cache 512, activations 64, margin 256"), std::string::npos)
      << m;
  EXPECT_NE(m.find("1856 MiB of 81920 MiB are free"), std::string::npos) << m;
  EXPECT_NE(m.find("--ctx"), std::string::npos) << m;
}

// Each figure counts: the margin alone, and one byte of any part, tip a need that just fits.
TEST(MemoryCheck, EveryPartCounts) {
  EXPECT_NO_THROW(check_memory_fits("m.gguf", {}, kDeviceMemoryMargin, kTotal));
  EXPECT_THROW(check_memory_fits("m.gguf", {}, kDeviceMemoryMargin - 1, kTotal), Error);
  for (DeviceMemoryNeed n : {DeviceMemoryNeed{1, 0, 0}, {0, 1, 0}, {0, 0, 1}}) {
    EXPECT_THROW(check_memory_fits("m.gguf", n, kDeviceMemoryMargin, kTotal), Error);
  }
}

// A sum that wraps around 64 bits must not look small.
TEST(MemoryCheck, ASumPast64BitsDoesNotFit) {
  const uint64_t max = std::numeric_limits<uint64_t>::max();
  // Wrapped, these sums would be kDeviceMemoryMargin - 1 and 1 byte.
  EXPECT_THROW(check_memory_fits("m.gguf", {max, 0, 0}, max, max), Error);
  EXPECT_THROW(check_memory_fits("m.gguf", {max - kDeviceMemoryMargin + 1, 1, 0}, kMiB, kTotal),
               Error);
}

}  // namespace
}  // namespace llmk
