// ops::rms_norm, ops::add_rms_norm and ops::rope on CUDA against the same ops on the CPU, fed
// the same bf16-rounded inputs (tolerances in ops_gpu_util.h: kBf16Out, rel L2 <= 4.5e-3 and
// max abs <= 2^-7 max |ref|, for bf16 outputs of fp32 math; RoPE's angle accuracy has its own
// sharper test). Views start at column 0 (16-byte aligned, the vector kernels) and at column 1
// (odd offsets, the scalar kernels); outputs are poisoned and their padding must stay so. Their
// bandwidth: bench/norm_rope_bench.cu.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <string>

#include "kernels/cuda/gemm/linear.h"
#include "ops_gpu_util.h"

namespace llmk::gpu_test {
namespace {

std::string label(const char* op, int64_t rows, int64_t D, int64_t offset, bool add_one) {
  return std::string(op) + " rows=" + std::to_string(rows) + " D=" + std::to_string(D) +
         " offset=" + std::to_string(offset) + " add_one=" + std::to_string(add_one);
}

using CudaOpRmsNorm = CudaOpTest;

TEST_F(CudaOpRmsNorm, MatchesCpu) {
  uint32_t seed = 1;
  for (int64_t rows : {1, 3, 17, 300}) {
    for (int64_t D : {1, 3, 17, 127, 576, 1000, 4096, 4099}) {
      for (int64_t offset : {0, 1}) {
        const bool add_one = (seed & 1) != 0;
        const std::string what = label("rms_norm", rows, D, offset, add_one);
        // x: columns [offset, offset + D) of a [rows, D + 8] bf16 buffer; out likewise.
        const Tensor x_host = random_host({rows, D + 8}, DType::BF16, seed++, -3, 3);
        const Tensor w_host = random_host({D}, DType::F32, seed++, -2, 2);
        const Tensor x_dev = x_host.to(Device::CUDA), w = w_host.to(Device::CUDA);
        Tensor out_dev = poisoned_cuda({rows, D + 8}, DType::BF16);
        Tensor out = out_dev.slice(1, offset, offset + D);
        ops::rms_norm(out, x_dev.slice(1, offset, offset + D), w, 1e-5f, add_one);
        Tensor ref = Tensor::empty({rows, D}, DType::F32);
        ops::rms_norm(ref, to_f32(x_host.slice(1, offset, offset + D)), w_host, 1e-5f, add_one);
        const Tensor got = out_dev.to(Device::CPU);
        expect_close(got.slice(1, offset, offset + D), ref, kBf16Out, what);
        EXPECT_EQ(unpoisoned(got.slice(1, 0, offset)) + unpoisoned(got.slice(1, offset + D, D + 8)),
                  0)
            << what << ": wrote outside out";
      }
    }
  }
}

TEST_F(CudaOpRmsNorm, InPlaceAndLeadingDims) {
  // x: [2, 3, 640] normalised in place, as a view that merges into one run of 6 rows.
  const Tensor x_host = random_host({2, 3, 640}, DType::BF16, 5, -2, 2);
  const Tensor w_host = random_host({640}, DType::F32, 6);
  Tensor x = x_host.to(Device::CUDA);
  const Tensor w = w_host.to(Device::CUDA);
  ops::rms_norm(x, x, w, 1e-6f);
  Tensor ref = Tensor::empty({2, 3, 640}, DType::F32);
  ops::rms_norm(ref, to_f32(x_host), w_host, 1e-6f);
  expect_close(x.to(Device::CPU), ref, kBf16Out, "rms_norm in place");
}

// QK-norm's shape: the heads of q inside the Q|K|V output, a [T, H, D] view whose rows are two
// strides apart (head stride D, token stride the whole projection), normalised in place in one
// launch; also the scalar path (odd D, unaligned offset) and an out-of-place [T, H, D] target.
TEST_F(CudaOpRmsNorm, StridedHeadViews) {
  uint32_t seed = 300;
  for (int64_t D : {64, 256, 17}) {
    for (int64_t T : {1, 5, 130}) {
      const int64_t H = 4, Hkv = 1, width = (H + 2 * Hkv) * D + 3;
      const Tensor qkv_host = random_host({T, width}, DType::BF16, seed++, -3, 3);
      const Tensor w_host = random_host({D}, DType::F32, seed++, -2, 2);
      const int64_t off = D % 8 == 0 ? 0 : 1;
      Tensor qkv = qkv_host.to(Device::CUDA);
      const Tensor w = w_host.to(Device::CUDA);
      Tensor q = qkv.slice(1, off, off + H * D).unflatten(1, {H, D});
      ops::rms_norm(q, q, w, 1e-6f, /*add_one=*/(seed & 1) != 0);
      Tensor ref = Tensor::empty({T, H, D}, DType::F32);
      const Tensor q_in = to_f32(qkv_host.slice(1, off, off + H * D).unflatten(1, {H, D}));
      ops::rms_norm(ref, q_in, w_host, 1e-6f, (seed & 1) != 0);
      const Tensor got = qkv.to(Device::CPU);
      const std::string what = label("rms_norm [T, H, D] view", T, D, off, (seed & 1) != 0);
      expect_close(got.slice(1, off, off + H * D).unflatten(1, {H, D}), ref, kBf16Out, what);
      // The rest of the row (K, V and the padding) is untouched.
      const Tensor rest_got = to_f32(got.slice(1, off + H * D, width));
      const Tensor rest_in = to_f32(qkv_host.slice(1, off + H * D, width));
      EXPECT_EQ(compare(rest_got, rest_in).max_abs, 0.0) << what;
      // Out of place into a contiguous [T, H, D].
      Tensor out = poisoned_cuda({T, H, D}, DType::BF16);
      Tensor q2 = qkv_host.to(Device::CUDA).slice(1, off, off + H * D).unflatten(1, {H, D});
      ops::rms_norm(out, q2, w, 1e-6f, (seed & 1) != 0);
      expect_close(out.to(Device::CPU), ref, kBf16Out, what + " out of place");
    }
  }
}

using CudaOpAddRmsNorm = CudaOpTest;

TEST_F(CudaOpAddRmsNorm, MatchesSeparateAddAndNormOnCpu) {
  uint32_t seed = 100;
  for (int64_t rows : {1, 3, 17, 300}) {
    for (int64_t D : {1, 3, 17, 127, 576, 1000, 4096, 4099}) {
      for (int64_t offset : {0, 1}) {
        for (bool with_delta : {true, false}) {
          const bool add_one = (seed & 2) != 0;
          const std::string what = label("add_rms_norm", rows, D, offset, add_one) +
                                   (with_delta ? " delta" : " no delta");
          const Tensor x_host = random_host({rows, D + 8}, DType::BF16, seed++, -3, 3);
          const Tensor d_host = random_host({rows, D + 8}, DType::BF16, seed++, -3, 3);
          const Tensor w_host = random_host({D}, DType::F32, seed++, -2, 2);
          Tensor x_dev = x_host.to(Device::CUDA);
          const Tensor d_dev = d_host.to(Device::CUDA), w = w_host.to(Device::CUDA);
          Tensor out_dev = poisoned_cuda({rows, D + 8}, DType::BF16);
          Tensor x = x_dev.slice(1, offset, offset + D);
          Tensor out = out_dev.slice(1, offset, offset + D);
          ops::add_rms_norm(x, with_delta ? d_dev.slice(1, offset, offset + D) : Tensor(), out, w,
                            1e-5f, add_one);
          // CPU: the f32 sum, rounded to bf16 as the contract says, then the norm of that.
          Tensor sum = to_f32(x_host.slice(1, offset, offset + D));
          if (with_delta) ops::add(sum, sum, to_f32(d_host.slice(1, offset, offset + D)));
          Tensor sum_bf16 = Tensor::empty({rows, D}, DType::BF16);
          ops::copy(sum_bf16, sum);
          Tensor ref = Tensor::empty({rows, D}, DType::F32);
          ops::rms_norm(ref, to_f32(sum_bf16), w_host, 1e-5f, add_one);
          const Tensor x_got = x_dev.to(Device::CPU), out_got = out_dev.to(Device::CPU);
          expect_bf16_exact(x_got.slice(1, offset, offset + D), sum, what + " (x)");
          expect_close(out_got.slice(1, offset, offset + D), ref, kBf16Out, what);
          // x outside the view is untouched; out outside the view still poisoned.
          EXPECT_EQ(compare(x_got.slice(1, 0, offset), x_host.slice(1, 0, offset)).max_abs, 0.0);
          EXPECT_EQ(compare(x_got.slice(1, offset + D, D + 8), x_host.slice(1, offset + D, D + 8))
                        .max_abs,
                    0.0)
              << what;
          EXPECT_EQ(unpoisoned(out_got.slice(1, 0, offset)) +
                        unpoisoned(out_got.slice(1, offset + D, D + 8)),
                    0)
              << what << ": wrote outside out";
        }
      }
    }
  }
}

using CudaOpRope = CudaOpTest;

struct RopeCase {
  int64_t T, H, D;
  int rot_dim;
  ops::RopeLayout layout;
  float freq_scale;
  bool factors;
  bool unaligned;  // odd strides and start: the element-by-element kernels
};

using L = ops::RopeLayout;
const RopeCase kRopeCases[] = {
    {1, 32, 128, 0, L::HalfSplit, 1.0f, false, false},    // Llama decode
    {17, 9, 64, 0, L::Adjacent, 1.0f, false, false},      // SmolLM2 from GGUF
    {300, 14, 64, 0, L::HalfSplit, 1.0f, true, false},    // llama3 factors
    {33, 4, 128, 64, L::HalfSplit, 0.25f, false, false},  // partial, scaled
    {5, 3, 80, 40, L::Adjacent, 1.0f, true, false},       // rot/2 = 20: not a multiple of 8
    {7, 5, 96, 48, L::HalfSplit, 1.0f, false, false},     // half 24: vectors of 8
    {9, 3, 18, 0, L::HalfSplit, 1.0f, false, false},      // half 9: element by element
    {9, 3, 18, 10, L::Adjacent, 0.5f, true, true},
    {64, 8, 128, 0, L::HalfSplit, 1.0f, true, true},
    {3, 2, 256, 0, L::Adjacent, 1.0f, false, false},  // Gemma-sized head
};

// The case's RoPE parameters, its frequency factors (when it has them) from ff.
ops::RopeParams rope_params(const RopeCase& c, const Tensor& ff) {
  ops::RopeParams p;
  p.rot_dim = c.rot_dim;
  p.theta = 500000.0f;
  p.layout = c.layout;
  p.freq_scale = c.freq_scale;
  p.freq_factors = c.factors ? &ff : nullptr;
  return p;
}

TEST_F(CudaOpRope, MatchesCpu) {
  uint32_t seed = 500;
  for (const RopeCase& c : kRopeCases) {
    const int rot = c.rot_dim == 0 ? static_cast<int>(c.D) : c.rot_dim;
    const std::string what = "rope T=" + std::to_string(c.T) + " H=" + std::to_string(c.H) +
                             " D=" + std::to_string(c.D) + " rot=" + std::to_string(rot) +
                             (c.layout == L::HalfSplit ? " half-split" : " adjacent") +
                             (c.unaligned ? " unaligned" : "");
    // x: heads [0, H) of a [T, H + 2, D + 1] buffer, columns [u, u + D): row strides that
    // are not multiples of 8 when unaligned (u = 1), else a [T, H + 2, D] buffer (fused QKV).
    const int64_t u = c.unaligned ? 1 : 0;
    const Tensor buf_host = random_host({c.T, c.H + 2, c.D + u}, DType::BF16, seed++, -2, 2);
    const Tensor x_host = buf_host.slice(1, 0, c.H).slice(2, u, u + c.D);
    // Positions up to 2^17 + a few thousand, in no order.
    std::mt19937 rng(seed++);
    Tensor pos_host = Tensor::empty({c.T}, DType::I32);
    for (int64_t t = 0; t < c.T; ++t) {
      pos_host.data<int32_t>()[t] = t == 0 ? 0 : static_cast<int32_t>(rng() % 135000);
    }
    const Tensor ff_host = random_host({rot / 2}, DType::F32, seed++, 1, 8);
    Tensor buf_dev = buf_host.to(Device::CUDA);
    Tensor x = buf_dev.slice(1, 0, c.H).slice(2, u, u + c.D);
    const Tensor pos = pos_host.to(Device::CUDA), ff = ff_host.to(Device::CUDA);
    const ops::RopeParams p = rope_params(c, ff);
    ops::rope(x, pos, p);
    Tensor ref = to_f32(x_host);
    const ops::RopeParams pc = rope_params(c, ff_host);
    ops::rope(ref, pos_host, pc);
    const Tensor got = buf_dev.to(Device::CPU);
    expect_close(got.slice(1, 0, c.H).slice(2, u, u + c.D), ref, kBf16Out, what);
    // The unrotated dims [rot, D) and the other heads come back bit for bit.
    if (rot < c.D) {
      EXPECT_EQ(compare(got.slice(1, 0, c.H).slice(2, u + rot, u + c.D),
                        buf_host.slice(1, 0, c.H).slice(2, u + rot, u + c.D))
                    .max_abs,
                0.0)
          << what;
    }
    EXPECT_EQ(compare(got.slice(1, c.H, c.H + 2), buf_host.slice(1, c.H, c.H + 2)).max_abs, 0.0)
        << what;
  }
}

// rope_kv_append: the same cases with the last Hkv heads of x as keys and a value projection
// beside them, appended in one launch. x must match the CPU's rope then kv_append; the cache
// rows written must hold exactly the GPU's rotated keys and the values (bit for bit), and every
// other cache row must be untouched.
TEST_F(CudaOpRope, FusedKvAppendMatchesCpu) {
  uint32_t seed = 900;
  for (const RopeCase& c : kRopeCases) {
    const int rot = c.rot_dim == 0 ? static_cast<int>(c.D) : c.rot_dim;
    const int64_t Hkv = std::max<int64_t>(1, c.H / 3), cache_len = c.T + 7, u = c.unaligned ? 1 : 0;
    const std::string what = "rope_kv_append T=" + std::to_string(c.T) +
                             " H=" + std::to_string(c.H) + " Hkv=" + std::to_string(Hkv) +
                             " D=" + std::to_string(c.D) + " rot=" + std::to_string(rot) +
                             (c.layout == L::HalfSplit ? " half-split" : " adjacent") +
                             (c.unaligned ? " unaligned" : "");
    // qk: heads [0, H) of [T, H + Hkv, D + u] (columns u..), v: heads [H, H + Hkv).
    const Tensor buf_host = random_host({c.T, c.H + Hkv, c.D + u}, DType::BF16, seed++, -2, 2);
    const Tensor cache_host = random_host({2, cache_len, Hkv, c.D + u}, DType::BF16, seed++);
    std::mt19937 rng(seed++);
    std::vector<int32_t> positions(static_cast<size_t>(c.T)), rows(static_cast<size_t>(cache_len));
    for (int32_t& p : positions) p = static_cast<int32_t>(rng() % 135000);
    for (size_t r = 0; r < rows.size(); ++r) rows[r] = static_cast<int32_t>(r);
    std::shuffle(rows.begin(), rows.end(), rng);
    rows.resize(static_cast<size_t>(c.T));  // distinct cache rows, in no order
    const Tensor ff_host = random_host({rot / 2}, DType::F32, seed++, 1, 8);

    Tensor buf = buf_host.to(Device::CUDA), cache = cache_host.to(Device::CUDA);
    Tensor qk = buf.slice(1, 0, c.H).slice(2, u, u + c.D);
    const Tensor v = buf.slice(1, c.H, c.H + Hkv).slice(2, u, u + c.D);
    Tensor kc = cache.select(0, 0).slice(2, u, u + c.D);
    Tensor vc = cache.select(0, 1).slice(2, u, u + c.D);
    const Tensor pos = i32_host(positions).to(Device::CUDA), ff = ff_host.to(Device::CUDA);
    const Tensor row_dev = i32_host(rows).to(Device::CUDA);
    const ops::RopeParams p = rope_params(c, ff);
    ops::rope_kv_append(qk, pos, p, kc, vc, v, row_dev);

    Tensor qk_ref = to_f32(buf_host.slice(1, 0, c.H).slice(2, u, u + c.D));
    Tensor kc_ref = to_f32(cache_host.select(0, 0).slice(2, u, u + c.D));
    Tensor vc_ref = to_f32(cache_host.select(0, 1).slice(2, u, u + c.D));
    const ops::RopeParams pc = rope_params(c, ff_host);
    ops::rope_kv_append(qk_ref, i32_host(positions), pc, kc_ref, vc_ref,
                        to_f32(buf_host.slice(1, c.H, c.H + Hkv).slice(2, u, u + c.D)),
                        i32_host(rows));
    const Tensor got = buf.to(Device::CPU), cache_got = cache.to(Device::CPU);
    expect_close(got.slice(1, 0, c.H).slice(2, u, u + c.D), qk_ref, kBf16Out, what);
    expect_close(cache_got.select(0, 0).slice(2, u, u + c.D), kc_ref, kBf16Out, what + " (k)");
    expect_bf16_exact(cache_got.select(0, 1).slice(2, u, u + c.D), vc_ref, what + " (v)");
    for (int64_t t = 0; t < c.T; ++t) {
      const int64_t r = rows[static_cast<size_t>(t)];
      EXPECT_EQ(compare(cache_got.select(0, 0).select(0, r).slice(1, u, u + c.D),
                        got.select(0, t).slice(0, c.H - Hkv, c.H).slice(1, u, u + c.D))
                    .max_abs,
                0.0)
          << what << ": cache row " << r << " is not token " << t << "'s rotated key";
    }
    // Padding columns and unwritten rows are untouched.
    if (u > 0) {
      EXPECT_EQ(compare(cache_got.slice(3, 0, u), cache_host.slice(3, 0, u)).max_abs, 0.0) << what;
    }
    for (int64_t r = 0; r < cache_len; ++r) {
      if (std::find(rows.begin(), rows.end(), r) != rows.end()) continue;
      EXPECT_EQ(compare(cache_got.select(1, r), cache_host.select(1, r)).max_abs, 0.0)
          << what << ": row " << r << " written";
    }
  }
}

// A cache row outside the cache is skipped (as kv_append skips it); the rotation still happens.
TEST_F(CudaOpRope, FusedKvAppendSkipsRowsOutsideTheCache) {
  const Tensor buf_host = random_host({2, 6, 64}, DType::BF16, 950, -2, 2);
  const Tensor cache_host = random_host({8, 2, 64}, DType::BF16, 951);
  Tensor buf = buf_host.to(Device::CUDA), ref = buf_host.to(Device::CUDA);
  Tensor kc = cache_host.to(Device::CUDA), vc = cache_host.to(Device::CUDA);
  Tensor qk = buf.slice(1, 0, 4), qk_ref = ref.slice(1, 0, 4);
  const Tensor pos = i32_host({5, 6}).to(Device::CUDA);
  ops::rope_kv_append(qk, pos, {}, kc, vc, buf.slice(1, 4, 6), i32_host({8, -1}).to(Device::CUDA));
  ops::rope(qk_ref, pos, {});
  EXPECT_EQ(compare(buf.to(Device::CPU), ref.to(Device::CPU)).max_abs, 0.0);
  EXPECT_EQ(compare(kc.to(Device::CPU), cache_host).max_abs, 0.0);
  EXPECT_EQ(compare(vc.to(Device::CPU), cache_host).max_abs, 0.0);
}

// linear_rope_kv_append: one token's Q|K|V projection with RoPE and the KV append in the one-row
// linear's epilogue, against the CPU's linear (its output rounded to bf16, as the GPU's is),
// rope_kv_append; model shapes (Phi-3, Qwen2 with a bias, SmolLM2's adjacent pairs from GGUF,
// llama3 factors with a position scale, Gemma's head dim) at a small and a large position. The
// cache rows must hold the GPU's own rotated keys and values bit for bit; other rows untouched.
TEST_F(CudaOpRope, LinearRopeKvAppendMatchesCpu) {
  struct Case {
    int64_t Hq, Hkv, D, K;
    L layout;
    bool bias, factors;
    float freq_scale;
  };
  const Case cases[] = {{32, 32, 96, 3072, L::HalfSplit, false, false, 1.0f},
                        {14, 2, 64, 896, L::HalfSplit, true, false, 1.0f},
                        {9, 3, 64, 576, L::Adjacent, false, false, 1.0f},
                        {8, 8, 128, 520, L::HalfSplit, false, true, 0.5f},
                        {4, 1, 256, 640, L::Adjacent, true, false, 1.0f}};
  uint32_t seed = 1200;
  for (const Case& c : cases) {
    for (int32_t position : {5, 131000}) {
      const int64_t N = (c.Hq + 2 * c.Hkv) * c.D, cache_len = 9, row = 6;
      const std::string what = "linear_rope_kv_append Hq=" + std::to_string(c.Hq) +
                               " Hkv=" + std::to_string(c.Hkv) + " D=" + std::to_string(c.D) +
                               " pos=" + std::to_string(position);
      const Tensor x_host = random_host({1, c.K}, DType::BF16, seed++, -1, 1);
      const float ws = 2.0f / std::sqrt(static_cast<float>(c.K));
      const Tensor w_host = random_host({N, c.K}, DType::BF16, seed++, -ws, ws);
      const Tensor b_host = random_host({N}, DType::BF16, seed++, -0.5f, 0.5f);
      const Tensor ff_host = random_host({c.D / 2}, DType::F32, seed++, 1, 8);
      const Tensor cache_host = random_host({2, cache_len, c.Hkv, c.D}, DType::BF16, seed++);
      const Tensor x = x_host.to(Device::CUDA), w = w_host.to(Device::CUDA);
      const Tensor b = b_host.to(Device::CUDA), ff = ff_host.to(Device::CUDA);
      Tensor cache = cache_host.to(Device::CUDA);
      Tensor kc = cache.select(0, 0), vc = cache.select(0, 1);
      Tensor qkv = poisoned_cuda({1, N}, DType::BF16);
      ops::RopeParams p;
      p.theta = 10000.0f;
      p.layout = c.layout;
      p.freq_scale = c.freq_scale;
      p.freq_factors = c.factors ? &ff : nullptr;
      const uint64_t before = cuda::linear_stats().gemv;
      ops::linear_rope_kv_append(qkv, x, w, c.bias ? &b : nullptr, c.Hq,
                                 i32_host({position}).to(Device::CUDA), p, kc, vc,
                                 i32_host({static_cast<int32_t>(row)}).to(Device::CUDA));
      EXPECT_EQ(cuda::linear_stats().gemv, before + 1) << what << ": not the one-row kernel";

      Tensor lin = Tensor::empty({1, N}, DType::F32);
      const Tensor b32 = to_f32(b_host);
      ops::linear(lin, to_f32(x_host), to_f32(w_host), c.bias ? &b32 : nullptr);
      Tensor lin16 = Tensor::empty({1, N}, DType::BF16);
      ops::copy(lin16, lin);
      Tensor qkv_ref = to_f32(lin16);
      Tensor kc_ref = to_f32(cache_host.select(0, 0)), vc_ref = to_f32(cache_host.select(0, 1));
      ops::RopeParams pc = p;
      pc.freq_factors = c.factors ? &ff_host : nullptr;
      Tensor qk_ref = qkv_ref.slice(1, 0, (c.Hq + c.Hkv) * c.D).unflatten(1, {c.Hq + c.Hkv, c.D});
      ops::rope_kv_append(qk_ref, i32_host({position}), pc, kc_ref, vc_ref,
                          qkv_ref.slice(1, (c.Hq + c.Hkv) * c.D, N).unflatten(1, {c.Hkv, c.D}),
                          i32_host({static_cast<int32_t>(row)}));
      const Tensor got = qkv.to(Device::CPU), cache_got = cache.to(Device::CPU);
      expect_close(got, qkv_ref, kBf16Out, what);
      expect_close(cache_got.select(0, 0), kc_ref, kBf16Out, what + " (k cache)");
      const Tensor kv_got = got.slice(1, c.Hq * c.D, N).contiguous().view({2, c.Hkv, c.D});
      for (int kind = 0; kind < 2; ++kind) {
        EXPECT_EQ(compare(cache_got.select(0, kind).select(0, row), kv_got.select(0, kind)).max_abs,
                  0.0)
            << what << ": cache row " << (kind ? "v" : "k");
        for (int64_t r = 0; r < cache_len; ++r) {
          if (r == row) continue;
          EXPECT_EQ(compare(cache_got.select(0, kind).select(0, r),
                            cache_host.select(0, kind).select(0, r))
                        .max_abs,
                    0.0)
              << what << ": row " << r << " written";
        }
      }
    }
  }
}

// Unit vectors (1, 0) rotate to (cos, sin) of the angle: at positions near 2^17 the output must
// be cos and sin of the double-precision angle rounded to bf16 (an fp32 angle would be off by up
// to 0.01 radians there, several bf16 steps). One bf16 step of slack for values that sit on a
// rounding boundary.
TEST_F(CudaOpRope, AngleAccurateAtLongPositions) {
  const int64_t T = 64, H = 1, D = 128, half = D / 2;
  Tensor x_host = Tensor::empty({T, H, D}, DType::BF16);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < D; ++i) x_host.data<uint16_t>()[t * D + i] = float_to_bf16(i < half);
  }
  Tensor pos_host = Tensor::empty({T}, DType::I32);
  for (int64_t t = 0; t < T; ++t)
    pos_host.data<int32_t>()[t] = static_cast<int32_t>(131072 - 37 * t);
  Tensor x = x_host.to(Device::CUDA);
  const Tensor pos = pos_host.to(Device::CUDA);
  ops::RopeParams p;
  p.theta = 10000.0f;
  ops::rope(x, pos, p);
  const Tensor got = x.to(Device::CPU);
  int64_t off_by_one = 0, worse = 0;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const double angle =
          pos_host.data<int32_t>()[t] * std::pow(10000.0, -2.0 * static_cast<double>(i) / D);
      const float want[2] = {static_cast<float>(std::cos(angle)),
                             static_cast<float>(std::sin(angle))};
      const uint16_t got_bits[2] = {got.data<uint16_t>()[t * D + i],
                                    got.data<uint16_t>()[t * D + i + half]};
      for (int k = 0; k < 2; ++k) {
        const int diff = std::abs(static_cast<int>(got_bits[k]) - float_to_bf16(want[k]));
        // Same sign: a bit-pattern difference counts bf16 steps.
        off_by_one += diff == 1;
        worse += diff > 1;
      }
    }
  }
  EXPECT_EQ(worse, 0) << "rotations off by more than one bf16 step";
  EXPECT_LE(off_by_one, T * half * 2 / 100) << "more than 1% one step off";
}

}  // namespace
}  // namespace llmk::gpu_test
