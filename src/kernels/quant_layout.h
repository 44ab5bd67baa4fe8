// Block-quantised weights on the GPU: the layout the CUDA kernels read (kernels/cuda/gemm/
// qlinear.cu), and its conversion from GGUF rows on the host.
//
// A GGUF block mixes its scales with its quantised values (Q4_K: d, dmin, 12 bytes of packed
// scales, then 128 bytes of nibbles; Q8_0: a 2-byte scale, then 32 bytes: 34-byte blocks, so no
// block after the first is 16-byte aligned). On the GPU an [N, K] matrix keeps the same bytes in
// two regions: first every block's quantised values (the "q" bytes, row after row: row n's are
// nb * q_bytes bytes at n * nb * q_bytes, nb = K / block_elems), then every block's remaining
// bytes (its "meta": scales, minimums, high bits), in the block's order, row after row. The q
// bytes of each type are a multiple of 16 per block, so every row's values start 16-byte aligned
// and a kernel streams them with 16-byte loads; the meta is small and read beside them. Inside
// each 4-byte word of the values, bytes 1 and 2 trade places (b0 b2 b1 b3), so that a kernel
// finds bytes 0 and 1 of the file's word at bits 0-7 and 16-23, and bytes 2 and 3 eight bits
// higher: the two halves of a bf16 pair, one mask apart (kernels/cuda/gemm/qlinear.cu). The size
// is the GGUF size (bytes_for), so a Tensor of the block dtype holds either layout: on the CPU
// the file's, on CUDA this one.
//
// Types kept this way: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (blocks of 32) and Q4_K, Q5_K, Q6_K
// (super-blocks of 256), the types of Q4_0 / Q4_1 / Q5_1 / Q8_0 files and of llama.cpp's Q4_K_M
// and Q5_K_M mixes. Others are dequantised at load.
//
// Q5_K's fifth bits are regrouped: the file's qh[32] gives byte l's weights of the super-block's
// four 64-weight groups (bits 2g, 2g + 1: group g's low and high nibble of qs byte 32 g + l);
// on the GPU its 32 bytes are two 16-byte vectors, one a 128-weight half n, and byte l' of half
// n's holds in its low nibble bits 4n .. 4n + 3 of qh[l'] and in its high one those of
// qh[16 + l']: the bits of the nibbles of qs bytes l' (and 16 + l') of groups 2n and 2n + 1. A
// chunk of half n (16 bytes of qs) thus finds its fifth bits in the same word of the vector as
// its nibbles in its own, whichever half it lies in. They come first, then qs (160 bytes).
//
// Q5_0's and Q5_1's qh (bit k: weight k's fifth bit) is permuted in the meta: weight k's bit goes
// to q5_qh_bit(k) = 4 t + 2 h + hi + 16 e for k = 16 hi + 4 t + 2 h + e, so that the lane that
// reads word t of the values finds the pair (h, hi) of its weights at bits 4 t + 2 h + hi and 16
// more: one shift a chunk and constant shifts after it.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/dtype.h"

