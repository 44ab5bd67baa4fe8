// ops::linear over block-quantised weights on CUDA (kernels/cuda/gemm/qlinear.h), against the CPU.
//
// Weights are random GGUF blocks of each kept type (random bytes, with the f16 scale fields set
// to finite values that give outputs of order one), repacked into the GPU layout
// (kernels/quant_layout.h) and copied to the device.
//
// Two checks, so that each tolerance is the one its step allows:
//   - the GPU's weights (cuda::qdequant) against the CPU's dequantisation of the same blocks
//     (ops::dequantize, exact in f32): the GPU forms scale * value + offset in fp32 and rounds
//     once to bf16, so |gpu - cpu| <= 2^-8 |cpu|, plus a few fp32 roundings of the offset (where
//     scale * value and the offset cancel): 2^-12 max |row| leaves them a wide margin; a weight
//     read from the wrong place, or one whose scale was rounded to bf16 first, is off by more;
//   - the product against the CPU's linear over the weights the path multiplies, with the bf16
//     x: qgemv (up to 16 rows) the file's weights (its A fragments hold the integer values
//     exactly, the scales applied in fp32: the CPU's f32 dequantisation), the bands above it
//     qdequant's bf16 weights through cuBLASLt or qgemm (which decodes them the same way into
//     shared memory); the linear tests' tolerances
//     (tests/gpu/linear_test.cpp), since only the accumulation and the output rounding differ.
#include "kernels/cuda/gemm/qlinear.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/cuda/device.h"
#include "core/cuda/stream.h"
#include "core/half.h"
#include "core/tensor.h"
#include "kernels/cuda/gemm/linear.h"
#include "kernels/quant_layout.h"
#include "ops/ops.h"
#include "ops_gpu_util.h"

