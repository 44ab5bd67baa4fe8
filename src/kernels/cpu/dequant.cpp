#include "kernels/cpu/dequant.h"

#include <cstring>

#include "core/error.h"
#include "core/half.h"
#include "kernels/cpu/block_decode.h"
#include "kernels/cpu/isa.h"

// Built once per instruction set (isa.h): everything here is in its namespace.
namespace llmk::cpu::LLMK_CPU_ISA {

namespace {

using detail::Codec;
using detail::DecodedRun;
using detail::kGroup;

static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22 &&
              sizeof(BlockQ5_1) == 24 && sizeof(BlockQ8_0) == 34 && sizeof(BlockQ2_K) == 84 &&
              sizeof(BlockQ3_K) == 110 && sizeof(BlockQ4_K) == 144 && sizeof(BlockQ5_K) == 176 &&
              sizeof(BlockQ6_K) == 210);

// w = scale * q (+ min) for `n` decoded weights, rounding the product before the sum as ggml
// does, so results are bit-identical to it.
void expand_run(const DecodedRun& r, int n, bool has_min, float* dst) {
  int i = 0;
#if defined(__AVX2__)
  for (; i < n; i += kGroup) {
    const __m256 s = _mm256_set1_ps(r.scale[i / kGroup]);
    for (int h = 0; h < kGroup; h += 8) {
      const __m128i q8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(r.q + i + h));
      __m256 w = _mm256_mul_ps(s, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8)));
      if (has_min) {
        // The empty asm makes the product opaque, so the compiler cannot contract mul + add
        // into one FMA (which would round once and differ from ggml in the last bit).
        __asm__("" : "+x"(w));
        w = _mm256_add_ps(w, _mm256_set1_ps(r.min[i / kGroup]));
      }
      _mm256_storeu_ps(dst + i + h, w);
    }
  }
#endif
  for (; i < n; ++i) {
    float w = r.scale[i / kGroup] * static_cast<float>(r.q[i]);
    if (has_min) {
      volatile float product = w;  // rounded on its own, as above (fallback path only)
      w = product + r.min[i / kGroup];
    }
    dst[i] = w;
  }
}

template <class C, bool kScalar>
void dequantize_blocks(const uint8_t* src, float* dst, int64_t nblocks) {
  DecodedRun run;
  for (int64_t b = 0; b < nblocks; ++b) {
    const uint8_t* blk = src + b * static_cast<int64_t>(sizeof(typename C::Block));
    if constexpr (kScalar) {
      C::decode_scalar(blk, run.q, run.scale, run.min);
    } else {
      detail::decode_block<C>(blk, run.q, run.scale, run.min);
    }
    expand_run(run, C::kElems, C::kHasMin, dst + b * C::kElems);
  }
}

void f16_row(const uint16_t* src, float* dst, int64_t n, [[maybe_unused]] bool scalar) {
  int64_t i = 0;
#if defined(__AVX2__)
  if (!scalar) {
    for (; i + 8 <= n; i += 8) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
    }
  }
#endif
  for (; i < n; ++i) dst[i] = fp16_to_float(src[i]);
}

void bf16_row(const uint16_t* src, float* dst, int64_t n) {
  // Auto-vectorises: a bf16 is the top half of an f32.
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(src[i]);
}

template <bool kScalar>
void dequantize_impl(DType t, const void* src, float* dst, int64_t n) {
  LLMK_CHECK(n >= 0, "dequantize_row: negative count {}", n);
  const auto* bytes = static_cast<const uint8_t*>(src);
  switch (t) {
    case DType::F32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::F16:
      f16_row(static_cast<const uint16_t*>(src), dst, n, kScalar);
      return;
    case DType::BF16:
      bf16_row(static_cast<const uint16_t*>(src), dst, n);
      return;
    default:
      break;
  }
  const bool handled = detail::visit_codec(t, [&](auto codec) {
    using C = decltype(codec);
    LLMK_CHECK(n % C::kElems == 0, "dequantize_row: {} weights are not whole {} blocks of {}", n,
               dtype_name(t), C::kElems);
    dequantize_blocks<C, kScalar>(bytes, dst, n / C::kElems);
  });
  LLMK_CHECK(handled, "dequantize_row: dtype {} is not supported", dtype_name(t));
}

}  // namespace

bool can_dequantize(DType t) {
  switch (t) {
    case DType::F32:
    case DType::F16:
    case DType::BF16:
      return true;
    default:
      return detail::visit_codec(t, [](auto) {});
  }
}

void dequantize_row(DType t, const void* src, float* dst, int64_t n) {
  dequantize_impl<false>(t, src, dst, n);
}

void dequantize_row_scalar(DType t, const void* src, float* dst, int64_t n) {
  dequantize_impl<true>(t, src, dst, n);
}

}  // namespace llmk::cpu::LLMK_CPU_ISA
