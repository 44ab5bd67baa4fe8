// 8-bit KV caches on the CPU (kernels/kv_quant.h): kv_append encodes each head row with its
// scale and touches no other row, kv_gather decodes, and attention_paged over 8-bit pools is
// attention_paged over the decoded float pools.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/kv_quant.h"
#include "ops/ops.h"
#include "ops_test_util.h"

namespace llmk {
namespace {

using test::expect_error;
using test::i32_tensor;
using test::poisoned;
using test::random_tensor;

struct Pool {
  Tensor k, v;
  ops::KvScales scales;
};

Pool make_pool(int64_t L, int64_t H, int64_t D, DType dt) {
  Pool p{Tensor::empty({L, H, D}, dt),
         Tensor::empty({L, H, D}, dt),
         {Tensor::empty({L, H}, DType::F32), Tensor::empty({L, H}, DType::F32)}};
  std::memset(p.k.data(), 0x55, static_cast<size_t>(p.k.nbytes()));
  std::memset(p.v.data(), 0x55, static_cast<size_t>(p.v.nbytes()));
  std::fill_n(p.scales.k.data<float>(), L * H, -1.0f);
  std::fill_n(p.scales.v.data<float>(), L * H, -1.0f);
  return p;
}

// Half a step of the format at |x| for a head row of scale s (kv_quant_test.cpp's bound).
float half_step(DType dt, float x, float s) {
  return 0.5f * 1.0001f * (dt == DType::I8 ? s : std::max(std::fabs(x) / 8.0f, s / 512.0f));
}

class OpsKv8bit : public ::testing::TestWithParam<DType> {};

TEST_P(OpsKv8bit, AppendEncodesEachHeadRowAndGatherDecodesIt) {
  const DType dt = GetParam();
  const int64_t L = 12, H = 3, D = 20, T = 5;
  Pool p = make_pool(L, H, D, dt);
  const Tensor k = random_tensor({T, H, D}, 1, -3.0f, 3.0f);
  const Tensor v = random_tensor({T, H, D}, 2, -0.01f, 0.01f);
  const Tensor pos = i32_tensor({7, 0, 11, 3, 4});
  ops::kv_append(p.k, p.v, k, v, pos, &p.scales);
  for (int64_t r = 0; r < L; ++r) {  // rows not written keep their bytes and scales
    if (r == 7 || r == 0 || r == 11 || r == 3 || r == 4) continue;
    for (int64_t i = 0; i < H * D; ++i) {
      ASSERT_EQ(static_cast<const uint8_t*>(p.k.data())[r * H * D + i], 0x55);
    }
    ASSERT_EQ(p.scales.k.data<float>()[r * H], -1.0f);
  }
  Tensor gk = poisoned({T, H, D}), gv = poisoned({T, H, D});
  ops::kv_gather(gk, gv, p.k, p.v, pos, &p.scales);
  for (const auto& [src, got, sc] : {std::tuple{&k, &gk, &p.scales.k}, {&v, &gv, &p.scales.v}}) {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < H; ++h) {
        const float* x = src->data<float>() + (t * H + h) * D;
        const float* y = got->data<float>() + (t * H + h) * D;
        const float s = sc->data<float>()[pos.data<int32_t>()[t] * H + h];
        float absmax = 0;
        for (int64_t i = 0; i < D; ++i) absmax = std::max(absmax, std::fabs(x[i]));
        EXPECT_FLOAT_EQ(s * (dt == DType::I8 ? 127.0f : 448.0f), absmax);
        for (int64_t i = 0; i < D; ++i) {
          EXPECT_LE(std::fabs(y[i] - x[i]), half_step(dt, x[i], s)) << t << " " << h << " " << i;
        }
      }
    }
  }
}

