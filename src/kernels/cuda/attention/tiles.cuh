// Device pieces shared by the attention kernels: asynchronous 16-byte tile copies into shared
// memory (cp.async) and the warp-level bf16 tensor-core instructions (ldmatrix, mma.sync
// m16n8k16) as inline PTX; the Hopper kernels' barriers and copy engine come from hopper.cuh.
// Included by the attention .cu files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/hopper.cuh"

namespace llmk::cuda::attn {

using bf16 = __nv_bfloat16;

constexpr float kLog2e = 1.4426950408889634f;

// 16 bytes global -> shared (`dst` a shared-space byte address), asynchronously, of which the
// first n (0..16) are read and the rest zero-filled (n 0: nothing is read, but src must still be
// a valid address).
__device__ __forceinline__ void cp_async_16_n(uint32_t dst, const void* src, int n) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}
// All 16 bytes, or (!valid) zeros.
__device__ __forceinline__ void cp_async_16_at(uint32_t dst, const void* src, bool valid) {
  cp_async_16_n(dst, src, valid ? 16 : 0);
}
// cp_async_16_at from a generic pointer to shared memory, with an L2 cache policy.
__device__ __forceinline__ void cp_async_16_policy(void* dst, const void* src, bool valid,
                                                   uint64_t policy) {
  asm volatile(
      "cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(smem_addr(dst)),
      "l"(src), "r"(valid ? 16 : 0), "l"(policy));
}
// 4 bytes global -> shared, as cp_async_16_n (through L1; 4-byte aligned addresses).
__device__ __forceinline__ void cp_async_4_n(uint32_t dst, const void* src, int n) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_async_4_at(uint32_t dst, const void* src, bool valid) {
  cp_async_4_n(dst, src, valid ? 4 : 0);
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most `pending` of this thread's committed groups are still in flight.
template <int pending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(pending));
}

// Four 8x8 b16 matrices at a shared-space byte address (in unrolled loops a per-thread base plus
// a compile-time offset, which ptxas folds into the instruction); lane l supplies the address of
// row (l % 8) of matrix l / 8. Thread t receives elements (t / 4, 2 (t % 4) + {0, 1}) of each
// matrix (.trans: the transpose).
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
// The same with generic pointers to shared memory (of any 16-bit elements).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  ldsm_x4(r, smem_addr(p));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  ldsm_x4_t(r, smem_addr(p));
}

// c (16x8 f32) += a (16x16 bf16, row-major) * b (16x8 bf16, column-major).
// Fragments (t = lane): a: {(t/4, 2(t%4)), (t/4+8, 2(t%4)), (t/4, 2(t%4)+8), (t/4+8, 2(t%4)+8)},
// each two consecutive columns; b: {(k = 2(t%4), n = t/4), (k + 8, n)}, two consecutive k;
// c: {(t/4, 2(t%4) + {0,1}), (t/4 + 8, 2(t%4) + {0,1})}.
__device__ __forceinline__ void mma_bf16_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The same for fp16 operands.
__device__ __forceinline__ void mma_f16_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                              uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The 16-bit element types the tensor-core kernels take (bf16, fp16): the matching mma and the
// packing of two fp32 values into one operand register.
template <class T>
struct MmaElem;
template <>
struct MmaElem<__nv_bfloat16> {
  static __device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    mma_bf16_16816(c, a, b0, b1);
  }
  static __device__ __forceinline__ uint32_t pack(float x, float y) { return pack_bf16x2(x, y); }
};
template <>
struct MmaElem<__half> {
  static __device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    mma_f16_16816(c, a, b0, b1);
  }
  static __device__ __forceinline__ uint32_t pack(float x, float y) { return pack_f16x2(x, y); }
};

// The logit of a raw dot product q.k in the log2 domain (so softmax can use exp2).
__device__ __forceinline__ float logit_log2(float dot, float scale, float softcap) {
  float s = dot * scale;
  if (softcap > 0.0f) s = softcap * tanhf(s / softcap);
  return s * kLog2e;
}

}  // namespace llmk::cuda::attn
