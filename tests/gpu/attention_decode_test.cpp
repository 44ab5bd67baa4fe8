// The split-KV decode kernel (cuda::attention_decode) against a float64 reference on the host:
// fresh random bf16 q, K and V (the reference sees the same rounded values), 1 to 8 queries per
// sequence, contiguous caches and paged pools whose pages are handed out in a shuffled order and
// interleaved between sequences, batches of mixed lengths, GQA group sizes 1 to 8, head dims 64,
// 128 and 256, sliding windows, softcaps, forced splits, the log-sum-exp output. Pool rows no
// sequence owns hold NaN, and outputs are poisoned with NaN before each launch, so a read of a
// wrong row or an unwritten output fails the test. Also: the ops entry (ops::attention_paged)
// with its dispatch counters, and a captured launch replayed at new positions.
//
// Tolerance: gpu_test::kAttentionOut (ops_gpu_util.h), relative L2 <= 1e-2 and
// max abs <= 1e-2 max |ref|: the bf16 rounding of the output and of the softmax weights the
// tensor cores multiply, both relative to the outputs; the kernel accumulates in fp32.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/cuda/check.h"
#include "core/cuda/device.h"
#include "core/cuda/stream.h"
#include "core/error.h"
#include "core/half.h"
#include "core/tensor.h"
#include "kernels/cuda/attention/attention.h"
#include "ops/ops.h"
#include "ops_gpu_util.h"

