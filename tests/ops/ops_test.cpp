// The ops layer: argument checking (clear llmk::Error messages naming op and argument), views
// with strides, and agreement with the kernels it dispatches to. Kernel numerics are tested in
// tests/kernels; here results are checked against simple independent facts or a second call on
// contiguous copies.
#include "ops/ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "kernels/cpu/dequant.h"
#include "kernels/test_util.h"
#include "ops/ops_test_util.h"

namespace llmk {
namespace {

using test::expect_error;
using test::poisoned;
using test::random_tensor;
Tensor ids_tensor(std::initializer_list<int32_t> ids) { return test::i32_tensor(ids); }

Tensor weights(DType t, int64_t rows, int64_t K, uint32_t seed) {
  Tensor w = Tensor::empty({rows, K}, t);
  const auto bytes = test::random_weights(t, rows, K, seed);
  std::memcpy(w.data(), bytes.data(), bytes.size());
  return w;
}

float at(const Tensor& t, std::initializer_list<int64_t> idx) {
  int64_t off = 0, i = 0;
  for (int64_t v : idx) off += v * t.stride(static_cast<int>(i++));
  return t.data<float>()[off];
}

// ---- linear ----------------------------------------------------------------------------------

TEST(OpsLinear, MatchesDequantisedReference) {
  for (DType t : {DType::Q4_1, DType::Q8_0, DType::Q4_K, DType::Q6_K, DType::F16}) {
    for (int64_t M : {1, 6}) {
      const int64_t K = 256, N = 19;
      Tensor x = random_tensor({M, K}, 1);
      Tensor w = weights(t, N, K, 2);
      Tensor b = random_tensor({N}, 3);
      Tensor y = poisoned({M, N});
      ops::linear(y, x, w, &b);
      std::vector<float> row(K);
      for (int64_t n = 0; n < N; ++n) {
        cpu::dequantize_row(t, static_cast<const uint8_t*>(w.data()) + n * w.row_bytes(),
                            row.data(), K);
        for (int64_t m = 0; m < M; ++m) {
          double ref = b.data<float>()[n], mag = std::fabs(ref);
          for (int64_t k = 0; k < K; ++k) {
            ref += static_cast<double>(at(x, {m, k})) * row[static_cast<size_t>(k)];
            mag += std::fabs(at(x, {m, k}) * row[static_cast<size_t>(k)]);
          }
          // See tests/kernels/matmul_test.cpp for the bound; 4x that here, as mag omits the
          // min/scale term.
          EXPECT_NEAR(at(y, {m, n}), ref, 8 * (K + 2) * test::kU * mag) << dtype_name(t);
        }
      }
    }
  }
}

TEST(OpsLinear, StridedActivationsAndOutput) {
  // x and y are column slices of wider buffers: rows are strided, the last dim contiguous.
  Tensor xbig = random_tensor({3, 100}, 5);
  Tensor x = xbig.slice(1, 4, 68);  // [3, 64]
  Tensor w = weights(DType::Q8_0, 10, 64, 6);
  Tensor ybig = poisoned({3, 15});
  Tensor y = ybig.slice(1, 2, 12);  // [3, 10]
  ops::linear(y, x, w);
  Tensor yc = poisoned({3, 10});
  Tensor xc = x.contiguous();
  ops::linear(yc, xc, w);
  for (int64_t m = 0; m < 3; ++m) {
    for (int64_t n = 0; n < 15; ++n) {
      if (n >= 2 && n < 12) {
        EXPECT_EQ(at(ybig, {m, n}), at(yc, {m, n - 2}));
      } else {
        EXPECT_TRUE(std::isnan(at(ybig, {m, n})));
      }
    }
  }
}

// linear_add gives out + linear(x, w, b) bit for bit: the fused path (up to 4 rows per group)
// and the tiled one (more rows), block and plain weights, with and without a bias; and K = 0.
TEST(OpsLinear, AddIsLinearThenAnAddBitForBit) {
  for (DType t : {DType::Q4_K, DType::Q8_0, DType::F32}) {
    for (int64_t M : {1, 3, 6, 9}) {
      for (bool with_bias : {false, true}) {
        const int64_t K = 256, N = 23;
        const Tensor x = random_tensor({M, K}, 11);
        const Tensor w = weights(t, N, K, 12);
        const Tensor b = random_tensor({N}, 13);
        const Tensor start = random_tensor({M, N}, 14);
        Tensor product = poisoned({M, N});
        ops::linear(product, x, w, with_bias ? &b : nullptr);
        Tensor y = start.contiguous();
        ops::linear_add(y, x, w, with_bias ? &b : nullptr);
        for (int64_t m = 0; m < M; ++m) {
          for (int64_t n = 0; n < N; ++n) {
            EXPECT_EQ(at(y, {m, n}), at(start, {m, n}) + at(product, {m, n}))
                << dtype_name(t) << " M=" << M << " bias " << with_bias << " at " << m << "," << n;
          }
        }
      }
    }
  }
  const Tensor b = random_tensor({5}, 15);
  const Tensor start = random_tensor({2, 5}, 16);
  Tensor y = start.contiguous();
  ops::linear_add(y, Tensor::empty({2, 0}, DType::F32), Tensor::empty({5, 0}, DType::F32), &b);
  for (int64_t n = 0; n < 5; ++n) EXPECT_EQ(at(y, {1, n}), at(start, {1, n}) + b.data<float>()[n]);
}

TEST(OpsLinear, ArgumentErrors) {
  Tensor x = random_tensor({3, 64}, 1);
  Tensor w = weights(DType::Q4_1, 10, 96, 2);
  Tensor y = poisoned({3, 10});
  try {
    ops::linear(y, x, w);
    ADD_FAILURE() << "no throw";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "ops::linear: x is f32[3, 64] but w is q4_1[10, 96]: inner dims differ");
  }
  Tensor w64 = weights(DType::Q4_1, 10, 64, 2);
  Tensor y_bad = poisoned({3, 11});
  expect_error([&] { ops::linear(y_bad, x, w64); }, {"ops::linear", "out", "[3, 10]"});
  Tensor b_bad = random_tensor({11}, 3);
  expect_error([&] { ops::linear(y, x, w64, &b_bad); }, {"ops::linear", "bias", "[10]"});
  Tensor x16 = Tensor::zeros({3, 64}, DType::F16);
  expect_error([&] { ops::linear(y, x16, w64); }, {"ops::linear", "x is f16[3, 64]", "f32"});
  Tensor wi = Tensor::zeros({10, 64}, DType::I32);
  expect_error([&] { ops::linear(y, x, wi); }, {"ops::linear", "i32", "not supported"});
  Tensor w1 = weights(DType::Q8_0, 1, 64, 2).view({64});
  expect_error([&] { ops::linear(y, x, w1); }, {"ops::linear", "w", "2 dimensions"});
  Tensor xy = random_tensor({3, 74}, 1);
  Tensor xa = xy.slice(1, 0, 64), ya = xy.slice(1, 60, 70);  // columns 60..63 in both
  expect_error([&] { ops::linear(ya, xa, w64); }, {"ops::linear", "overlaps"});
  Tensor xt = random_tensor({64, 3}, 1).transpose(0, 1);
  expect_error([&] { ops::linear(y, xt, w64); }, {"ops::linear", "contiguous last dimension"});
}

TEST(Ops, TensorsOnTheGpuAreRejected) {
  float dummy[64];
  Tensor g = Tensor::borrow(dummy, {4, 16}, DType::F32, Device::CUDA);
  Tensor c = random_tensor({4, 16}, 1);
  Tensor w = weights(DType::F32, 16, 16, 1);
  Tensor wg = Tensor::borrow(w.data(), {16, 16}, DType::F32, Device::CUDA);
  Tensor y = poisoned({4, 16});
#ifdef LLMK_HAS_CUDA
  // Built with CUDA: GPU tensors are taken (tests/gpu), a mix of devices is the error.
  expect_error([&] { ops::add(g, c, c); }, {"ops::add", "a is f32[4, 16] on cpu", "one device"});
  expect_error([&] { ops::linear(y, c, wg); }, {"ops::linear", "w", "one device"});
#else
  expect_error([&] { ops::add(g, c, c); }, {"ops::add", "out", "not built with CUDA"});
  expect_error([&] { ops::scale(g, 2.0f); }, {"ops::scale", "not built with CUDA"});
  expect_error([&] { ops::linear(y, c, wg); }, {"ops::linear", "w", "not built with CUDA"});
#endif
  Tensor undefined;
  expect_error([&] { ops::scale(undefined, 2.0f); }, {"ops::scale", "undefined"});
}

// ---- embedding -------------------------------------------------------------------------------

TEST(OpsEmbedding, GathersRowsAndRejectsBadIds) {
  Tensor table = weights(DType::Q6_K, 7, 256, 3);
  Tensor ids = ids_tensor({6, 0, 2});
  Tensor out = poisoned({3, 256});
  ops::embedding(out, table, ids);
  std::vector<float> row(256);
  cpu::dequantize_row(DType::Q6_K,
                      static_cast<const uint8_t*>(table.data()) + 6 * table.row_bytes(), row.data(),
                      256);
  for (int64_t d = 0; d < 256; ++d) EXPECT_EQ(at(out, {0, d}), row[static_cast<size_t>(d)]);

  Tensor bad = ids_tensor({1, 7});
  Tensor out2 = out.slice(0, 0, 2);
  try {
    ops::embedding(out2, table, bad);
    ADD_FAILURE() << "no throw";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("ops::embedding"), std::string::npos) << msg;
    EXPECT_NE(msg.find("ids[1] = 7"), std::string::npos) << msg;
    EXPECT_NE(msg.find("vocabulary of 7"), std::string::npos) << msg;
  }
  Tensor neg = ids_tensor({-1});
  Tensor out1 = poisoned({1, 256});
  expect_error([&] { ops::embedding(out1, table, neg); }, {"ids[0] = -1", "vocabulary of 7"});
  Tensor fids = Tensor::zeros({3}, DType::F32);
  expect_error([&] { ops::embedding(out, table, fids); }, {"ops::embedding", "ids", "i32"});
  Tensor out_bad = poisoned({3, 255});
  expect_error([&] { ops::embedding(out_bad, table, ids); }, {"ops::embedding", "out", "[3, 256]"});
}

