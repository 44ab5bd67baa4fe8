// The public functions of the CPU kernels built once per instruction set (isa.h): each calls
// the build isa() names. Built with the project's own flags, as the code that calls them.
#include <atomic>
#include <cstdlib>
#include <string>

#ifdef LLMK_CPU_ISA_X86
#include <cpuid.h>
#endif

#include "core/error.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/dequant.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/rms_norm.h"
#include "kernels/cpu/softmax.h"

// Each build's functions, declared as the public ones (the same signatures, in its namespace).
#define LLMK_CPU_ISA_DECLARE(ns)                                                                   \
  namespace llmk::cpu::ns {                                                                        \
  void gated_act(float* out, int64_t out_ld, const float* gate, int64_t gate_ld, const float* up,  \
                 int64_t up_ld, int64_t rows, int64_t F, Activation act);                          \
  void attention(const AttentionArgs& a);                                                          \
  bool can_dequantize(DType t);                                                                    \
  void dequantize_row(DType t, const void* src, float* dst, int64_t n);                            \
  void dequantize_row_scalar(DType t, const void* src, float* dst, int64_t n);                     \
  bool linear_int8_supports(DType wtype);                                                          \
  bool linear_supports(DType wtype);                                                               \
  LinearPath linear_choose_path(const LinearArgs& a);                                              \
  void linear(const LinearArgs& a, LinearPath path);                                               \
  void rms_norm(float* out, int64_t out_ld, const float* x, int64_t x_ld, int64_t rows, int64_t D, \
                const float* w, float eps, bool add_one);                                          \
  void softmax(float* out, int64_t out_ld, const float* x, int64_t x_ld, int64_t rows, int64_t N); \
  }

LLMK_CPU_ISA_DECLARE(isa_base)
#ifdef LLMK_CPU_ISA_X86
LLMK_CPU_ISA_DECLARE(isa_avx2)
#endif

namespace llmk::cpu {

namespace {

bool cpu_has(Isa isa) {
#ifdef LLMK_CPU_ISA_X86
  switch (isa) {
    case Isa::Base:
      return true;
    case Isa::Avx2: {
      // F16C through CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports has no "f16c".
      unsigned a = 0, b = 0, c = 0, d = 0;
      const bool f16c = __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & (1u << 29)) != 0;
      return f16c && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }
  }
  return false;
#else
  return isa == Isa::Base;
#endif
}

Isa best() {
  if (const char* v = std::getenv("LLMK_CPU_ISA"); v != nullptr && *v != '\0') {
    const std::string name(v);
    for (const Isa isa : {Isa::Base, Isa::Avx2}) {
      if (name != isa_name(isa)) continue;
      LLMK_CHECK(isa_available(isa), "LLMK_CPU_ISA={}: this CPU (or this build) lacks it", name);
      return isa;
    }
    LLMK_FAIL("LLMK_CPU_ISA={}: not one of base, avx2", name);
  }
  return isa_available(Isa::Avx2) ? Isa::Avx2 : Isa::Base;
}

std::atomic<Isa>& current() {
  static std::atomic<Isa> isa{best()};
  return isa;
}

std::atomic<bool> g_int8_activations{false};

}  // namespace

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::Base:
      return "base";
    case Isa::Avx2:
      return "avx2";
  }
  return "?";
}

bool isa_available(Isa isa) { return cpu_has(isa); }

Isa isa() { return current().load(std::memory_order_relaxed); }

void set_isa(Isa isa) {
  LLMK_CHECK(isa_available(isa), "set_isa: this CPU (or this build) lacks {}", isa_name(isa));
  current().store(isa, std::memory_order_relaxed);
}

void set_int8_activations(bool on) { g_int8_activations.store(on, std::memory_order_relaxed); }
bool int8_activations() { return g_int8_activations.load(std::memory_order_relaxed); }

// The call f(args...) in the build isa() names.
#ifdef LLMK_CPU_ISA_X86
#define LLMK_CPU_DISPATCH(f, ...)      \
  switch (isa()) {                     \
    case Isa::Avx2:                    \
      return isa_avx2::f(__VA_ARGS__); \
    case Isa::Base:                    \
      break;                           \
  }                                    \
  return isa_base::f(__VA_ARGS__)
#else
#define LLMK_CPU_DISPATCH(f, ...) return isa_base::f(__VA_ARGS__)
#endif

void gated_act(float* out, int64_t out_ld, const float* gate, int64_t gate_ld, const float* up,
               int64_t up_ld, int64_t rows, int64_t F, Activation act) {
  LLMK_CPU_DISPATCH(gated_act, out, out_ld, gate, gate_ld, up, up_ld, rows, F, act);
}
void attention(const AttentionArgs& a) { LLMK_CPU_DISPATCH(attention, a); }
bool can_dequantize(DType t) { return isa_base::can_dequantize(t); }
void dequantize_row(DType t, const void* src, float* dst, int64_t n) {
  LLMK_CPU_DISPATCH(dequantize_row, t, src, dst, n);
}
void dequantize_row_scalar(DType t, const void* src, float* dst, int64_t n) {
  isa_base::dequantize_row_scalar(t, src, dst, n);
}
bool linear_int8_supports(DType wtype) { LLMK_CPU_DISPATCH(linear_int8_supports, wtype); }
bool linear_supports(DType wtype) { return isa_base::linear_supports(wtype); }
LinearPath linear_choose_path(const LinearArgs& a) { LLMK_CPU_DISPATCH(linear_choose_path, a); }
void linear(const LinearArgs& a, LinearPath path) { LLMK_CPU_DISPATCH(linear, a, path); }
void rms_norm(float* out, int64_t out_ld, const float* x, int64_t x_ld, int64_t rows, int64_t D,
              const float* w, float eps, bool add_one) {
  LLMK_CPU_DISPATCH(rms_norm, out, out_ld, x, x_ld, rows, D, w, eps, add_one);
}
void softmax(float* out, int64_t out_ld, const float* x, int64_t x_ld, int64_t rows, int64_t N) {
  LLMK_CPU_DISPATCH(softmax, out, out_ld, x, x_ld, rows, N);
}

}  // namespace llmk::cpu