namespace llmk {
namespace {

constexpr uint16_t kBf16NaN = 0x7fc0;

// One device buffer of bf16 or i32 values, freed at scope exit.
template <class T>
struct DeviceBuf {
  T* p = nullptr;
  size_t n = 0;
  explicit DeviceBuf(const std::vector<T>& host) : n(host.size()) {
    LLMK_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
    if (n) LLMK_CUDA_CHECK(cudaMemcpy(p, host.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~DeviceBuf() { cudaFree(p); }
  DeviceBuf(const DeviceBuf&) = delete;
  DeviceBuf& operator=(const DeviceBuf&) = delete;
  std::vector<T> download() const {
    std::vector<T> h(n);
    LLMK_CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
};

struct Seq {
  int n_keys;  // keys 0..n_keys-1 (the last query sits at n_keys - 1)
  int tq;      // queries
};

struct Case {
  std::vector<Seq> seqs;
  int Hq = 32, Hkv = 8, D = 128;
  int page_size = 16;  // 0: one contiguous cache per sequence (B must be 1, or cu_k used)
  int window = 0;
  float softcap = 0.0f;
  int split = 0;          // 0: the heuristic
  bool use_cu_k = false;  // key counts from cu_k instead of positions
  bool lse = false;
  bool head_major = false;  // caches laid out [Hkv][rows][D] instead of [rows][Hkv][D]
};

std::string describe(const Case& c) {
  std::string s = "seqs";
  for (const Seq& q : c.seqs)
    s += " (" + std::to_string(q.n_keys) + "," + std::to_string(q.tq) + ")";
  char buf[200];
  std::snprintf(buf, sizeof buf,
                " Hq/Hkv=%d/%d D=%d page=%d window=%d softcap=%g split=%d cu_k=%d lse=%d "
                "head_major=%d",
                c.Hq, c.Hkv, c.D, c.page_size, c.window, static_cast<double>(c.softcap), c.split,
                c.use_cu_k, c.lse, c.head_major);
  return s + buf;
}

uint16_t rand_bf16(std::mt19937& rng, float lo, float hi) {
  return float_to_bf16(std::uniform_real_distribution<float>(lo, hi)(rng));
}

void run_case(const Case& c, uint32_t seed) {
  SCOPED_TRACE(describe(c));
  std::mt19937 rng(seed);
  const int B = static_cast<int>(c.seqs.size()), Hq = c.Hq, Hkv = c.Hkv, D = c.D, G = Hq / Hkv;
  const bool paged = c.page_size > 0;
  std::vector<int32_t> cu_q(B + 1, 0), cu_k(B + 1, 0), positions;
  int max_q = 0, max_keys = 0;
  for (int b = 0; b < B; ++b) {
    cu_q[b + 1] = cu_q[b] + c.seqs[b].tq;
    cu_k[b + 1] = cu_k[b] + c.seqs[b].n_keys;
    max_q = std::max(max_q, c.seqs[b].tq);
    max_keys = std::max(max_keys, c.seqs[b].n_keys);
    for (int i = 0; i < c.seqs[b].tq; ++i) positions.push_back(c.seqs[b].n_keys - c.seqs[b].tq + i);
  }
  const int T = cu_q[B];

  // Key rows: paged, each sequence gets ceil(n_keys / page_size) + 1 pages of a shuffled pool
  // (one spare page, left NaN); contiguous, sequence b owns rows cu_k[b].. of one cache with
  // 3 NaN rows past the end.
  int pages_per_seq = 0;
  std::vector<int32_t> page_table;
  int64_t pool_rows = 0;
  if (paged) {
    pages_per_seq = (max_keys + c.page_size - 1) / c.page_size + 1;
    const int n_pages = B * pages_per_seq + 3;
    std::vector<int32_t> perm(n_pages);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    page_table.resize(static_cast<size_t>(B) * pages_per_seq);
    // Interleaved: page i of every sequence before page i + 1 of any, from the shuffled pool.
    int next = 0;
    for (int i = 0; i < pages_per_seq; ++i)
      for (int b = 0; b < B; ++b) page_table[b * pages_per_seq + i] = perm[next++];
    pool_rows = static_cast<int64_t>(n_pages) * c.page_size;
  } else {
    pool_rows = cu_k[B] + 3;
  }
  auto key_row = [&](int b, int j) -> int64_t {
    if (!paged) return cu_k[b] + j;
    return static_cast<int64_t>(page_table[b * pages_per_seq + j / c.page_size]) * c.page_size +
           j % c.page_size;
  };
  const size_t kv_n = static_cast<size_t>(pool_rows) * Hkv * D;
  // Element (row, head, 0) of a cache.
  auto at = [&](int64_t row, int hk) -> size_t {
    return static_cast<size_t>(c.head_major ? hk * pool_rows + row : row * Hkv + hk) * D;
  };
  std::vector<uint16_t> k(kv_n, kBf16NaN), v(kv_n, kBf16NaN);
  for (int b = 0; b < B; ++b) {
    for (int j = 0; j < c.seqs[b].n_keys; ++j) {
      const int64_t row = key_row(b, j);
      for (int hk = 0; hk < Hkv; ++hk) {
        for (int d = 0; d < D; ++d) {
          k[at(row, hk) + d] = rand_bf16(rng, -1.0f, 1.0f);
          v[at(row, hk) + d] = rand_bf16(rng, -1.0f, 1.0f);
        }
      }
    }
  }
  std::vector<uint16_t> q(static_cast<size_t>(T) * Hq * D);
  for (uint16_t& x : q) x = rand_bf16(rng, -2.0f, 2.0f);  // peaked enough to test the max

  DeviceBuf<uint16_t> dq(q), dk(k), dv(v), dout(std::vector<uint16_t>(q.size(), kBf16NaN));
  DeviceBuf<int32_t> dcu_q(cu_q), dcu_k(cu_k), dpos(positions),
      dpt(paged ? page_table : std::vector<int32_t>{0});
  DeviceBuf<float> dlse(std::vector<float>(static_cast<size_t>(Hq) * T, std::nanf("")));

  cuda::AttentionArgs a;
  a.out = reinterpret_cast<__nv_bfloat16*>(dout.p);
  a.out_t = static_cast<int64_t>(Hq) * D;
  a.out_h = D;
  a.q = reinterpret_cast<const __nv_bfloat16*>(dq.p);
  a.q_t = static_cast<int64_t>(Hq) * D;
  a.q_h = D;
  a.k = reinterpret_cast<const __nv_bfloat16*>(dk.p);
  a.v = reinterpret_cast<const __nv_bfloat16*>(dv.p);
  a.k_t = a.v_t = c.head_major ? D : static_cast<int64_t>(Hkv) * D;
  a.k_h = a.v_h = c.head_major ? pool_rows * D : D;
  a.T = T;
  a.Hq = Hq;
  a.Hkv = Hkv;
  a.D = D;
  a.L = pool_rows;
  a.scale = 1.0f / std::sqrt(static_cast<float>(D));
  a.window = c.window;
  a.softcap = c.softcap;
  a.B = B;
  a.cu_q = dcu_q.p;
  a.max_q_per_seq = max_q;
  a.positions = dpos.p;
  if (c.use_cu_k) a.cu_k = dcu_k.p;
  if (paged) {
    a.page_table = dpt.p;
    a.page_size = c.page_size;
    a.pages_per_seq = pages_per_seq;
  } else {
    ASSERT_TRUE(B == 1 || c.use_cu_k) << "bad case: contiguous batches need cu_k";
    if (!c.use_cu_k) a.L = max_keys;  // one sequence: its own cache
  }
  if (c.lse) a.lse = dlse.p;
  a.decode_split = c.split;
  cuda::attention_decode(a);
  LLMK_CUDA_CHECK(cudaStreamSynchronize(cuda::current_stream()));

  // float64 reference.
  const std::vector<uint16_t> out = dout.download();
  const std::vector<float> lse = dlse.download();
  gpu_test::DiffAccumulator diff;
  double lse_err = 0;
  std::vector<double> logits, acc(D);
  for (int b = 0; b < B; ++b) {
    for (int i = 0; i < c.seqs[b].tq; ++i) {
      const int t = cu_q[b] + i, p = positions[t];
      const int lo = c.window > 0 ? std::max(0, p - c.window + 1) : 0;
      for (int h = 0; h < Hq; ++h) {
        const int hk = h / G;
        logits.assign(static_cast<size_t>(p - lo + 1), 0.0);
        double mx = -INFINITY;
        for (int j = lo; j <= p; ++j) {
          const int64_t row = key_row(b, j);
          double dot = 0;
          for (int d = 0; d < D; ++d) {
            dot +=
                static_cast<double>(bf16_to_float(q[(static_cast<size_t>(t) * Hq + h) * D + d])) *
                bf16_to_float(k[at(row, hk) + d]);
          }
          double s = dot * a.scale;
          if (c.softcap > 0) s = c.softcap * std::tanh(s / c.softcap);
          logits[j - lo] = s;
          mx = std::max(mx, s);
        }
        double den = 0;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int j = lo; j <= p; ++j) {
          const double w = std::exp(logits[j - lo] - mx);
          den += w;
          const int64_t row = key_row(b, j);
          for (int d = 0; d < D; ++d) acc[d] += w * bf16_to_float(v[at(row, hk) + d]);
        }
        for (int d = 0; d < D; ++d) {
          const double ref = acc[d] / den;
          diff.add(bf16_to_float(out[(static_cast<size_t>(t) * Hq + h) * D + d]), ref);
        }
        if (c.lse) {
          const double ref_lse = mx + std::log(den);
          lse_err = std::max(lse_err, std::abs(lse[static_cast<size_t>(h) * T + t] - ref_lse) /
                                          std::max(1.0, std::abs(ref_lse)));
        }
      }
    }
  }
  const gpu_test::Diff e = diff.result();
  ASSERT_EQ(e.nonfinite, 0) << "non-finite (unwritten or NaN-reading) outputs";
  ASSERT_GT(e.max_ref, 0.0) << "reference output is all zeros: the test would pass vacuously";
  gpu_test::expect_within(e, gpu_test::kAttentionOut, "attention output");
  if (c.lse) {
    EXPECT_LE(lse_err, 1e-4) << "log-sum-exp relative error";
  }
}

// Every case under both builds of the kernel: K/V tiles by the bulk tensor copy engine (kTma,
// where the device and the cache allow it; see DecodeLoader) and by cp.async.
class AttentionDecodeGpu : public ::testing::TestWithParam<cuda::DecodeLoader> {
 protected:
  void SetUp() override {
    cuda::init();
    cuda::set_decode_loader(GetParam());
  }
  void TearDown() override { cuda::set_decode_loader(cuda::DecodeLoader::kAuto); }
};

TEST_P(AttentionDecodeGpu, LengthsAndQueryCountsPaged) {
  uint32_t seed = 1;
  for (int n : {1, 17, 127, 1000, 4099}) {
    for (int tq : {1, 3, 8}) {
      if (tq > n) continue;
      run_case({.seqs = {{n, tq}}}, seed++);
    }
  }
}

TEST_P(AttentionDecodeGpu, ContiguousCache) {
  uint32_t seed = 100;
  for (int n : {1, 17, 127, 1000, 4099}) run_case({.seqs = {{n, 1}}, .page_size = 0}, seed++);
  run_case({.seqs = {{4099, 8}}, .page_size = 0}, seed++);
  // A contiguous varlen batch: keys of sequence b are rows cu_k[b].. of one cache.
  run_case({.seqs = {{17, 1}, {1000, 4}, {1, 1}, {127, 8}}, .page_size = 0, .use_cu_k = true},
           seed++);
}

TEST_P(AttentionDecodeGpu, HeadDimsAndGroupSizes) {
  uint32_t seed = 200;
  for (int D : {64, 80, 96, 112, 128, 256}) {
    for (auto [hq, hkv] : {std::pair{8, 8}, {14, 2}, {32, 8}, {64, 8}, {8, 1}}) {
      for (int tq : {1, 5}) {
        run_case({.seqs = {{1000, tq}}, .Hq = hq, .Hkv = hkv, .D = D}, seed++);
      }
    }
  }
}

TEST_P(AttentionDecodeGpu, MixedBatchesInterleavedPages) {
  uint32_t seed = 300;
  const std::vector<Seq> seqs = {{1, 1}, {17, 2}, {127, 8}, {1000, 1}, {4099, 3}};
  // 8, 16, 32, 64 and 128: whole pages per TMA box (one box per page, 64 keys of a 128-key page).
  for (int page : {1, 7, 8, 16, 32, 64, 128}) run_case({.seqs = seqs, .page_size = page}, seed++);
  run_case({.seqs = seqs, .page_size = 16, .use_cu_k = true}, seed++);
  // Many sequences of one query (the batched decode step).
  std::vector<Seq> many;
  for (int b = 0; b < 32; ++b) many.push_back({1 + (b * 997) % 3000, 1});
  run_case({.seqs = many, .page_size = 16}, seed++);
}

TEST_P(AttentionDecodeGpu, WindowSoftcapLse) {
  uint32_t seed = 400;
  const std::vector<Seq> seqs = {{17, 1}, {1000, 8}, {4099, 2}};
  run_case({.seqs = seqs, .window = 100}, seed++);
  run_case({.seqs = seqs, .window = 1}, seed++);
  run_case({.seqs = seqs, .softcap = 5.0f}, seed++);
  run_case({.seqs = seqs, .lse = true}, seed++);
  run_case({.seqs = seqs, .Hq = 8, .Hkv = 2, .D = 256, .window = 512, .softcap = 3.0f, .lse = true},
           seed++);
  run_case({.seqs = {{4099, 1}},
            .page_size = 0,
            .window = 1000,
            .softcap = 30.0f,
            .split = 7,
            .lse = true},
           seed++);
  // Head dim 96 (Phi-3: no GQA), paged and contiguous: the TMA build's second panel is half
  // zero fill.
  run_case({.seqs = seqs, .Hq = 4, .Hkv = 4, .D = 96, .window = 300, .softcap = 30.0f, .lse = true},
           seed++);
  run_case({.seqs = {{4099, 1}, {9000, 2}},
            .Hq = 4,
            .Hkv = 4,
            .D = 96,
            .page_size = 0,
            .use_cu_k = true},
           seed++);
  // Head dims 80 and 112: the second panel a quarter and seven eighths used.
  run_case({.seqs = seqs, .Hq = 8, .Hkv = 2, .D = 80, .window = 300, .softcap = 30.0f, .lse = true},
           seed++);
  run_case({.seqs = seqs, .Hq = 4, .Hkv = 4, .D = 112, .page_size = 0, .use_cu_k = true}, seed++);
}

TEST_P(AttentionDecodeGpu, ForcedSplits) {
  uint32_t seed = 500;
  for (int split : {1, 2, 5, 33, 64}) {
    run_case({.seqs = {{4099, 1}}, .split = split}, seed++);
    run_case({.seqs = {{1, 1}, {127, 4}, {1000, 1}}, .split = split, .lse = true}, seed++);
  }
  // Splits of 8+ tiles each (the next kernel released at the first tile) beside short ones: with
  // a window, several queries per sequence, a softcap.
  run_case({.seqs = {{4099, 3}, {2500, 8}, {300, 2}}, .window = 3000, .split = 3, .lse = true},
           seed++);
  run_case({.seqs = {{9000, 1}}, .softcap = 20.0f, .split = 4}, seed++);
  run_case({.seqs = {{9000, 1}, {127, 4}}, .Hq = 8, .Hkv = 8, .D = 96, .split = 5}, seed++);
}

// Two threads, each on a stream of its own, run a split decode at once over the same keys with
// queries of their own: each stream has its own arrival counters and partials, so each gives the
// bits it gives alone (shared ones would let one launch's blocks count and combine the other's
// partials).
TEST(AttentionDecodeStreams, SplitsRunningAtOnceGiveOneStreamsBits) {
  cuda::init();
  constexpr int Hq = 8, Hkv = 2, D = 128, L = 4096;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  auto values = [&](size_t n) {
    std::vector<uint16_t> v(n);
    for (uint16_t& x : v) x = float_to_bf16(u(rng));
    return v;
  };
  const DeviceBuf<uint16_t> k(values(size_t{L} * Hkv * D)), v(values(size_t{L} * Hkv * D));
  const DeviceBuf<uint16_t> q[2] = {DeviceBuf<uint16_t>(values(size_t{Hq} * D)),
                                    DeviceBuf<uint16_t>(values(size_t{Hq} * D))};
  const DeviceBuf<int32_t> pos(std::vector<int32_t>{L - 1});
  const std::vector<uint16_t> poison(size_t{Hq} * D, kBf16NaN);
  DeviceBuf<uint16_t> outs[2] = {DeviceBuf<uint16_t>(poison), DeviceBuf<uint16_t>(poison)};
  auto args = [&](int i) {
    cuda::AttentionArgs a;
    a.out = reinterpret_cast<__nv_bfloat16*>(outs[i].p);
    a.out_t = a.q_t = int64_t{Hq} * D;
    a.out_h = a.q_h = D;
    a.q = reinterpret_cast<const __nv_bfloat16*>(q[i].p);
    a.k = reinterpret_cast<const __nv_bfloat16*>(k.p);
    a.v = reinterpret_cast<const __nv_bfloat16*>(v.p);
    a.k_t = a.v_t = int64_t{Hkv} * D;
    a.k_h = a.v_h = D;
    a.T = 1;
    a.Hq = Hq;
    a.Hkv = Hkv;
    a.D = D;
    a.L = L;
    a.scale = 1.0f / std::sqrt(static_cast<float>(D));
    a.positions = pos.p;
    a.decode_split = 16;
    return a;
  };
  std::vector<uint16_t> want[2];
  for (int i = 0; i < 2; ++i) {
    cuda::attention_decode(args(i));
    cuda::synchronize();
    want[i] = outs[i].download();
  }
  ASSERT_NE(want[0], want[1]) << "the two queries must give different outputs";
  cudaStream_t streams[2];
  for (cudaStream_t& st : streams)
    LLMK_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  auto work = [&](int i) {
    cuda::StreamGuard guard(streams[i]);
    for (int r = 0; r < 200; ++r) cuda::attention_decode(args(i));
    LLMK_CUDA_CHECK(cudaStreamSynchronize(streams[i]));
  };
  std::thread other(work, 1);
  work(0);
  other.join();
  for (int i = 0; i < 2; ++i) EXPECT_EQ(outs[i].download(), want[i]) << "stream " << i;
  for (cudaStream_t st : streams) LLMK_CUDA_CHECK(cudaStreamDestroy(st));
}

// Caches laid out head-major ([Hkv][rows][D]: the TMA build's [dim, row, head] tensor map),
// paged and contiguous, with a window.
TEST_P(AttentionDecodeGpu, HeadMajorCaches) {
  uint32_t seed = 600;
  const std::vector<Seq> seqs = {{17, 1}, {1000, 8}, {4099, 2}};
  for (int page : {7, 16, 64})
    run_case({.seqs = seqs, .page_size = page, .head_major = true}, seed++);
  run_case({.seqs = seqs, .window = 300, .head_major = true}, seed++);
  run_case({.seqs = {{4099, 3}}, .page_size = 0, .lse = true, .head_major = true}, seed++);
  run_case({.seqs = {{1, 1}, {1000, 4}, {127, 8}},
            .Hq = 8,
            .Hkv = 2,
            .D = 256,
            .page_size = 0,
            .use_cu_k = true,
            .head_major = true},
           seed++);
  run_case({.seqs = seqs, .Hq = 4, .Hkv = 4, .D = 96, .page_size = 16, .head_major = true}, seed++);
}

TEST_P(AttentionDecodeGpu, RejectsBadArguments) {
  cuda::AttentionArgs a;
  a.T = 2;
  a.Hq = 8;
  a.Hkv = 2;
  a.D = 128;
  a.B = 2;
  int32_t dummy = 0;
  a.cu_q = &dummy;
  a.positions = &dummy;
  a.max_q_per_seq = 0;  // required with cu_q
  EXPECT_THROW(cuda::attention_decode(a), Error);
  a.max_q_per_seq = 9;
  EXPECT_THROW(cuda::attention_decode(a), Error);
  a.max_q_per_seq = 1;
  a.D = 72;  // a head dim the kernel is not built for
  EXPECT_THROW(cuda::attention_decode(a), Error);
}

// ops::attention_paged on CUDA (bf16) against the CPU op (f32, same bf16-rounded values): a batch
// step over interleaved shuffled pages, then one captured launch replayed after the positions
// move on (the page table and positions are read from fixed device memory), then a 40-query
// prompt chunk of one sequence (the chunked path). Counters say which kernel ran: at a head dim
// the decode kernel is not built for (80) every call is one launch of the fallback kernel, also
// under capture.
void ops_paged_case(int64_t D, bool early_reads = false) {
  SCOPED_TRACE("head dim " + std::to_string(D) + (early_reads ? ", early reads" : ""));
  ops::AttentionParams gp;  // the GPU calls' parameters
  gp.early_reads = early_reads;
  const bool fast = cuda::attention_head_dim_supported(static_cast<int>(D));
  const int64_t Hq = 8, Hkv = 2, page = 16, B = 3, P = 40;  // up to 640 keys
  const int64_t pool_rows = (B * P + 1) * page;
  std::mt19937 rng(77);
  auto rand_tensor = [&](const Shape& shape, float lo, float hi) {
    Tensor t = Tensor::empty(shape, DType::F32);
    for (int64_t i = 0; i < t.numel(); ++i)
      t.data<float>()[i] = bf16_to_float(rand_bf16(rng, lo, hi));
    return t;
  };
  auto to_bf16_device = [](const Tensor& f) {
    Tensor h = Tensor::empty(f.shape(), DType::BF16);
    for (int64_t i = 0; i < f.numel(); ++i)
      h.data<uint16_t>()[i] = float_to_bf16(f.data<float>()[i]);
    return h.to(Device::CUDA);
  };
  auto i32 = [](std::vector<int32_t> v, Shape shape) {
    Tensor t = Tensor::empty(shape, DType::I32);
    std::copy(v.begin(), v.end(), t.data<int32_t>());
    return t;
  };
  std::vector<int32_t> perm(static_cast<size_t>(B * P + 1));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  perm.resize(static_cast<size_t>(B * P));
  const Tensor k_pool = rand_tensor({pool_rows, Hkv, D}, -1, 1),
               v_pool = rand_tensor({pool_rows, Hkv, D}, -1, 1);
  const Tensor table = i32(perm, {B, P});
  const Tensor dk = to_bf16_device(k_pool), dv = to_bf16_device(v_pool),
               dtable = table.to(Device::CUDA);

  auto compare = [&](const Tensor& q, const Tensor& cu_q, const Tensor& pos, int64_t max_q,
                     const Tensor& gpu_out, const Tensor& tbl) {
    Tensor ref = Tensor::empty(q.shape(), DType::F32);
    ops::attention_paged(ref, q, k_pool, v_pool, tbl, page, cu_q, pos, max_q, {});
    const gpu_test::Diff e = gpu_test::compare(gpu_out.to(Device::CPU), ref);
    ASSERT_EQ(e.nonfinite, 0) << "non-finite outputs, the first at element " << e.first_nonfinite;
    gpu_test::expect_within(e, gpu_test::kAttentionOut, "ops::attention_paged output");
  };

  // A batched decode step: one query per sequence.
  const Tensor q = rand_tensor({B, Hq, D}, -2, 2), dq = to_bf16_device(q);
  const Tensor cu = i32({0, 1, 2, 3}, {B + 1}), dcu = cu.to(Device::CUDA);
  Tensor pos = i32({5, 600, 130}, {B});
  Tensor dpos = pos.to(Device::CUDA);
  Tensor out = Tensor::empty({B, Hq, D}, DType::BF16, Device::CUDA);
  LLMK_CUDA_CHECK(cudaMemsetAsync(out.data(), 0xff, out.nbytes(), cuda::current_stream()));
  ops::reset_attention_stats();
  ops::attention_paged(out, dq, dk, dv, dtable, page, dcu, dpos, 1, gp);
  EXPECT_EQ(fast ? ops::attention_stats().decode : ops::attention_stats().fallback, 1u);
  compare(q, cu, pos, 1, out, table);

  // Captured once, replayed at new positions written into the same device memory.
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  const cudaStream_t stream = cuda::current_stream();
  LLMK_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  ops::attention_paged(out, dq, dk, dv, dtable, page, dcu, dpos, 1, gp);
  LLMK_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  LLMK_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (const std::vector<int32_t>& p : {std::vector<int32_t>{6, 601, 131}, {639, 0, 400}}) {
    pos = i32(p, {B});
    LLMK_CUDA_CHECK(
        cudaMemcpyAsync(dpos.data(), pos.data(), pos.nbytes(), cudaMemcpyHostToDevice, stream));
    LLMK_CUDA_CHECK(cudaMemsetAsync(out.data(), 0xff, out.nbytes(), stream));
    LLMK_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    LLMK_CUDA_CHECK(cudaStreamSynchronize(stream));
    compare(q, cu, pos, 1, out, table);
  }
  LLMK_CUDA_CHECK(cudaGraphExecDestroy(exec));
  LLMK_CUDA_CHECK(cudaGraphDestroy(graph));

  // One sequence, 40 queries at positions 300..339: chunks of 8 through the decode kernel.
  const int64_t T = 40;
  const Tensor q2 = rand_tensor({T, Hq, D}, -2, 2), dq2 = to_bf16_device(q2);
  std::vector<int32_t> p2(T);
  std::iota(p2.begin(), p2.end(), 300);
  const Tensor pos2 = i32(p2, {T}), dpos2 = pos2.to(Device::CUDA);
  const Tensor cu2 = i32({0, static_cast<int32_t>(T)}, {2}), dcu2 = cu2.to(Device::CUDA);
  Tensor out2 = Tensor::empty({T, Hq, D}, DType::BF16, Device::CUDA);
  LLMK_CUDA_CHECK(cudaMemsetAsync(out2.data(), 0xff, out2.nbytes(), stream));
  const Tensor row1 = table.slice(0, 1, 2).contiguous(), drow1 = row1.to(Device::CUDA);
  ops::attention_paged(out2, dq2, dk, dv, drow1, page, dcu2, dpos2, T, gp);
  EXPECT_EQ(fast ? ops::attention_stats().chunked : ops::attention_stats().fallback,
            fast ? 1u : 3u);  // fallback: the step, the capture, this call
  compare(q2, cu2, pos2, T, out2, row1);
}

TEST_P(AttentionDecodeGpu, OpsPagedMatchesCpuAndReplays) { ops_paged_case(128); }
TEST_P(AttentionDecodeGpu, OpsPagedHeadDim96MatchesCpuAndReplays) { ops_paged_case(96); }
TEST_P(AttentionDecodeGpu, OpsPagedHeadDim80MatchesCpuAndReplays) { ops_paged_case(80); }
TEST_P(AttentionDecodeGpu, OpsPagedFallbackHeadDimMatchesCpuAndReplays) { ops_paged_case(72); }
// The indices and the older keys read before the wait for the previous kernel (the memset and
// copies before each call are not kernels that write them): same results.
TEST_P(AttentionDecodeGpu, OpsPagedEarlyReadsMatchesCpuAndReplays) { ops_paged_case(128, true); }

// Which build the cases above ran: TMA for the caches it takes on an sm_90 device under kTma,
// never under kCpAsync (so a TMA path that silently fell back would show here); and kAuto's
// choice, TMA only when the grid has more blocks than the device has SMs and the head dim is a
// multiple of 64.
TEST_P(AttentionDecodeGpu, LoaderChoice) {
  cuda::AttentionArgs a;
  a.T = 1;
  a.Hq = 32;
  a.Hkv = 8;
  a.D = 128;
  a.L = 1 << 20;
  a.k_t = a.v_t = 8 * 128;
  a.k_h = a.v_h = 128;
  int32_t dummy = 0;
  a.positions = &dummy;
  a.page_table = &dummy;
  const bool hopper = cuda::device_info().cc_major >= 9;
  const bool tma = GetParam() == cuda::DecodeLoader::kTma;
  for (int page : {8, 16, 32, 64, 128, 256}) {
    a.page_size = page;
    a.pages_per_seq = 4096 / page;
    EXPECT_EQ(cuda::attention_decode_uses_tma(a), hopper && tma) << "page " << page;
  }
  for (int page : {1, 7, 24, 96}) {
    a.page_size = page;
    a.pages_per_seq = 4096 / page;
    EXPECT_FALSE(cuda::attention_decode_uses_tma(a)) << "page " << page;
  }
  a.page_table = nullptr;  // contiguous
  EXPECT_EQ(cuda::attention_decode_uses_tma(a), hopper && tma);
  a.k_t = a.v_t = 128;  // head-major ([Hkv][rows][D], HeadMajorCaches): the [dim, row, head] map
  a.k_h = a.v_h = a.L * 128;
  EXPECT_EQ(cuda::attention_decode_uses_tma(a), hopper && tma);
  a.k_t = a.v_t = 8 * 128;
  a.k_h = a.v_h = 64;  // heads overlapping: no nested tensor-map strides
  EXPECT_FALSE(cuda::attention_decode_uses_tma(a));
  a.k_h = a.v_h = 128;

  // kAuto at contexts 1k to 64k: TMA exactly when kTma's grid (8 KV heads x split) outnumbers
  // the SMs.
  a.page_table = &dummy;
  a.page_size = 16;
  int auto_tma = 0;
  for (int len : {1024, 4096, 8192, 32768, 65536}) {
    a.pages_per_seq = len / 16;
    cuda::set_decode_loader(cuda::DecodeLoader::kTma);
    const int64_t blocks = int64_t{8} * cuda::attention_decode_split(a);
    cuda::set_decode_loader(cuda::DecodeLoader::kAuto);
    const bool want = hopper && blocks > cuda::device_info().sm_count;
    EXPECT_EQ(cuda::attention_decode_uses_tma(a), want) << "context " << len;
    auto_tma += want;
  }
  if (hopper) {
    EXPECT_GT(auto_tma, 0) << "kAuto never chose TMA";
  }
  // Head dim 96 (Phi-3, 32 KV heads): kTma takes it, kAuto never (its half-filled panels lose to
  // cp.async), however many blocks the grid has.
  a.Hkv = 32;
  a.D = 96;
  a.k_t = a.v_t = 32 * 96;
  a.k_h = a.v_h = 96;
  a.pages_per_seq = 32768 / 16;
  cuda::set_decode_loader(cuda::DecodeLoader::kTma);
  EXPECT_EQ(cuda::attention_decode_uses_tma(a), hopper);
  cuda::set_decode_loader(cuda::DecodeLoader::kAuto);
  EXPECT_FALSE(cuda::attention_decode_uses_tma(a));
  cuda::set_decode_loader(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Loaders, AttentionDecodeGpu,
                         ::testing::Values(cuda::DecodeLoader::kTma, cuda::DecodeLoader::kCpAsync),
                         [](const ::testing::TestParamInfo<cuda::DecodeLoader>& p) {
                           return std::string(p.param == cuda::DecodeLoader::kTma ? "Tma"
                                                                                  : "CpAsync");
                         });

}  // namespace
}  // namespace llmk
