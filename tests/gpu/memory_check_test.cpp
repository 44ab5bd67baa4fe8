// Loading a model that does not fit the GPU fails before any copy, with the figures named,
// against the device's real free memory. The boundary itself (a need equal to the free memory
// fits, one byte more does not) is tested on the CPU: tests/model/memory_check_test.cpp.
#include "model/memory_check.h"

#include <gtest/gtest.h>

#include <string>

#include "core/cuda/device.h"
#include "core/error.h"

namespace llmk {
namespace {

TEST(MemoryCheck, TooLargeModelsFailWithTheFigures) {
  cuda::init();
  const auto [free, total] = cuda::mem_info();
  EXPECT_NO_THROW(check_device_memory("small.gguf", Device::CUDA, 1 << 20, 1 << 20, 1 << 20));
  try {
    check_device_memory("huge.gguf", Device::CUDA, total, 4ull << 30, 1ull << 30);
    FAIL() << "expected llmk::Error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("not enough GPU memory for huge.gguf"), std::string::npos) << m;
    EXPECT_NE(m.find("KV cache 4096"), std::string::npos) << m;
    EXPECT_NE(m.find("MiB are free"), std::string::npos) << m;
    EXPECT_NE(m.find("--ctx"), std::string::npos) << m;
  }
  (void)free;
}

}  // namespace
}  // namespace llmk