namespace llmk::qlayout {

struct Layout {
  int block_elems = 0;  // elements per block (0: not kept quantised on the GPU)
  int block_bytes = 0;  // the GGUF block
  int q_off = 0;        // where its quantised values start in the block
  int q_bytes = 0;      // and their length; the rest is meta
  int meta_bytes() const { return block_bytes - q_bytes; }
};

inline Layout layout(DType t) {
  switch (t) {
    case DType::Q4_0:  // f16 d; u8 qs[16]
      return {32, 18, 2, 16};
    case DType::Q4_1:  // f16 d, m; u8 qs[16]
      return {32, 20, 4, 16};
    case DType::Q5_0:  // f16 d; u8 qh[4]; u8 qs[16]
      return {32, 22, 6, 16};
    case DType::Q5_1:  // f16 d, m; u8 qh[4]; u8 qs[16]
      return {32, 24, 8, 16};
    case DType::Q8_0:  // f16 d; i8 qs[32]
      return {32, 34, 2, 32};
    case DType::Q4_K:  // f16 d, dmin; u8 scales[12]; u8 qs[128]
      return {256, 144, 16, 128};
    case DType::Q5_K:  // f16 d, dmin; u8 scales[12]; u8 qh[32], qs[128] (values: both)
      return {256, 176, 16, 160};
    case DType::Q6_K:  // u8 ql[128], qh[64]; i8 scales[16]; f16 d
      return {256, 210, 0, 192};
    default:
      return {};
  }
}

// Where an [N, K] matrix of type t keeps its rows in this layout: row n's values at
// q + n * qrow, its meta at meta + n * mrow (the meta region follows all the values).
struct Regions {
  const uint8_t* q;
  const uint8_t* meta;
  int64_t qrow, mrow;
};
inline Regions regions(DType t, const void* w, int64_t N, int64_t K) {
  const Layout l = layout(t);
  const int64_t nb = K / l.block_elems;
  const auto* q = static_cast<const uint8_t*>(w);
  return {q, q + N * nb * l.q_bytes, nb * l.q_bytes, nb * l.meta_bytes()};
}

// Whether the GPU keeps matrices of this type quantised.
inline bool gpu_keeps(DType t) { return layout(t).block_elems > 0; }

// Bytes 1 and 2 of each 4-byte word of n bytes (n a multiple of 4) trade places; its own inverse.
inline void swap_middle_bytes(uint8_t* p, int n) {
  for (int i = 0; i < n; i += 4) {
    const uint8_t b = p[i + 1];
    p[i + 1] = p[i + 2];
    p[i + 2] = b;
  }
}

// Q5_0's and Q5_1's fifth bits (see above): where weight k's goes, and the word permuted either
// way.
inline int q5_qh_bit(int k) {
  return 4 * ((k % 16) / 4) + 2 * ((k % 4) / 2) + k / 16 + 16 * (k % 2);
}
inline uint32_t q5_permute_qh(uint32_t qh, bool inverse) {
  // Each byte's bits land in fixed places: a table a byte position and direction (8 KiB, made
  // once), four lookups a block (a model's Q5_0 layers hold hundreds of millions of blocks).
  struct Tables {
    uint32_t t[2][4][256];
    Tables() {
      for (int dir = 0; dir < 2; ++dir)
        for (int byte = 0; byte < 4; ++byte)
          for (int v = 0; v < 256; ++v) {
            uint32_t out = 0;
            for (int b = 0; b < 8; ++b) {
              const int k = 8 * byte + b;
              int to = q5_qh_bit(k);
              if (dir == 1) {  // inverse: bit k of the input is permuted bit k, weight from(k)
                to = 0;
                while (q5_qh_bit(to) != k) ++to;
              }
              out |= static_cast<uint32_t>((v >> b) & 1) << to;
            }
            t[dir][byte][v] = out;
          }
    }
  };
  static const Tables tables;
  const auto& t = tables.t[inverse ? 1 : 0];
  return t[0][qh & 0xFF] | t[1][(qh >> 8) & 0xFF] | t[2][(qh >> 16) & 0xFF] | t[3][qh >> 24];
}
// The 4-byte qh at p (little-endian), permuted in place.
inline void q5_permute_qh_at(uint8_t* p, bool inverse) {
  uint32_t qh = 0;
  std::memcpy(&qh, p, 4);
  qh = q5_permute_qh(qh, inverse);
  std::memcpy(p, &qh, 4);
}

// Q5_K's qh[32] <-> the two half vectors (see above); each the other's inverse.
inline void q5k_regroup_qh(const uint8_t* qh, uint8_t* out) {
  for (int n = 0; n < 2; ++n) {
    for (int l = 0; l < 16; ++l) {
      out[16 * n + l] = static_cast<uint8_t>(((qh[l] >> (4 * n)) & 0x0F) |
                                             (((qh[16 + l] >> (4 * n)) & 0x0F) << 4));
    }
  }
}
inline void q5k_ungroup_qh(const uint8_t* in, uint8_t* qh) {
  for (int l = 0; l < 16; ++l) {
    qh[l] = static_cast<uint8_t>((in[l] & 0x0F) | ((in[16 + l] & 0x0F) << 4));
    qh[16 + l] = static_cast<uint8_t>((in[l] >> 4) | (in[16 + l] & 0xF0));
  }
}

// GGUF rows (n_rows rows of k elements, whole blocks, back to back) -> the GPU layout (same size).
inline void repack(DType t, const void* gguf, void* gpu, int64_t n_rows, int64_t k) {
  const Layout l = layout(t);
  const int64_t blocks = n_rows * (k / l.block_elems);
  const auto* src = static_cast<const uint8_t*>(gguf);
  auto* q = static_cast<uint8_t*>(gpu);
  uint8_t* meta = q + blocks * l.q_bytes;
  const int tail = l.block_bytes - l.q_off - l.q_bytes;
  for (int64_t b = 0; b < blocks; ++b, src += l.block_bytes) {
    std::memcpy(q + b * l.q_bytes, src + l.q_off, static_cast<size_t>(l.q_bytes));
    if (t == DType::Q5_K) q5k_regroup_qh(src + l.q_off, q + b * l.q_bytes);
    swap_middle_bytes(q + b * l.q_bytes, l.q_bytes);
    uint8_t* m = meta + b * l.meta_bytes();
    std::memcpy(m, src, static_cast<size_t>(l.q_off));
    std::memcpy(m + l.q_off, src + l.q_off + l.q_bytes, static_cast<size_t>(tail));
    if (t == DType::Q5_0 || t == DType::Q5_1) q5_permute_qh_at(m + l.q_off - 4, false);
  }
}

// The inverse of repack (GPU layout -> GGUF rows).
inline void unpack(DType t, const void* gpu, void* gguf, int64_t n_rows, int64_t k) {
  const Layout l = layout(t);
  const int64_t blocks = n_rows * (k / l.block_elems);
  const auto* q = static_cast<const uint8_t*>(gpu);
  const uint8_t* meta = q + blocks * l.q_bytes;
  auto* dst = static_cast<uint8_t*>(gguf);
  const int tail = l.block_bytes - l.q_off - l.q_bytes;
  for (int64_t b = 0; b < blocks; ++b, dst += l.block_bytes) {
    const uint8_t* m = meta + b * l.meta_bytes();
    std::memcpy(dst + l.q_off, q + b * l.q_bytes, static_cast<size_t>(l.q_bytes));
    swap_middle_bytes(dst + l.q_off, l.q_bytes);
    if (t == DType::Q5_K) {
      uint8_t grouped[32];
      std::memcpy(grouped, dst + l.q_off, sizeof grouped);
      q5k_ungroup_qh(grouped, dst + l.q_off);
    }
    std::memcpy(dst, m, static_cast<size_t>(l.q_off));
    std::memcpy(dst + l.q_off + l.q_bytes, m + l.q_off, static_cast<size_t>(tail));
    if (t == DType::Q5_0 || t == DType::Q5_1) q5_permute_qh_at(dst + l.q_off - 4, true);
  }
}

}  // namespace llmk::qlayout