TEST_P(OpsKv8bit, PagedAttentionIsAttentionOverTheDecodedPools) {
  const DType dt = GetParam();
  const int64_t Hq = 6, Hkv = 2, D = 24, page = 4, pages = 10, L = pages * page;
  Pool p = make_pool(L, Hkv, D, dt);
  std::vector<int32_t> all(static_cast<size_t>(L));
  std::iota(all.begin(), all.end(), 0);
  const Tensor rows = Tensor::borrow(all.data(), {L}, DType::I32);
  ops::kv_append(p.k, p.v, random_tensor({L, Hkv, D}, 3, -2.0f, 2.0f),
                 random_tensor({L, Hkv, D}, 4, -2.0f, 2.0f), rows, &p.scales);
  Tensor fk = Tensor::empty({L, Hkv, D}, DType::F32), fv = Tensor::empty({L, Hkv, D}, DType::F32);
  ops::kv_gather(fk, fv, p.k, p.v, rows, &p.scales);
  // Two sequences: 13 keys with 3 queries, 6 keys with 1, in shuffled pages.
  const Tensor table = Tensor::empty({2, 4}, DType::I32);
  const int32_t order[8] = {7, 2, 9, 0, 5, 3, 8, 1};
  std::copy_n(order, 8, table.data<int32_t>());
  const Tensor cu = i32_tensor({0, 3, 4}), positions = i32_tensor({10, 11, 12, 5});
  const Tensor q = random_tensor({4, Hq, D}, 5);
  for (const int window : {0, 3}) {
    ops::AttentionParams ap{.window = window, .softcap = window ? 20.0f : 0.0f};
    Tensor want = poisoned({4, Hq, D}), got = poisoned({4, Hq, D});
    ops::attention_paged(want, q, fk, fv, table, page, cu, positions, 3, ap);
    ap.kv_scales = &p.scales;
    ops::attention_paged(got, q, p.k, p.v, table, page, cu, positions, 3, ap);
    for (int64_t i = 0; i < want.numel(); ++i) {
      ASSERT_NEAR(got.data<float>()[i], want.data<float>()[i], 1e-6f) << i;
    }
  }
}

TEST_P(OpsKv8bit, ArgumentErrors) {
  const DType dt = GetParam();
  Pool p = make_pool(8, 2, 16, dt);
  const Tensor k = random_tensor({1, 2, 16}, 1), v = random_tensor({1, 2, 16}, 2);
  const Tensor pos = i32_tensor({3});
  expect_error([&] { ops::kv_append(p.k, p.v, k, v, pos); }, {"8-bit caches need their scales"});
  ops::KvScales bad{Tensor::empty({8, 3}, DType::F32), p.scales.v};
  expect_error([&] { ops::kv_append(p.k, p.v, k, v, pos, &bad); }, {"scales.k"});
  Tensor fk = Tensor::empty({8, 2, 16}, DType::F32), fv = Tensor::empty({8, 2, 16}, DType::F32);
  expect_error([&] { ops::kv_append(fk, fv, k, v, pos, &p.scales); },
               {"must both be f8e4m3 or both i8"});
  Pool wide = make_pool(2, 1, 258, dt);
  expect_error(
      [&] {
        ops::kv_append(wide.k, wide.v, random_tensor({1, 1, 258}, 1), random_tensor({1, 1, 258}, 2),
                       pos.slice(0, 0, 1), &wide.scales);
      },
      {"head dims up to 256"});
  Tensor gk = Tensor::empty({1, 2, 16}, DType::F32), gv = Tensor::empty({1, 2, 16}, DType::F32);
  expect_error([&] { ops::kv_gather(gk, gv, p.k, p.v, i32_tensor({8}), &p.scales); },
               {"outside the pool of 8 rows"});
}

INSTANTIATE_TEST_SUITE_P(Formats, OpsKv8bit, ::testing::Values(DType::F8E4M3, DType::I8),
                         [](const auto& i) { return std::string(dtype_name(i.param)); });

}  // namespace
}  // namespace llmk
