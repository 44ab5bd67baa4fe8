// ops::kv_append on the CPU: rows land at their positions (in any order, in strided caches),
// every other cache row keeps its contents, and bad positions and shapes are errors. Also
// ops::rope_kv_append (RoPE, then the append of the rotated keys), and ops::linear_gated (linear,
// then gated_act), the decoder's fused steps, on the CPU.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ops/ops.h"
#include "ops/ops_test_util.h"

namespace llmk {
namespace {

using test::elem;
using test::expect_error;
using test::i32_tensor;
using test::random_tensor;

TEST(OpsKvAppend, WritesRowsAtTheirPositionsOnly) {
  for (int64_t D : {1, 3, 17, 64}) {
    const int64_t L = 11, H = 3;
    // k_cache and v_cache interleaved in one [L, 2, H, D] buffer; k, v heads of a fused
    // [T, 3 * H, D] projection.
    Tensor kv = random_tensor({L, 2, H, D}, 1);
    const Tensor kv0 = kv.contiguous();
    Tensor k_cache = kv.select(1, 0), v_cache = kv.select(1, 1);
    Tensor qkv = random_tensor({3, 3 * H, D}, 2);
    Tensor k = qkv.slice(1, H, 2 * H), v = qkv.slice(1, 2 * H, 3 * H);
    Tensor pos = i32_tensor({7, 0, 10});
    ops::kv_append(k_cache, v_cache, k, v, pos);
    for (int64_t l = 0; l < L; ++l) {
      const int64_t t = l == 7 ? 0 : l == 0 ? 1 : l == 10 ? 2 : -1;
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t d = 0; d < D; ++d) {
          if (t < 0) {
            ASSERT_EQ(elem(k_cache, {l, h, d}), elem(kv0, {l, 0, h, d})) << "row " << l;
            ASSERT_EQ(elem(v_cache, {l, h, d}), elem(kv0, {l, 1, h, d})) << "row " << l;
          } else {
            ASSERT_EQ(elem(k_cache, {l, h, d}), elem(k, {t, h, d})) << "row " << l;
            ASSERT_EQ(elem(v_cache, {l, h, d}), elem(v, {t, h, d})) << "row " << l;
          }
        }
      }
    }
  }
}

TEST(OpsKvAppend, EmptyStepWritesNothing) {
  Tensor kc = random_tensor({4, 2, 8}, 1), vc = random_tensor({4, 2, 8}, 2);
  const Tensor kc0 = kc.contiguous();
  Tensor k = random_tensor({0, 2, 8}, 3), v = random_tensor({0, 2, 8}, 4);
  Tensor pos = Tensor::empty({0}, DType::I32);
  ops::kv_append(kc, vc, k, v, pos);
  for (int64_t i = 0; i < kc.numel(); ++i) EXPECT_EQ(kc.data<float>()[i], kc0.data<float>()[i]);
}

TEST(OpsKvAppend, ArgumentErrors) {
  Tensor kc = random_tensor({12, 2, 8}, 1), vc = random_tensor({12, 2, 8}, 2);
  Tensor k = random_tensor({2, 2, 8}, 3), v = random_tensor({2, 2, 8}, 4);
  Tensor pos = i32_tensor({3, 12});
  expect_error([&] { ops::kv_append(kc, vc, k, v, pos); },
               {"ops::kv_append", "positions[1] = 12", "12 rows"});
  Tensor neg = i32_tensor({-1, 0});
  expect_error([&] { ops::kv_append(kc, vc, k, v, neg); }, {"positions[0] = -1"});
  Tensor ok = i32_tensor({0, 1});
  Tensor k_bad = random_tensor({2, 3, 8}, 3);
  expect_error([&] { ops::kv_append(kc, vc, k_bad, v, ok); }, {"ops::kv_append", "k", "[2, 2, 8]"});
  Tensor vc_bad = random_tensor({12, 2, 4}, 2);
  expect_error([&] { ops::kv_append(kc, vc_bad, k, v, ok); }, {"ops::kv_append", "v_cache"});
  Tensor pos3 = i32_tensor({0, 1, 2});
  expect_error([&] { ops::kv_append(kc, vc, k, v, pos3); }, {"ops::kv_append", "positions", "[2]"});
  Tensor posf = Tensor::zeros({2}, DType::F32);
  expect_error([&] { ops::kv_append(kc, vc, k, v, posf); }, {"ops::kv_append", "positions", "i32"});
  Tensor k16 = Tensor::zeros({2, 2, 8}, DType::BF16);
  expect_error([&] { ops::kv_append(kc, vc, k16, v, ok); }, {"ops::kv_append", "k", "f32"});
  expect_error([&] { ops::kv_append(kc, kc, k, v, ok); }, {"ops::kv_append", "same address"});
  Tensor kc_in = kc.slice(0, 0, 2);
  expect_error([&] { ops::kv_append(kc, vc, kc_in, v, ok); }, {"ops::kv_append", "overlaps"});
  Tensor k2 = random_tensor({2, 16}, 3);
  expect_error([&] { ops::kv_append(kc, vc, k2, v, ok); }, {"ops::kv_append", "3 dimensions"});
}