TEST(OpsEmbedding, PlainTableWithRowStride) {
  Tensor big = random_tensor({5, 40}, 4);
  Tensor table = big.slice(1, 8, 24);  // [5, 16], rows 40 apart
  Tensor ids = ids_tensor({4, 1});
  Tensor out = poisoned({2, 16});
  ops::embedding(out, table, ids);
  for (int64_t d = 0; d < 16; ++d) {
    EXPECT_EQ(at(out, {0, d}), at(big, {4, 8 + d}));
    EXPECT_EQ(at(out, {1, d}), at(big, {1, 8 + d}));
  }
}

// ---- rms_norm --------------------------------------------------------------------------------

TEST(OpsRmsNorm, StridedViewsMatchContiguous) {
  // x: [2, 3, 16] view into a [2, 3, 20] buffer; the row walker must visit all 6 rows.
  Tensor big = random_tensor({2, 3, 20}, 6, -3, 3);
  Tensor x = big.slice(2, 2, 18);
  Tensor w = random_tensor({16}, 7);
  Tensor out = poisoned({2, 3, 16});
  ops::rms_norm(out, x, w, 1e-6f, true);
  Tensor xc = x.contiguous();
  Tensor outc = poisoned({2, 3, 16});
  ops::rms_norm(outc, xc, w, 1e-6f, true);
  for (int64_t i = 0; i < 96; ++i) EXPECT_EQ(out.data<float>()[i], outc.data<float>()[i]);
  // In place on the strided view; the gaps keep their values.
  const float gap = at(big, {1, 2, 19});
  ops::rms_norm(x, x, w, 1e-6f, true);
  for (int64_t i = 0; i < 96; ++i)
    EXPECT_EQ(at(x, {i / 48, i / 16 % 3, i % 16}), outc.data<float>()[i]);
  EXPECT_EQ(at(big, {1, 2, 19}), gap);
  // Unit rows: x = [1, 1, ..., 1] normalises to exactly w.
  Tensor ones = Tensor::empty({1, 16}, DType::F32);
  std::fill(ones.data<float>(), ones.data<float>() + 16, 1.0f);
  Tensor y = poisoned({1, 16});
  ops::rms_norm(y, ones, w, 0.0f);
  for (int64_t d = 0; d < 16; ++d) EXPECT_EQ(at(y, {0, d}), w.data<float>()[d]);
}

