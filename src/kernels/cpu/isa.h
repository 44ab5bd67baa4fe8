// The instruction sets the CPU kernels are built for, and the one they run with.
//
// The kernels with SIMD code (activation, attention, dequant, matmul, rms_norm, softmax and the
// inline helpers of vec_math.h and block_decode.h) are compiled once per instruction set, each
// build in a namespace of its own (LLMK_CPU_ISA, set by CMakeLists.txt: isa_base, isa_avx2), so
// that one binary holds both without two definitions of one symbol, and runs on any x86-64.
// dispatch.cpp defines the public functions of those headers: each calls the build of the best
// instruction set this CPU has (checked once, with CPUID), or the one LLMK_CPU_ISA in the
// environment names ("base" or "avx2"; one this CPU lacks is an error). An AVX-512 (VNNI) build
// measured no faster than the AVX2 one on a Zen 4 (docs/perf.md, "CPU") and is not built.
#pragma once

#include <string_view>

#ifndef LLMK_CPU_ISA
#define LLMK_CPU_ISA isa_base  // code built with the project's own flags
#endif

namespace llmk::cpu {

enum class Isa {
  Base,  // the compiler's baseline (x86-64: SSE2), or LLMK_CPU_ARCH
  Avx2,  // x86-64-v3: AVX2, FMA, F16C
};

std::string_view isa_name(Isa isa);
// Whether this binary holds a build for isa and this CPU can run it.
bool isa_available(Isa isa);
// The build the kernels use.
Isa isa();
// Makes the kernels use isa from now on (tests); throws llmk::Error where it is not available.
void set_isa(Isa isa);

}  // namespace llmk::cpu
