// ops::attention_paged on the CPU: a batch of sequences whose keys live in pages handed out in a
// shuffled order, interleaved between sequences, against ops::attention on each sequence's keys
// copied into a contiguous cache (the same CPU kernel sees the same values: exact agreement up to
// summation order is not assumed; 1e-5 absolute). Pool rows no sequence owns hold NaN, outputs
// are poisoned first. Also the dispatch counters and the one-line argument errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "ops/ops.h"
#include "ops_test_util.h"

namespace llmk {
namespace {

using test::expect_error;
using test::poisoned;
using test::random_tensor;

struct Seq {
  int n_keys, tq;
};

void check_paged(const std::vector<Seq>& seqs, int64_t page_size, const ops::AttentionParams& p,
                 uint32_t seed) {
  const int64_t Hq = 6, Hkv = 2, D = 16, B = static_cast<int64_t>(seqs.size());
  int64_t T = 0, max_keys = 0, max_q = 0;
  for (const Seq& s : seqs) {
    T += s.tq;
    max_keys = std::max<int64_t>(max_keys, s.n_keys);
    max_q = std::max<int64_t>(max_q, s.tq);
  }
  const int64_t P = (max_keys + page_size - 1) / page_size + 1;
  const int64_t n_pages = B * P + 2;
  std::vector<int32_t> perm(static_cast<size_t>(n_pages));
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937 rng(seed);
  std::shuffle(perm.begin(), perm.end(), rng);
  Tensor table = Tensor::empty({B, P}, DType::I32);
  int next = 0;
  for (int64_t i = 0; i < P; ++i)
    for (int64_t b = 0; b < B; ++b) table.data<int32_t>()[b * P + i] = perm[next++];

  Tensor k_pool = poisoned({n_pages * page_size, Hkv, D});
  Tensor v_pool = poisoned({n_pages * page_size, Hkv, D});
  std::fill(k_pool.data<float>(), k_pool.data<float>() + k_pool.numel(), std::nanf(""));
  std::fill(v_pool.data<float>(), v_pool.data<float>() + v_pool.numel(), std::nanf(""));
  Tensor q = random_tensor({T, Hq, D}, seed + 1, -2.0f, 2.0f);
  Tensor cu_q = Tensor::empty({B + 1}, DType::I32), positions = Tensor::empty({T}, DType::I32);
  cu_q.data<int32_t>()[0] = 0;
  std::vector<Tensor> k_seq, v_seq;
  int64_t row = 0;
  for (int64_t b = 0; b < B; ++b) {
    const Seq& s = seqs[static_cast<size_t>(b)];
    k_seq.push_back(random_tensor({s.n_keys, Hkv, D}, seed + 10 + static_cast<uint32_t>(b)));
    v_seq.push_back(random_tensor({s.n_keys, Hkv, D}, seed + 50 + static_cast<uint32_t>(b)));
    for (int64_t j = 0; j < s.n_keys; ++j) {
      const int64_t r = table.data<int32_t>()[b * P + j / page_size] * page_size + j % page_size;
      std::copy_n(k_seq.back().data<float>() + j * Hkv * D, Hkv * D,
                  k_pool.data<float>() + r * Hkv * D);
      std::copy_n(v_seq.back().data<float>() + j * Hkv * D, Hkv * D,
                  v_pool.data<float>() + r * Hkv * D);
    }
    for (int i = 0; i < s.tq; ++i) positions.data<int32_t>()[row + i] = s.n_keys - s.tq + i;
    row += s.tq;
    cu_q.data<int32_t>()[b + 1] = static_cast<int32_t>(row);
  }

  Tensor out = poisoned({T, Hq, D});
  ops::reset_attention_stats();
  ops::attention_paged(out, q, k_pool, v_pool, table, page_size, cu_q, positions, max_q, p);
  EXPECT_EQ(ops::attention_stats().cpu, 1u);

  row = 0;
  for (int64_t b = 0; b < B; ++b) {
    const Seq& s = seqs[static_cast<size_t>(b)];
    Tensor ref = poisoned({s.tq, Hq, D});
    ops::attention(ref, q.slice(0, row, row + s.tq), k_seq[static_cast<size_t>(b)],
                   v_seq[static_cast<size_t>(b)], positions.slice(0, row, row + s.tq), p);
    for (int64_t e = 0; e < ref.numel(); ++e) {
      const float got = out.data<float>()[row * Hq * D + e];
      ASSERT_TRUE(std::isfinite(got)) << "sequence " << b << " element " << e;
      ASSERT_NEAR(got, ref.data<float>()[e], 1e-5f) << "sequence " << b << " element " << e;
    }
    row += s.tq;
  }
}

TEST(OpsAttentionPaged, MixedBatchShuffledPages) {
  const std::vector<Seq> seqs = {{1, 1}, {17, 3}, {127, 8}, {1000, 1}, {40, 12}};
  uint32_t seed = 1;
  for (int64_t page : {1, 7, 16, 256}) check_paged(seqs, page, {}, seed++);
  check_paged(seqs, 16, {.window = 9}, seed++);
  check_paged(seqs, 16, {.softcap = 4.0f}, seed++);
  check_paged(seqs, 5, {.scale = 0.3f, .window = 30, .softcap = 2.0f}, seed++);
}

TEST(OpsAttentionPaged, ArgumentErrors) {
  Tensor q = random_tensor({2, 4, 8}, 1), out = poisoned({2, 4, 8});
  Tensor pool = random_tensor({32, 2, 8}, 2);
  Tensor table = test::i32_tensor({0, 1});  // [2] instead of [1, 2]
  Tensor cu_q = test::i32_tensor({0, 2}), pos = test::i32_tensor({3, 4});
  expect_error([&] { ops::attention_paged(out, q, pool, pool, table, 16, cu_q, pos, 2, {}); },
               {"attention_paged", "page_table"});
  Tensor table2 = table.view({1, 2});
  expect_error([&] { ops::attention_paged(out, q, pool, pool, table2, 5, cu_q, pos, 2, {}); },
               {"attention_paged", "page_size"});
  expect_error([&] { ops::attention_paged(out, q, pool, pool, table2, 16, cu_q, pos, 1, {}); },
               {"attention_paged", "max_q_per_seq"});
  Tensor bad_table = test::i32_tensor({0, 9}).view({1, 2});
  Tensor far = test::i32_tensor({20, 21});
  expect_error([&] { ops::attention_paged(out, q, pool, pool, bad_table, 16, cu_q, far, 2, {}); },
               {"attention_paged", "page_table[0, 1] = 9"});
  Tensor too_far = test::i32_tensor({31, 32});
  expect_error([&] { ops::attention_paged(out, q, pool, pool, table2, 16, cu_q, too_far, 2, {}); },
               {"position"});
}

}  // namespace
}  // namespace llmk