TEST(OpsRmsNorm, ArgumentErrors) {
  Tensor x = random_tensor({2, 16}, 1);
  Tensor w = random_tensor({15}, 2);
  Tensor out = poisoned({2, 16});
  expect_error([&] { ops::rms_norm(out, x, w, 1e-6f); }, {"ops::rms_norm", "w is f32[15]", "[16]"});
  Tensor w16 = random_tensor({16}, 2);
  Tensor out_bad = poisoned({16, 2});
  expect_error([&] { ops::rms_norm(out_bad, x, w16, 1e-6f); }, {"ops::rms_norm", "out"});
  Tensor xt = random_tensor({16, 2}, 1).transpose(0, 1);
  expect_error([&] { ops::rms_norm(out, xt, w16, 1e-6f); }, {"contiguous last dimension"});
  Tensor buf = random_tensor({40}, 3);
  Tensor a = buf.slice(0, 0, 32).view({2, 16}), b = buf.slice(0, 8, 40).view({2, 16});
  expect_error([&] { ops::rms_norm(b, a, w16, 1e-6f); }, {"ops::rms_norm", "partially overlaps"});
}

// ---- rope ------------------------------------------------------------------------------------

TEST(OpsRope, ViewIntoFusedQkvMatchesContiguous) {
  // q as heads [0, 4) of a fused [T, 4+2+2, 32] projection output.
  Tensor qkv = random_tensor({5, 8, 32}, 8);
  Tensor q = qkv.slice(1, 0, 4);
  Tensor qc = q.contiguous();
  Tensor pos = ids_tensor({3, 4, 5, 6, 100000});
  Tensor ff = random_tensor({12}, 9, 1, 4);
  ops::RopeParams p;
  p.rot_dim = 24;
  p.theta = 500000.0f;
  p.layout = ops::RopeLayout::Adjacent;
  p.freq_factors = &ff;
  const float k_before = at(qkv, {4, 5, 7});
  ops::rope(q, pos, p);
  ops::rope(qc, pos, p);
  for (int64_t t = 0; t < 5; ++t)
    for (int64_t h = 0; h < 4; ++h)
      for (int64_t d = 0; d < 32; ++d) ASSERT_EQ(at(q, {t, h, d}), at(qc, {t, h, d}));
  EXPECT_EQ(at(qkv, {4, 5, 7}), k_before);  // k heads untouched
}

