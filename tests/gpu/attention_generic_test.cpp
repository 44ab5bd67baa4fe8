// The fallback attention kernel (cuda::attention_generic) against a float64 reference written
// here from AttentionArgs' contract: head dims the tensor-core kernels are not built for (16, 72)
// and ones they are (96, 128), bf16 and fp16, GQA, single sequences at a position, varlen batches
// with bottom-right causal masks, pages filled out of order, sliding window, softcap and LSE.
// Inputs are fresh random values rounded to the element type before the reference sees them;
// outputs and LSE are poisoned (NaN) before the launch; cache rows no query may see hold NaN.
//
// Tolerance: outputs are computed in fp32 and rounded once, to bf16 (at most 2^-8 of the value)
// or fp16 (2^-11): rel L2 <= 4e-3 (bf16) / 1e-3 (fp16), max abs <= 8e-3 (bf16) / 2e-3 (fp16)
// of max |ref|, both relative to the reference, since over thousands of keys the outputs are
// far smaller than v. LSE is fp32 math over up to a few thousand terms: abs error <= 1e-3.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/cuda/check.h"
#include "core/cuda/device.h"
#include "core/cuda/stream.h"
#include "core/half.h"
#include "kernels/cuda/attention/attention.h"
#include "ops_gpu_util.h"