namespace llmk {
namespace {

using gpu_test::compare;
using gpu_test::expect_within;
using gpu_test::poisoned_cuda;
using gpu_test::to_f32;
using gpu_test::Tolerance;

constexpr DType kTypes[] = {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1,
                            DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K};

// Random blocks of type t for an [N, K] matrix on the host (GGUF layout): the f16 fields
// (offset, magnitude before the 1 / sqrt(K) that keeps outputs of order one) set to finite
// values of random sign, every other byte random.
Tensor random_blocks(DType t, int64_t N, int64_t K, uint32_t seed) {
  struct Field {
    int offset;
    float size;
  };
  std::vector<Field> fields;
  switch (t) {
    case DType::Q4_0:
      fields = {{0, 0.25f}};
      break;
    case DType::Q4_1:
      fields = {{0, 0.25f}, {2, 2.0f}};
      break;
    case DType::Q5_0:
      fields = {{0, 0.12f}};
      break;
    case DType::Q5_1:
      fields = {{0, 0.12f}, {2, 2.0f}};
      break;
    case DType::Q8_0:
      fields = {{0, 0.01f}};
      break;
    case DType::Q4_K:
      fields = {{0, 0.005f}, {2, 0.005f}};
      break;
    case DType::Q5_K:
      fields = {{0, 0.0025f}, {2, 0.005f}};
      break;
    case DType::Q6_K:
      fields = {{208, 0.0003f}};
      break;
    default:
      ADD_FAILURE() << "no fields for " << dtype_name(t);
  }
  Tensor w = Tensor::empty({N, K}, t);
  std::mt19937 rng(seed);
  auto* b = static_cast<uint8_t*>(w.data());
  for (int64_t i = 0; i < w.nbytes(); ++i) b[i] = static_cast<uint8_t>(rng());
  std::uniform_real_distribution<float> mag(0.5f, 1.5f);
  const int64_t bb = dtype_info(t).block_bytes, blocks = w.nbytes() / bb;
  const float k = 1.0f / std::sqrt(static_cast<float>(K));
  for (int64_t i = 0; i < blocks; ++i) {
    for (const Field& f : fields) {
      const float v = f.size * k * mag(rng) * (rng() % 2 ? 1.0f : -1.0f);
      const uint16_t h = float_to_fp16(v);
      std::memcpy(b + i * bb + f.offset, &h, 2);
    }
  }
  return w;
}

// The host blocks on the device, in the GPU layout.
Tensor to_gpu_layout(const Tensor& host) {
  Tensor packed = Tensor::empty(host.shape(), host.dtype());
  qlayout::repack(host.dtype(), host.data(), packed.data(), host.dim(0), host.dim(1));
  return packed.to(Device::CUDA);
}

// The GPU's weights (qdequant, bf16) as f32 on the host.
Tensor gpu_weights(const Tensor& w) {
  Tensor band = Tensor::empty(w.shape(), DType::BF16, Device::CUDA);
  cuda::qdequant(band.data(), DType::BF16, w.dim(1), w.data(), w.dtype(), w.dim(0), w.dim(1), 0,
                 w.dim(0));
  return to_f32(band.to(Device::CPU));
}

class QLinear : public ::testing::Test {
 protected:
  void SetUp() override { cuda::init(); }
};

TEST_F(QLinear, GpuWeightsAreTheFilesWithinBf16Rounding) {
  uint32_t seed = 1;
  for (DType t : kTypes) {
    const int64_t K = block_size(t) == 256 ? 768 : 160, N = 37;
    const Tensor host = random_blocks(t, N, K, seed++);
    Tensor ref = Tensor::empty({N, K}, DType::F32);
    ops::dequantize(ref, host);
    const Tensor got = gpu_weights(to_gpu_layout(host));
    int64_t bad = 0;
    double worst = 0;
    for (int64_t n = 0; n < N; ++n) {
      const float* r = ref.data<const float>() + n * K;
      const float* g = got.data<const float>() + n * K;
      float row = 0;
      for (int64_t k = 0; k < K; ++k) row = std::max(row, std::fabs(r[k]));
      for (int64_t k = 0; k < K; ++k) {
        const double err = std::fabs(static_cast<double>(g[k]) - r[k]);
        const double bound = 0x1p-8 * std::fabs(r[k]) + 0x1p-12 * row;
        worst = std::max(worst, err / bound);
        if (!(err <= bound) && bad++ < 3) {
          ADD_FAILURE() << dtype_name(t) << " row " << n << " col " << k << ": gpu " << g[k]
                        << " file " << r[k] << " (row max " << row << ")";
        }
      }
    }
    EXPECT_EQ(bad, 0) << dtype_name(t);
    std::printf("  %-5s worst error / bound %.3f\n", std::string(dtype_name(t)).c_str(), worst);
  }
}

// The linear tests' bounds (linear_test.cpp): bf16 out, f32 out.
Tolerance tolerance_for(DType out) {
  return out == DType::BF16 ? Tolerance{5e-3, 4.0 / 256} : Tolerance{2e-4, 2e-3};
}

void check_problem(DType t, int64_t M, int64_t N, int64_t K, uint32_t seed, bool accumulate) {
  const Tensor host = random_blocks(t, N, K, seed);
  const Tensor w = to_gpu_layout(host);
  Tensor w32 = Tensor::empty({N, K}, DType::F32);
  if (M <= cuda::kQGemvMaxRows) {
    ops::dequantize(w32, host);  // qgemv: the file's weights
  } else {
    w32 = gpu_weights(w);  // bands: qdequant's bf16 weights
  }
  const Tensor x_host = gpu_test::random_host({M, K}, DType::BF16, seed + 1);
  const Tensor x32 = to_f32(x_host), x = x_host.to(Device::CUDA);
  const Tensor b_host = gpu_test::random_host({N}, DType::BF16, seed + 2, -0.5f, 0.5f);
  const Tensor b32 = to_f32(b_host), b = b_host.to(Device::CUDA);
  const Tensor start_host = gpu_test::random_host({M, N}, DType::BF16, seed + 3);
  for (const bool bias : {false, true}) {
    for (const DType out_dtype : {DType::BF16, DType::F32}) {
      Tensor ref = Tensor::empty({M, N}, DType::F32);
      Tensor out = poisoned_cuda({M, N}, out_dtype);
      if (accumulate) {
        ops::copy(ref, to_f32(start_host));
        Tensor start = Tensor::empty({M, N}, out_dtype);
        ops::copy(start, ref);
        out = start.to(Device::CUDA);
        ops::linear_add(ref, x32, w32, bias ? &b32 : nullptr);
        ops::linear_add(out, x, w, bias ? &b : nullptr);
      } else {
        ops::linear(ref, x32, w32, bias ? &b32 : nullptr);
        ops::linear(out, x, w, bias ? &b : nullptr);
      }
      const std::string what =
          fmt::format("{} M={} N={} K={} bias {} out {}{}", dtype_name(t), M, N, K, bias,
                      dtype_name(out_dtype), accumulate ? " (accumulate)" : "");
      expect_within(compare(to_f32(out.to(Device::CPU)), ref), tolerance_for(out_dtype), what);
    }
  }
}

TEST_F(QLinear, MatchesTheCpuOverTypesRowsAndShapes) {
  uint32_t seed = 100;
  for (DType t : kTypes) {
    const bool k_quant = block_size(t) == 256;
    // K: a chunk count per row that leaves the last group of four part-full (160 and 288 for the
    // blocks of 32: 5 and 9 chunks of Q4_*, 10 and 18 of Q8_0), groups left over after the
    // 8 warps' turns (2560 and 2080: 20 and 17 groups of four), and Llama-3-8B's.
    const int64_t ks[] = {k_quant ? 256 : 160, k_quant ? 768 : 288, k_quant ? 2560 : 2080, 4096};
    for (int64_t K : ks) {
      for (int64_t M : {1, 3, 8, 9, 16, 17}) {
        for (int64_t N : {7, 130}) {
          const cuda::LinearStats before = cuda::linear_stats();
          check_problem(t, M, N, K, seed, false);
          seed += 4;
          const cuda::LinearStats after = cuda::linear_stats();
          if (M <= cuda::kQGemvMaxRows) {
            EXPECT_GT(after.qgemv, before.qgemv) << dtype_name(t) << " M=" << M;
          } else {
            EXPECT_GT(after.qgemm + after.qbands, before.qgemm + before.qbands)
                << dtype_name(t) << " M=" << M;
          }
        }
      }
    }
  }
}

// One token over wide matrices (N past 8,192, the last 16-row block part-full): K with part-full
// windows, Llama's 4,096, and 8,448, past the 8,192 up to which qgemv1 keeps three windows of Q8_0
// in flight (four above).
TEST_F(QLinear, OneTokenWideMatricesMatchTheCpu) {
  uint32_t seed = 700;
  for (DType t : kTypes) {
    const bool k_quant = block_size(t) == 256;
    for (int64_t K : {k_quant ? int64_t{768} : int64_t{160}, int64_t{4096}, int64_t{8448}}) {
      check_problem(t, 1, 8192 + 23, K, seed, false);
      check_problem(t, 1, 8192 + 23, K, seed + 4, true);
      seed += 8;
    }
  }
}

// qgemm (more than 16 rows on sm_90): rows of x past a 128-row tile and past a cluster's 256
// columns, K steps of 64 weights with the last one part-full (K 160 and 288: 5 and 9 chunks of
// the 4- and 5-bit types), bias and accumulate. Tuning off, so that qgemm runs wherever it
// applies (tuned, a bucket may choose the bands); elsewhere the same problems run as bands.
TEST_F(QLinear, QGemmMatchesTheCpu) {
  const bool hopper = cuda::device_info().compute_capability() == 90;
  cuda::set_linear_tuning(false);
  struct Restore {
    ~Restore() { cuda::set_linear_tuning(true); }
  } restore;
  uint32_t seed = 500;
  for (DType t : kTypes) {
    const bool k_quant = block_size(t) == 256;
    const int64_t ks[] = {k_quant ? 256 : 160, k_quant ? 768 : 288, 4096};
    for (int64_t K : ks) {
      for (int64_t M : {17, 130, 300}) {
        for (int64_t N : {8, 264}) {
          const cuda::LinearStats before = cuda::linear_stats();
          check_problem(t, M, N, K, seed, M == 130);
          seed += 4;
          // Taken where bf16 out (with and without bias), for the types it is built for; Q5_1 and
          // Q5_K take the bands.
          const bool built = t != DType::Q5_1 && t != DType::Q5_K;
          EXPECT_EQ(cuda::linear_stats().qgemm - before.qgemm, hopper && built ? 2u : 0u)
              << dtype_name(t) << " M=" << M << " N=" << N << " K=" << K;
        }
      }
    }
  }
}

// Tuned (the default): each bucket's first call times qgemm against the bands (an accumulating
// call on a scratch matrix) and runs the faster; the result is right either way.
TEST_F(QLinear, TunedChoiceMatchesTheCpu) {
  uint32_t seed = 700;
  for (DType t : {DType::Q4_K, DType::Q8_0}) {
    for (const bool accumulate : {false, true}) {
      const cuda::LinearStats before = cuda::linear_stats();
      check_problem(t, 200, 264, 4096, seed, accumulate);
      seed += 4;
      const cuda::LinearStats after = cuda::linear_stats();
      EXPECT_GE(after.qgemm + after.qbands - before.qgemm - before.qbands, 4u)
          << dtype_name(t) << (accumulate ? " accumulate" : "");
    }
  }
}

TEST_F(QLinear, AddAccumulatesIntoOut) {
  uint32_t seed = 900;
  for (DType t : {DType::Q4_K, DType::Q8_0}) {
    for (int64_t M : {1, 12, 20}) {
      check_problem(t, M, 33, 512, seed, true);
      seed += 4;
    }
  }
}

// Many bands: N past the band's rows (kQLinearBandBytes / (2 K)) at 17 rows.
TEST_F(QLinear, BandsCoverEveryRowOfALargeMatrix) {
  const int64_t K = 14336, N = cuda::kQLinearBandBytes / (2 * K) * 2 + 5;
  const cuda::LinearStats before = cuda::linear_stats();
  check_problem(DType::Q4_K, 17, N, K, 7, false);
  EXPECT_GE(cuda::linear_stats().qbands - before.qbands, 3u * 4);  // 3 bands, 4 calls
}

// Token embeddings from a quantised table: each row as qdequant gives it (the same decode), bit
// for bit; ids outside the vocabulary give zeros.
TEST_F(QLinear, EmbeddingRowsAreTheDequantisedRows) {
  uint32_t seed = 40;
  for (DType t : kTypes) {
    const int64_t K = block_size(t) == 256 ? 512 : 96, V = 37;
    const Tensor w = to_gpu_layout(random_blocks(t, V, K, seed++));
    const Tensor all = gpu_weights(w);
    const std::vector<int32_t> ids = {0, 5, 36, -1, 37, 5, 17};
    const auto T = static_cast<int64_t>(ids.size());
    const Tensor ids_dev = gpu_test::i32_host(ids).to(Device::CUDA);
    Tensor out = poisoned_cuda({T, K}, DType::BF16);
    ops::embedding(out, w, ids_dev);
    const Tensor got = to_f32(out.to(Device::CPU));
    for (int64_t i = 0; i < T; ++i) {
      const int32_t id = ids[static_cast<size_t>(i)];
      for (int64_t k = 0; k < K; ++k) {
        const float want = id >= 0 && id < V ? all.data<const float>()[id * K + k] : 0.0f;
        ASSERT_EQ(got.data<const float>()[i * K + k], want)
            << dtype_name(t) << " token " << i << " (id " << id << ") column " << k;
      }
    }
  }
}

// The one-token epilogues over quantised weights (ops::linear_gated, ops::linear_rope_kv_append:
// qgemv with act(g) * u, or RoPE and the KV append, in its epilogue) against the same ops
// composed on the GPU: qgemv's plain product into a buffer, then gated_act or rope_kv_append.
// Each row's sum is the same (the same warps fold the same groups in the same order; the fused
// launch only pairs the rows differently), so the outputs and cache rows must match bit for bit.
// Shapes: units that leave the last block part-full, K with groups of four chunks part-full, both
// RoPE pairings, a bias; one launch for the fused op (qgemv counted once), none into scratch.
TEST_F(QLinear, OneTokenEpiloguesMatchTheComposedOps) {
  uint32_t seed = 900;
  for (DType t : kTypes) {
    const int64_t K = qlayout::layout(t).block_elems == 256 ? 768 : 160;
    const std::string type(dtype_name(t));
    // F 4,100: a stacked gate|up past 8,192 rows (qgemv1 for every type).
    for (int64_t F : {int64_t{3}, int64_t{130}, int64_t{4100}}) {
      for (ops::Activation act : {ops::Activation::SiLU, ops::Activation::GeluTanh}) {
        for (bool with_bias : {false, true}) {
          const std::string what = type + " linear_gated F=" + std::to_string(F) +
                                   (act == ops::Activation::SiLU ? " silu" : " gelu_tanh") +
                                   (with_bias ? " bias" : "");
          const Tensor w = to_gpu_layout(random_blocks(t, 2 * F, K, seed++));
          const Tensor x = gpu_test::random_host({1, K}, DType::BF16, seed++).to(Device::CUDA);
          const Tensor b =
              gpu_test::random_host({2 * F}, DType::BF16, seed++, -0.5f, 0.5f).to(Device::CUDA);
          Tensor scratch = poisoned_cuda({1, 2 * F}, DType::BF16);
          Tensor out = poisoned_cuda({1, F}, DType::BF16);
          const uint64_t before = cuda::linear_stats().qgemv;
          ops::linear_gated(out, x, w, act, scratch, with_bias ? &b : nullptr);
          EXPECT_EQ(cuda::linear_stats().qgemv, before + 1) << what;
          EXPECT_EQ(gpu_test::unpoisoned(scratch.to(Device::CPU)), 0) << what;
          Tensor lin = Tensor::empty({1, 2 * F}, DType::BF16, Device::CUDA);
          ops::linear(lin, x, w, with_bias ? &b : nullptr);
          Tensor ref = Tensor::empty({1, F}, DType::BF16, Device::CUDA);
          ops::gated_act(ref, lin.slice(1, 0, F), lin.slice(1, F, 2 * F), act);
          EXPECT_EQ(compare(out.to(Device::CPU), ref.to(Device::CPU)).max_abs, 0.0) << what;
        }
      }
    }
    struct Case {
      int64_t Hq, Hkv, D;
      ops::RopeLayout layout;
      bool bias;
    };
    const Case cases[] = {{4, 2, 64, ops::RopeLayout::HalfSplit, true},
                          {3, 1, 128, ops::RopeLayout::Adjacent, false},
                          {2, 1, 96, ops::RopeLayout::HalfSplit, false}};
    for (const Case& c : cases) {
      const int64_t N = (c.Hq + 2 * c.Hkv) * c.D, cache_len = 5, row = 3;
      const std::string what = type + " linear_rope_kv_append Hq=" + std::to_string(c.Hq) +
                               " Hkv=" + std::to_string(c.Hkv) + " D=" + std::to_string(c.D);
      const Tensor w = to_gpu_layout(random_blocks(t, N, K, seed++));
      const Tensor x = gpu_test::random_host({1, K}, DType::BF16, seed++).to(Device::CUDA);
      const Tensor b =
          gpu_test::random_host({N}, DType::BF16, seed++, -0.5f, 0.5f).to(Device::CUDA);
      const Tensor cache_host =
          gpu_test::random_host({2, cache_len, c.Hkv, c.D}, DType::BF16, seed++);
      const Tensor pos = gpu_test::i32_host({1234}).to(Device::CUDA);
      const Tensor rows = gpu_test::i32_host({static_cast<int32_t>(row)}).to(Device::CUDA);
      ops::RopeParams p;
      p.theta = 10000.0f;
      p.layout = c.layout;
      Tensor cache = cache_host.to(Device::CUDA), cache_ref = cache_host.to(Device::CUDA);
      Tensor kc = cache.select(0, 0), vc = cache.select(0, 1);
      Tensor kc_ref = cache_ref.select(0, 0), vc_ref = cache_ref.select(0, 1);
      Tensor qkv = poisoned_cuda({1, N}, DType::BF16);
      const uint64_t before = cuda::linear_stats().qgemv;
      ops::linear_rope_kv_append(qkv, x, w, c.bias ? &b : nullptr, c.Hq, pos, p, kc, vc, rows);
      EXPECT_EQ(cuda::linear_stats().qgemv, before + 1) << what;
      Tensor ref = Tensor::empty({1, N}, DType::BF16, Device::CUDA);
      ops::linear(ref, x, w, c.bias ? &b : nullptr);
      Tensor qk = ref.slice(1, 0, (c.Hq + c.Hkv) * c.D).unflatten(1, {c.Hq + c.Hkv, c.D});
      ops::rope_kv_append(qk, pos, p, kc_ref, vc_ref,
                          ref.slice(1, (c.Hq + c.Hkv) * c.D, N).unflatten(1, {c.Hkv, c.D}), rows);
      EXPECT_EQ(compare(qkv.to(Device::CPU), ref.to(Device::CPU)).max_abs, 0.0) << what;
      EXPECT_EQ(compare(cache.to(Device::CPU), cache_ref.to(Device::CPU)).max_abs, 0.0)
          << what << " (cache)";
    }
  }
}

TEST_F(QLinear, ArgumentErrors) {
  const Tensor w = to_gpu_layout(random_blocks(DType::Q4_0, 8, 64, 3));
  const Tensor x16 = Tensor::empty({1, 64}, DType::F16, Device::CUDA);
  Tensor out = Tensor::empty({1, 8}, DType::BF16, Device::CUDA);
  EXPECT_THROW(ops::linear(out, x16, w), Error);
  const Tensor x = Tensor::empty({1, 64}, DType::BF16, Device::CUDA);
  Tensor out16 = Tensor::empty({1, 8}, DType::F16, Device::CUDA);
  EXPECT_THROW(ops::linear(out16, x, w), Error);
  const Tensor q3k = Tensor::empty({8, 256}, DType::Q3_K, Device::CUDA);  // not kept
  const Tensor x256 = Tensor::empty({1, 256}, DType::BF16, Device::CUDA);
  EXPECT_THROW(ops::linear(out, x256, q3k), Error);
}

}  // namespace
}  // namespace llmk