TEST(OpsRope, ArgumentErrors) {
  Tensor x = random_tensor({2, 3, 16}, 1);
  Tensor pos = ids_tensor({0, 1});
  ops::RopeParams p;
  p.rot_dim = 17;
  expect_error([&] { ops::rope(x, pos, p); }, {"ops::rope", "rot_dim = 17"});
  p.rot_dim = 18;
  expect_error([&] { ops::rope(x, pos, p); }, {"ops::rope", "rot_dim = 18"});
  p.rot_dim = 0;
  Tensor pos3 = ids_tensor({0, 1, 2});
  expect_error([&] { ops::rope(x, pos3, p); }, {"ops::rope", "positions", "[2]"});
  Tensor posf = Tensor::zeros({2}, DType::F32);
  expect_error([&] { ops::rope(x, posf, p); }, {"ops::rope", "positions", "i32"});
  Tensor ff = random_tensor({7}, 2);
  p.freq_factors = &ff;
  expect_error([&] { ops::rope(x, pos, p); }, {"ops::rope", "freq_factors", "[8]"});
  p.freq_factors = nullptr;
  p.theta = 0.0f;
  expect_error([&] { ops::rope(x, pos, p); }, {"ops::rope", "theta"});
  Tensor x2 = random_tensor({2, 48}, 1);
  p.theta = 10000.0f;
  expect_error([&] { ops::rope(x2, pos, p); }, {"ops::rope", "x", "3 dimensions"});
}

// ---- attention -------------------------------------------------------------------------------

TEST(OpsAttention, SingleKeyReturnsItsValue) {
  // One query at position 0 sees one key: softmax weight exactly 1, output exactly v[0].
  Tensor q = random_tensor({1, 4, 64}, 1);
  Tensor k = random_tensor({8, 2, 64}, 2);
  Tensor v = random_tensor({8, 2, 64}, 3);
  Tensor out = poisoned({1, 4, 64});
  ops::attention(out, q, k, v, ids_tensor({0}), {});
  for (int64_t h = 0; h < 4; ++h)
    for (int64_t d = 0; d < 64; ++d) ASSERT_EQ(at(out, {0, h, d}), at(v, {0, h / 2, d}));
}