namespace llmk {
namespace {

constexpr gpu_test::Tolerance kBf16{4e-3, 8e-3}, kFp16{1e-3, 2e-3};

struct Case {
  std::string name;
  int D = 16, Hq = 4, Hkv = 2;
  bool fp16 = false;
  // Sequences: (queries, keys) each; one entry with cu = false means the single-sequence form
  // with positions pos0.. (keys = pos0 + queries).
  std::vector<std::pair<int, int>> seqs;
  bool varlen = true;
  int page_size = 0;  // > 0: paged KV, pages shuffled
  int window = 0;
  float softcap = 0.0f;
  bool lse = true;
  bool causal = true;
  bool by_positions = false;  // batched decode: cu_q and positions[], no cu_k (paged only)
};

uint16_t to_half_bits(float v, bool fp16) { return fp16 ? float_to_fp16(v) : float_to_bf16(v); }
float from_half_bits(uint16_t b, bool fp16) { return fp16 ? fp16_to_float(b) : bf16_to_float(b); }

template <typename T>
T* upload(const std::vector<T>& v) {
  T* d = nullptr;
  LLMK_CUDA_CHECK(cudaMalloc(&d, std::max<size_t>(1, v.size()) * sizeof(T)));
  if (!v.empty()) {
    LLMK_CUDA_CHECK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  return d;
}
template <typename T>
std::vector<T> download(const T* d, size_t n) {
  std::vector<T> v(n);
  LLMK_CUDA_CHECK(cudaMemcpy(v.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}

void run_case(const Case& c) {
  SCOPED_TRACE(c.name);
  std::mt19937 rng(1234 + c.D * 7 + static_cast<int>(c.seqs.size()));
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  const int B = static_cast<int>(c.seqs.size());
  std::vector<int32_t> cu_q(B + 1, 0), cu_k(B + 1, 0);
  for (int b = 0; b < B; ++b) {
    cu_q[b + 1] = cu_q[b] + c.seqs[b].first;
    cu_k[b + 1] = cu_k[b] + c.seqs[b].second;
  }
  const int T = cu_q[B];
  const int D = c.D, Hq = c.Hq, Hkv = c.Hkv;
  // Key storage: contiguous rows cu_k[b].. (varlen) or pages. Row j of sequence b -> storage row.
  int pages_per_seq = 0, n_rows = cu_k[B];
  std::vector<int32_t> page_table;
  if (c.page_size > 0) {
    for (const auto& s : c.seqs)
      pages_per_seq = std::max(pages_per_seq, (s.second + c.page_size - 1) / c.page_size);
    const int n_pages = B * pages_per_seq + 3;  // spare pages stay NaN
    std::vector<int32_t> order(n_pages);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    page_table.assign(static_cast<size_t>(B) * pages_per_seq, 0);
    for (size_t i = 0; i < page_table.size(); ++i) page_table[i] = order[i];
    n_rows = n_pages * c.page_size;
  }
  const auto storage_row = [&](int b, int j) -> int64_t {
    if (c.page_size == 0) return c.varlen ? cu_k[b] + j : j;
    const int page = page_table[static_cast<size_t>(b) * pages_per_seq + j / c.page_size];
    return static_cast<int64_t>(page) * c.page_size + j % c.page_size;
  };

  const uint16_t nan_bits = 0xFFFF;  // NaN in bf16 and fp16
  std::vector<uint16_t> q(static_cast<size_t>(T) * Hq * D),
      k(static_cast<size_t>(n_rows) * Hkv * D, nan_bits), v(k.size(), nan_bits);
  for (auto& x : q) x = to_half_bits(dist(rng), c.fp16);
  // Only the rows each sequence owns hold numbers; the reference reads them through storage_row.
  for (int b = 0; b < B; ++b) {
    for (int j = 0; j < c.seqs[b].second; ++j) {
      const int64_t r = storage_row(b, j);
      for (int i = 0; i < Hkv * D; ++i) {
        k[r * Hkv * D + i] = to_half_bits(dist(rng), c.fp16);
        v[r * Hkv * D + i] = to_half_bits(dist(rng), c.fp16);
      }
    }
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));

  // float64 reference.
  std::vector<double> ref(q.size()), ref_lse(static_cast<size_t>(Hq) * T);
  for (int b = 0; b < B; ++b) {
    const int tq = c.seqs[b].first, tk = c.seqs[b].second;
    for (int i = 0; i < tq; ++i) {
      const int r = cu_q[b] + i;
      const int pos = c.causal ? tk - tq + i : tk - 1;
      const int lo = c.causal && c.window > 0 ? std::max(0, pos - c.window + 1) : 0;
      for (int h = 0; h < Hq; ++h) {
        const int hk = h / (Hq / Hkv);
        std::vector<double> s;
        double m = -INFINITY;
        for (int j = lo; j <= pos; ++j) {
          const int64_t kr = storage_row(b, j);
          double dot = 0;
          for (int e = 0; e < D; ++e) {
            dot += static_cast<double>(
                       from_half_bits(q[(static_cast<size_t>(r) * Hq + h) * D + e], c.fp16)) *
                   from_half_bits(k[(kr * Hkv + hk) * D + e], c.fp16);
          }
          dot *= scale;
          if (c.softcap > 0) dot = c.softcap * std::tanh(dot / c.softcap);
          s.push_back(dot);
          m = std::max(m, dot);
        }
        double l = 0;
        for (double& x : s) l += (x = std::exp(x - m));
        for (int e = 0; e < D; ++e) {
          double acc = 0;
          for (int j = lo; j <= pos; ++j) {
            acc += s[j - lo] * from_half_bits(v[(storage_row(b, j) * Hkv + hk) * D + e], c.fp16);
          }
          ref[(static_cast<size_t>(r) * Hq + h) * D + e] = acc / l;
        }
        ref_lse[static_cast<size_t>(h) * T + r] = m + std::log(l);
      }
    }
  }

  cuda::AttentionArgs a;
  auto* d_q = upload(q);
  auto* d_k = upload(k);
  auto* d_v = upload(v);
  std::vector<uint16_t> poison(q.size(), nan_bits);
  auto* d_out = upload(poison);
  std::vector<float> lse_poison(ref_lse.size(), NAN);
  float* d_lse = c.lse ? upload(lse_poison) : nullptr;
  auto* d_cu_q = upload(cu_q);
  auto* d_cu_k = upload(cu_k);
  auto* d_pages = upload(page_table);
  std::vector<int32_t> positions(T);
  std::iota(positions.begin(), positions.end(), c.seqs[0].second - c.seqs[0].first);
  if (c.by_positions) {
    for (int b = 0; b < B; ++b) {
      for (int i = 0; i < c.seqs[b].first; ++i) {
        positions[cu_q[b] + i] = c.seqs[b].second - c.seqs[b].first + i;
      }
    }
  }
  auto* d_pos = upload(positions);
  a.out = reinterpret_cast<__nv_bfloat16*>(d_out);
  a.out_t = static_cast<int64_t>(Hq) * D;
  a.out_h = D;
  a.q = reinterpret_cast<const __nv_bfloat16*>(d_q);
  a.q_t = static_cast<int64_t>(Hq) * D;
  a.q_h = D;
  a.k = reinterpret_cast<const __nv_bfloat16*>(d_k);
  a.v = reinterpret_cast<const __nv_bfloat16*>(d_v);
  a.k_t = a.v_t = static_cast<int64_t>(Hkv) * D;
  a.k_h = a.v_h = D;
  a.positions = d_pos;
  a.T = T;
  a.Hq = Hq;
  a.Hkv = Hkv;
  a.D = D;
  a.L = n_rows;
  a.scale = scale;
  a.window = c.window;
  a.softcap = c.softcap;
  a.fp16 = c.fp16;
  a.causal = c.causal;
  if (c.varlen) {
    a.B = B;
    a.cu_q = d_cu_q;
    a.cu_k = c.by_positions ? nullptr : d_cu_k;
  }
  if (c.page_size > 0) {
    a.page_table = d_pages;
    a.page_size = c.page_size;
    a.pages_per_seq = pages_per_seq;
  }
  a.lse = d_lse;
  cuda::attention_generic(a);
  LLMK_CUDA_CHECK(cudaStreamSynchronize(cuda::current_stream()));

  const std::vector<uint16_t> out = download(d_out, q.size());
  gpu_test::DiffAccumulator diff;
  for (size_t i = 0; i < out.size(); ++i) diff.add(from_half_bits(out[i], c.fp16), ref[i]);
  gpu_test::expect_within(diff.result(), c.fp16 ? kFp16 : kBf16, "output");
  if (c.lse) {
    const std::vector<float> lse = download(d_lse, ref_lse.size());
    double lse_err = 0;
    for (size_t i = 0; i < lse.size(); ++i) {
      lse_err = std::max(lse_err, std::isfinite(lse[i]) ? std::abs(lse[i] - ref_lse[i]) : INFINITY);
    }
    EXPECT_LE(lse_err, 1e-3);
  }
  for (void* p :
       {static_cast<void*>(d_q), static_cast<void*>(d_k), static_cast<void*>(d_v),
        static_cast<void*>(d_out), static_cast<void*>(d_lse), static_cast<void*>(d_cu_q),
        static_cast<void*>(d_cu_k), static_cast<void*>(d_pages), static_cast<void*>(d_pos)}) {
    if (p != nullptr) LLMK_CUDA_CHECK(cudaFree(p));
  }
}

TEST(AttentionGenericGpu, MatchesFloat64Reference) {
  cuda::init();
  const std::vector<Case> cases = {
      {.name = "D16 single sequence at a position", .D = 16, .seqs = {{17, 40}}, .varlen = false},
      {.name = "D96 prefill, 1000 keys", .D = 96, .Hq = 8, .Hkv = 2, .seqs = {{127, 1000}}},
      {.name = "D72 fp16 GQA 8:1", .D = 72, .Hq = 8, .Hkv = 1, .fp16 = true, .seqs = {{33, 33}}},
      {.name = "D96 varlen mixed lengths", .D = 96, .seqs = {{1, 1}, {17, 17}, {5, 130}, {64, 64}}},
      {.name = "D16 paged out of order, decode",
       .D = 16,
       .seqs = {{1, 4099}, {3, 70}, {8, 8}},
       .page_size = 16},
      {.name = "D128 window + softcap + pages",
       .D = 128,
       .Hq = 4,
       .Hkv = 4,
       .seqs = {{40, 300}},
       .page_size = 64,
       .window = 37,
       .softcap = 2.0f},
      {.name = "D96 fp16 window, no LSE",
       .D = 96,
       .fp16 = true,
       .seqs = {{20, 50}, {2, 9}},
       .window = 8,
       .lse = false},
      {.name = "D96 varlen not causal", .D = 96, .seqs = {{7, 30}, {30, 7}}, .causal = false},
      {.name = "D16 batched decode by positions, paged",
       .D = 16,
       .seqs = {{1, 33}, {4, 100}, {2, 2}},
       .page_size = 8,
       .by_positions = true},
  };
  for (const Case& c : cases) run_case(c);
}

}  // namespace
}  // namespace llmk
