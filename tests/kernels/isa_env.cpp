// LLMK_TEST_CPU_ISA=base|avx2: every test of this program runs the CPU kernels' build for
// that instruction set (kernels/cpu/isa.h), or is skipped where this CPU lacks it. ctest runs
// the program once per instruction set (tests/CMakeLists.txt).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "kernels/cpu/isa.h"

namespace llmk {
namespace {

class IsaEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    const char* v = std::getenv("LLMK_TEST_CPU_ISA");
    if (v == nullptr || *v == '\0') return;
    for (const cpu::Isa isa : {cpu::Isa::Base, cpu::Isa::Avx2}) {
      if (std::string(v) != cpu::isa_name(isa)) continue;
      if (!cpu::isa_available(isa)) GTEST_SKIP() << "this CPU (or build) lacks " << v;
      cpu::set_isa(isa);
      return;
    }
    FAIL() << "LLMK_TEST_CPU_ISA=" << v << ": not base or avx2";
  }
};

const auto* const kEnvironment = ::testing::AddGlobalTestEnvironment(new IsaEnvironment);

}  // namespace
}  // namespace llmk