TEST(OpsAttention, DefaultScaleAndStridedCache) {
  // k, v as views of a joint [L, 2, Hkv, D] cache buffer; default scale equals 1/sqrt(D).
  Tensor q = random_tensor({3, 6, 32}, 4);
  Tensor kv = random_tensor({10, 2, 3, 32}, 5);
  Tensor k = kv.select(1, 0), v = kv.select(1, 1);
  Tensor out = poisoned({3, 6, 32}), out2 = poisoned({3, 6, 32});
  const Tensor pos = ids_tensor({4, 5, 6});
  ops::attention(out, q, k, v, pos, {});
  ops::AttentionParams p;
  p.scale = static_cast<float>(1.0 / std::sqrt(32.0));
  Tensor kc = k.contiguous(), vc = v.contiguous();
  ops::attention(out2, q, kc, vc, pos, p);
  for (int64_t i = 0; i < out.numel(); ++i) ASSERT_EQ(out.data<float>()[i], out2.data<float>()[i]);
}

TEST(OpsAttention, ArgumentErrors) {
  Tensor q = random_tensor({3, 6, 32}, 1);
  Tensor k = random_tensor({8, 4, 32}, 2);
  Tensor v = random_tensor({8, 4, 32}, 3);
  Tensor out = poisoned({3, 6, 32});
  const Tensor pos = ids_tensor({0, 1, 2});
  expect_error([&] { ops::attention(out, q, k, v, pos, {}); },
               {"ops::attention", "6 heads", "4 KV heads"});
  Tensor k3 = random_tensor({8, 3, 32}, 2), v3 = random_tensor({8, 3, 32}, 3);
  expect_error(
      [&] {
        ops::attention(out, q, k3, v3, ids_tensor({6, 7, 8}), {});
      },
      {"ops::attention", "holds 8 positions", "position 8", "positions[2]"});
  Tensor v_bad = random_tensor({8, 3, 16}, 3);
  expect_error([&] { ops::attention(out, q, k3, v_bad, pos, {}); }, {"ops::attention", "v"});
  Tensor k_bad = random_tensor({8, 3, 16}, 3);
  expect_error([&] { ops::attention(out, q, k_bad, v_bad, pos, {}); }, {"head dims differ"});
  expect_error([&] { ops::attention(q, q, k3, v3, pos, {}); }, {"ops::attention", "overlaps"});
  expect_error(
      [&] {
        ops::attention(out, q, k3, v3, ids_tensor({-1, 0, 1}), {});
      },
      {"positions[0] = -1"});
  expect_error(
      [&] {
        ops::attention(out, q, k3, v3, ids_tensor({2, 3, 5}), {});
      },
      {"ops::attention", "consecutive", "positions[2] = 5", "expected 4"});
  expect_error(
      [&] {
        ops::attention(out, q, k3, v3, ids_tensor({0, 1}), {});
      },
      {"ops::attention", "positions", "[3]"});
  Tensor pos_f32 = random_tensor({3}, 4);
  expect_error([&] { ops::attention(out, q, k3, v3, pos_f32, {}); },
               {"ops::attention", "positions", "i32"});
  ops::AttentionParams p;
  p.window = -2;
  expect_error([&] { ops::attention(out, q, k3, v3, pos, p); }, {"window = -2"});
}

// ---- gated_act, add, scale, softmax, copy -----------------------------------------------------

TEST(OpsGatedAct, HalvesOfAFusedGateUpProjection) {
  Tensor gu = random_tensor({4, 2 * 24}, 1, -4, 4);
  Tensor gate = gu.slice(1, 0, 24), up = gu.slice(1, 24, 48);
  Tensor out = poisoned({4, 24});
  ops::gated_act(out, gate, up, ops::Activation::SiLU);
  for (int64_t t = 0; t < 4; ++t)
    for (int64_t i = 0; i < 24; ++i) {
      const double g = at(gate, {t, i});
      EXPECT_NEAR(at(out, {t, i}), g / (1 + std::exp(-g)) * at(up, {t, i}), 1e-5);
    }
  Tensor out2 = poisoned({4, 24});
  ops::gated_act(out2, gate, up, ops::Activation::GeluTanh);
  EXPECT_NE(at(out2, {0, 0}), at(out, {0, 0}));
  Tensor bad = poisoned({4, 23});
  expect_error([&] { ops::gated_act(bad, gate, up, ops::Activation::SiLU); },
               {"ops::gated_act", "out"});
  Tensor up_bad = random_tensor({4, 25}, 2);
  expect_error([&] { ops::gated_act(out, gate, up_bad, ops::Activation::SiLU); },
               {"ops::gated_act", "up"});
}