// rope_kv_append on the CPU is rope then kv_append of the last Hkv heads, bit for bit; cache rows
// (not positions) name where the keys land.
TEST(OpsRopeKvAppend, IsRopeThenAppend) {
  const int64_t T = 3, H = 5, Hkv = 2, D = 8, L = 9;
  const Tensor qkv = random_tensor({T, H + Hkv, D}, 3);
  const Tensor kc0 = random_tensor({L, Hkv, D}, 4), vc0 = random_tensor({L, Hkv, D}, 5);
  const Tensor pos = i32_tensor({40, 41, 42}), rows = i32_tensor({8, 2, 5});
  ops::RopeParams p;
  p.theta = 1000.0f;
  Tensor a = qkv.contiguous(), kc = kc0.contiguous(), vc = vc0.contiguous();
  Tensor qk = a.slice(1, 0, H);
  ops::rope_kv_append(qk, pos, p, kc, vc, a.slice(1, H, H + Hkv), rows);
  Tensor b = qkv.contiguous(), kc_ref = kc0.contiguous(), vc_ref = vc0.contiguous();
  Tensor qk_ref = b.slice(1, 0, H);
  ops::rope(qk_ref, pos, p);
  ops::kv_append(kc_ref, vc_ref, qk_ref.slice(1, H - Hkv, H), b.slice(1, H, H + Hkv), rows);
  for (const auto& [got, want] : {std::pair{&a, &b}, {&kc, &kc_ref}, {&vc, &vc_ref}}) {
    for (int64_t i = 0; i < got->numel(); ++i) {
      ASSERT_EQ(got->data<float>()[i], want->data<float>()[i]) << i;
    }
  }
  Tensor kc_wide = random_tensor({L, H + 1, D}, 6), vc_wide = random_tensor({L, H + 1, D}, 7);
  expect_error([&] { ops::rope_kv_append(qk, pos, p, kc_wide, vc_wide, a, rows); },
               {"ops::rope_kv_append", "k_cache has 6 heads but qk only 5"});
  const Tensor far = i32_tensor({8, 9, 0});
  expect_error([&] { ops::rope_kv_append(qk, pos, p, kc, vc, a.slice(1, H, H + Hkv), far); },
               {"ops::rope_kv_append", "positions[1] = 9", "9 rows"});
}

// linear_rope_kv_append on the CPU is linear, then rope_kv_append on the projection's heads.
TEST(OpsLinearRopeKvAppend, IsLinearThenRopeKvAppend) {
  const int64_t Hq = 3, Hkv = 1, D = 4, K = 6, L = 5;
  const Tensor x = random_tensor({2, K}, 12), w = random_tensor({(Hq + 2 * Hkv) * D, K}, 13);
  const Tensor kc0 = random_tensor({L, Hkv, D}, 14), vc0 = random_tensor({L, Hkv, D}, 15);
  const Tensor pos = i32_tensor({7, 8}), rows = i32_tensor({4, 1});
  const ops::RopeParams p;
  Tensor qkv = Tensor::empty({2, (Hq + 2 * Hkv) * D}, DType::F32);
  Tensor kc = kc0.contiguous(), vc = vc0.contiguous();
  ops::linear_rope_kv_append(qkv, x, w, nullptr, Hq, pos, p, kc, vc, rows);
  Tensor ref = Tensor::empty({2, (Hq + 2 * Hkv) * D}, DType::F32);
  Tensor kc_ref = kc0.contiguous(), vc_ref = vc0.contiguous();
  ops::linear(ref, x, w);
  Tensor qk = ref.slice(1, 0, (Hq + Hkv) * D).unflatten(1, {Hq + Hkv, D});
  ops::rope_kv_append(qk, pos, p, kc_ref, vc_ref,
                      ref.slice(1, (Hq + Hkv) * D, (Hq + 2 * Hkv) * D).unflatten(1, {Hkv, D}),
                      rows);
  for (const auto& [got, want] : {std::pair{&qkv, &ref}, {&kc, &kc_ref}, {&vc, &vc_ref}}) {
    for (int64_t i = 0; i < got->numel(); ++i) {
      ASSERT_EQ(got->data<float>()[i], want->data<float>()[i]) << i;
    }
  }
  expect_error(
      [&] { ops::linear_rope_kv_append(qkv, x, w, nullptr, Hq + 1, pos, p, kc, vc, rows); },
      {"ops::linear_rope_kv_append", "4 query heads", "24 columns"});
}

TEST(OpsLinearGated, IsLinearThenGatedAct) {
  const int64_t M = 2, F = 3, K = 5;
  const Tensor x = random_tensor({M, K}, 8), w = random_tensor({2 * F, K}, 9);
  const Tensor b = random_tensor({2 * F}, 10);
  Tensor out = Tensor::empty({M, F}, DType::F32), scratch = Tensor::empty({M, 2 * F}, DType::F32);
  ops::linear_gated(out, x, w, ops::Activation::GeluTanh, scratch, &b);
  Tensor lin = Tensor::empty({M, 2 * F}, DType::F32), ref = Tensor::empty({M, F}, DType::F32);
  ops::linear(lin, x, w, &b);
  ops::gated_act(ref, lin.slice(1, 0, F), lin.slice(1, F, 2 * F), ops::Activation::GeluTanh);
  for (int64_t i = 0; i < M * F; ++i) ASSERT_EQ(out.data<float>()[i], ref.data<float>()[i]) << i;
  const Tensor w_odd = random_tensor({2 * F + 1, K}, 11);
  expect_error([&] { ops::linear_gated(out, x, w_odd, ops::Activation::SiLU, scratch); },
               {"ops::linear_gated", "even rows"});
  Tensor out_bad = Tensor::empty({M, 2 * F}, DType::F32);
  expect_error([&] { ops::linear_gated(out_bad, x, w, ops::Activation::SiLU, scratch); },
               {"ops::linear_gated", "out"});
}

}  // namespace
}  // namespace llmk