// In place over the gate half, as the decoder runs it: the same values as into a new tensor. The
// halves' spans interleave but their elements do not; columns that do meet are still refused.
TEST(OpsGatedAct, InPlaceOverTheGateHalf) {
  Tensor gu = random_tensor({5, 2 * 24}, 3, -4, 4);
  Tensor gate = gu.slice(1, 0, 24), up = gu.slice(1, 24, 48);
  Tensor want = poisoned({5, 24});
  ops::gated_act(want, gate, up, ops::Activation::GeluTanh);
  ops::gated_act(gate, gate, up, ops::Activation::GeluTanh);
  for (int64_t t = 0; t < 5; ++t)
    for (int64_t i = 0; i < 24; ++i) EXPECT_EQ(at(gate, {t, i}), at(want, {t, i})) << t << " " << i;
  Tensor shifted = gu.slice(1, 20, 44);  // columns 20..43 meet the up half's 24..47
  expect_error([&] { ops::gated_act(shifted, gate, up, ops::Activation::SiLU); },
               {"ops::gated_act", "partially overlaps"});
  Tensor next_row = gu.slice(1, 8, 32);  // columns 8..31: the gate half's and the up half's
  expect_error([&] { ops::gated_act(next_row, gate, up, ops::Activation::SiLU); },
               {"ops::gated_act", "partially overlaps"});
}

TEST(OpsElementwise, AddScaleSoftmax) {
  Tensor a = random_tensor({2, 3, 5}, 1), b = random_tensor({2, 3, 5}, 2);
  Tensor out = poisoned({2, 3, 5});
  ops::add(out, a, b);
  for (int64_t i = 0; i < 30; ++i)
    EXPECT_EQ(out.data<float>()[i], a.data<float>()[i] + b.data<float>()[i]);
  ops::add(a, a, b);  // in place
  for (int64_t i = 0; i < 30; ++i) EXPECT_EQ(a.data<float>()[i], out.data<float>()[i]);
  Tensor c = random_tensor({2, 3, 4}, 3);
  expect_error([&] { ops::add(out, a, c); }, {"ops::add", "shapes differ"});

  Tensor s = random_tensor({7}, 4);
  const float s0 = s.data<float>()[3];
  ops::scale(s, -2.0f);
  EXPECT_EQ(s.data<float>()[3], -2.0f * s0);

  Tensor x = random_tensor({3, 9}, 5, -5, 5);
  Tensor p = poisoned({3, 9});
  ops::softmax(p, x);
  for (int64_t r = 0; r < 3; ++r) {
    double sum = 0;
    for (int64_t i = 0; i < 9; ++i) sum += at(p, {r, i});
    EXPECT_NEAR(sum, 1.0, 1e-6);
  }
  Tensor pbad = poisoned({9, 3});
  expect_error([&] { ops::softmax(pbad, x); }, {"ops::softmax", "out"});
}

TEST(OpsCopy, ConvertsStridedAndCopiesBlocks) {
  Tensor src = random_tensor({4, 6}, 1, -100, 100);
  Tensor dst = Tensor::empty({6, 4}, DType::BF16);
  ops::copy(dst, src.transpose(0, 1));
  for (int64_t i = 0; i < 6; ++i)
    for (int64_t j = 0; j < 4; ++j)
      EXPECT_EQ(dst.data<uint16_t>()[i * 4 + j], float_to_bf16(at(src, {j, i})));
  Tensor back = poisoned({6, 4});
  ops::copy(back, dst);
  EXPECT_EQ(at(back, {2, 3}), bf16_to_float(float_to_bf16(at(src, {3, 2}))));

  Tensor q = weights(DType::Q4_K, 2, 256, 3);
  Tensor q2 = Tensor::empty({2, 256}, DType::Q4_K);
  ops::copy(q2, q);
  EXPECT_EQ(std::memcmp(q.data(), q2.data(), static_cast<size_t>(q.nbytes())), 0);
  Tensor f = poisoned({2, 256});
  expect_error([&] { ops::copy(f, q); }, {"ops::copy", "q4_k", "block types"});
  Tensor small = poisoned({6, 3});
  expect_error([&] { ops::copy(small, dst); }, {"ops::copy", "shapes differ"});
  Tensor i32 = Tensor::zeros({6, 4}, DType::I32);
  expect_error([&] { ops::copy(i32, dst); }, {"ops::copy", "cannot convert"});
}

}  // namespace
}  // namespace llmk
