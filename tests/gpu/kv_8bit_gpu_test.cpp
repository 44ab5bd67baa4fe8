// 8-bit KV caches on CUDA (kernels/kv_quant.h), against the CPU path:
// - kv_append writes the bytes and scales the CPU writes from the same (bf16) values;
// - kv_gather decodes them to what the CPU decodes, rounded to bf16;
// - attention_paged over 8-bit pools (the decode kernel's 8-bit build at head dims 64 and 128,
//   the fallback kernel at 96) equals the CPU's over the same bytes within the attention
//   tolerance, and stays within a stated bound of attention over bf16 pools of the same keys;
// - the decode kernel's 8-bit build on awkward shapes and magnitudes, bf16 and fp16 queries.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "gpu/ops_gpu_util.h"
#include "kernels/cuda/attention/attention.h"
#include "ops/ops.h"

namespace llmk {
namespace {

using namespace gpu_test;

struct Pools {
  Tensor k, v;
  ops::KvScales s;
};

Pools pools(int64_t L, int64_t H, int64_t D, DType dt, Device dev) {
  const bool eight = dt != DType::BF16 && dt != DType::F32;
  Pools p{Tensor::zeros({L, H, D}, dt).to(dev), Tensor::zeros({L, H, D}, dt).to(dev), {}};
  if (eight) {
    p.s = {Tensor::zeros({L, H}, DType::F32).to(dev), Tensor::zeros({L, H}, DType::F32).to(dev)};
  }
  return p;
}

class Kv8bitGpu : public ::testing::TestWithParam<DType> {};

TEST_P(Kv8bitGpu, AppendAndGatherAreTheCpus) {
  cuda::init();
  const DType dt = GetParam();
  for (const int64_t D : {64, 96, 128, 256}) {
    const int64_t T = 7, H = 3, L = 16;
    const Tensor k = random_host({T, H, D}, DType::BF16, 1, -4.0f, 4.0f);
    const Tensor v = random_host({T, H, D}, DType::BF16, 2, -0.02f, 0.02f);
    const Tensor pos = i32_host({9, 0, 15, 3, 4, 12, 1});
    Pools g = pools(L, H, D, dt, Device::CUDA), c = pools(L, H, D, dt, Device::CPU);
    ops::kv_append(g.k, g.v, k.to(Device::CUDA), v.to(Device::CUDA), pos.to(Device::CUDA), &g.s);
    ops::kv_append(c.k, c.v, to_f32(k), to_f32(v), pos, &c.s);
    for (const auto& [gt, ct] :
         {std::pair{&g.k, &c.k}, {&g.v, &c.v}, {&g.s.k, &c.s.k}, {&g.s.v, &c.s.v}}) {
      const Tensor back = gt->to(Device::CPU);
      EXPECT_EQ(std::memcmp(back.data(), ct->data(), static_cast<size_t>(ct->nbytes())), 0)
          << "D " << D << ": the GPU's bytes differ from the CPU's";
    }
    Tensor gk = Tensor::empty({T, H, D}, DType::BF16, Device::CUDA);
    Tensor gv = Tensor::empty({T, H, D}, DType::BF16, Device::CUDA);
    const Tensor pos_d = pos.to(Device::CUDA);
    ops::kv_gather(gk, gv, g.k, g.v, pos_d, &g.s);
    Tensor ck = Tensor::empty({T, H, D}, DType::F32), cv = Tensor::empty({T, H, D}, DType::F32);
    ops::kv_gather(ck, cv, c.k, c.v, pos, &c.s);
    expect_bf16_exact(gk.to(Device::CPU), ck, "kv_gather K");
    expect_bf16_exact(gv.to(Device::CPU), cv, "kv_gather V");
  }
}

// Two bounds. Against the CPU on the same bytes: the attention tolerance (the GPU's bf16 output
// and its own order of fp32 sums). Against bf16 pools of the same keys: what the format's
// rounding costs, measured here on random keys and values and stated in kEightBitVsBf16.
TEST_P(Kv8bitGpu, PagedAttentionAgainstTheCpuAndBf16Pools) {
  cuda::init();
  const DType dt = GetParam();
  // Measured on an H100 (printed below; both kernels): E4M3 rel L2 0.033-0.037, max abs
  // 0.037-0.048 of max |ref| (3 mantissa bits: ~2^-4 / sqrt(3) RMS of each element); int8
  // 0.0063-0.0071 and 0.007-0.0095. Bounds about 1.5x those.
  const Tolerance kEightBitVsBf16 =
      dt == DType::I8 ? Tolerance{0.011, 0.015} : Tolerance{0.055, 0.075};
  for (const int64_t D : {64, 96, 128}) {  // 96: the fallback kernel; 64, 128: the decode kernel
    const int64_t Hq = 8, Hkv = 2, page = 16, B = 3;
    const std::vector<int64_t> keys = {700, 33, 1500};
    const int64_t P = 96, L = B * P * page;  // 96 pages a sequence, pages interleaved
    std::vector<int32_t> table(static_cast<size_t>(B * P));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < P; ++i)
        table[static_cast<size_t>(b * P + i)] = static_cast<int32_t>(i * B + b);
    // Every row of the pool written (bf16 and 8-bit from the same bf16 keys).
    std::vector<int32_t> all(static_cast<size_t>(L));
    std::iota(all.begin(), all.end(), 0);
    const Tensor rows = i32_host(all).to(Device::CUDA);
    const Tensor kh = random_host({L, Hkv, D}, DType::BF16, 3, -3.0f, 3.0f);
    const Tensor vh = random_host({L, Hkv, D}, DType::BF16, 4, -1.0f, 1.0f);
    Pools e = pools(L, Hkv, D, dt, Device::CUDA), b16 = pools(L, Hkv, D, DType::BF16, Device::CUDA);
    const Tensor kd = kh.to(Device::CUDA), vd = vh.to(Device::CUDA);
    ops::kv_append(e.k, e.v, kd, vd, rows, &e.s);
    ops::kv_append(b16.k, b16.v, kd, vd, rows);
    // One query per sequence at its last key (a decode step).
    std::vector<int32_t> cu = {0, 1, 2, 3}, posv;
    for (const int64_t n : keys) posv.push_back(static_cast<int32_t>(n - 1));
    const Tensor q = random_host({B, Hq, D}, DType::BF16, 5, -1.0f, 1.0f);
    const Tensor qd = q.to(Device::CUDA), tab = i32_host(table).view({B, P}).to(Device::CUDA);
    const Tensor cud = i32_host(cu).to(Device::CUDA), pd = i32_host(posv).to(Device::CUDA);
    ops::AttentionParams ap;
    Tensor ref = Tensor::empty({B, Hq, D}, DType::BF16, Device::CUDA);
    ops::attention_paged(ref, qd, b16.k, b16.v, tab, page, cud, pd, 1, ap);
    ap.kv_scales = &e.s;
    Tensor out = poisoned_cuda({B, Hq, D}, DType::BF16);
    ops::reset_attention_stats();
    ops::attention_paged(out, qd, e.k, e.v, tab, page, cud, pd, 1, ap);
    const ops::AttentionStats st = ops::attention_stats();
    EXPECT_EQ(D == 96 ? st.fallback : st.decode, 1u) << "D " << D;
    // The CPU on the same bytes.
    ops::KvScales cs{e.s.k.to(Device::CPU), e.s.v.to(Device::CPU)};
    ops::AttentionParams cap;
    cap.kv_scales = &cs;
    Tensor cpu_out = Tensor::empty({B, Hq, D}, DType::F32);
    ops::attention_paged(cpu_out, to_f32(q), e.k.to(Device::CPU), e.v.to(Device::CPU),
                         i32_host(table).view({B, P}), page, i32_host(cu), i32_host(posv), 1, cap);
    const Tensor got = out.to(Device::CPU);
    expect_close(got, cpu_out, kAttentionOut, "8-bit pools against the CPU");
    const Diff d = compare(got, ref.to(Device::CPU));
    std::printf("  %s D %lld: against bf16 pools rel L2 %.4f, max abs %.4f of max |ref| %.4f\n",
                dtype_name(dt).data(), static_cast<long long>(D), d.rel_l2, d.max_abs, d.max_ref);
    expect_within(d, kEightBitVsBf16, "8-bit pools against bf16 pools");
  }
}

// The decode kernel's 8-bit build (fp16 products on codes turned into operands in registers, the
// scales applied per key, q and the V sums rescaled to fp16's range) against the CPU on the same
// bytes where that arithmetic could go wrong: bf16 and fp16 queries; 1 to 8 queries a sequence
// (with 7 query heads a KV head, several row groups); key counts around the 64-key tiles and
// long enough to split; a window and a softcap; q and V of very large and very small magnitude.
// Each case with each loader (at head dim 128 with KV heads a multiple of 4 the TMA one reads
// the codes and scales; elsewhere forcing it falls back to cp.async).
TEST_P(Kv8bitGpu, DecodeKernelOnAwkwardShapes) {
  cuda::init();
  const DType dt = GetParam();
  struct Case {
    int64_t D, Hq, Hkv;
    std::vector<int64_t> keys, queries;  // per sequence
    int window;
    float softcap, q_mag, v_mag;
    DType qdt;
  };
  const std::vector<Case> cases = {
      {128, 32, 8, {1, 63, 64, 65, 3000}, {1, 1, 1, 1, 1}, 0, 0.0f, 1.0f, 1.0f, DType::BF16},
      {128, 28, 4, {9, 130, 700}, {8, 3, 5}, 0, 0.0f, 1.0f, 1.0f, DType::F16},
      {64, 7, 1, {17, 300}, {2, 8}, 100, 30.0f, 1.0f, 1.0f, DType::BF16},
      {128, 8, 8, {500, 1}, {1, 1}, 0, 0.0f, 3.0e3f, 1.0e-5f, DType::F16},
      {64, 16, 4, {256, 1200}, {4, 1}, 0, 0.0f, 1.0e-6f, 3.0e3f, DType::BF16},
  };
  uint32_t seed = 100;
  for (const Case& c : cases) {
    const int64_t B = static_cast<int64_t>(c.keys.size()), page = 16;
    const int64_t P = (*std::max_element(c.keys.begin(), c.keys.end()) + page - 1) / page;
    const int64_t L = B * P * page;
    std::vector<int32_t> table(static_cast<size_t>(B * P));
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), std::mt19937(seed));
    std::vector<int32_t> all(static_cast<size_t>(L));
    std::iota(all.begin(), all.end(), 0);
    const Tensor rows = i32_host(all).to(Device::CUDA);
    const Tensor kh = random_host({L, c.Hkv, c.D}, DType::BF16, ++seed, -3.0f, 3.0f);
    const Tensor vh = random_host({L, c.Hkv, c.D}, DType::BF16, ++seed, -c.v_mag, c.v_mag);
    Pools e = pools(L, c.Hkv, c.D, dt, Device::CUDA);
    ops::kv_append(e.k, e.v, kh.to(Device::CUDA), vh.to(Device::CUDA), rows, &e.s);
    std::vector<int32_t> cu = {0}, posv;
    int64_t max_q = 0;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t tq = c.queries[static_cast<size_t>(b)], n = c.keys[static_cast<size_t>(b)];
      for (int64_t i = 0; i < tq; ++i) posv.push_back(static_cast<int32_t>(n - tq + i));
      cu.push_back(cu.back() + static_cast<int32_t>(tq));
      max_q = std::max(max_q, tq);
    }
    const int64_t T = cu.back();
    const Tensor q = random_host({T, c.Hq, c.D}, c.qdt, ++seed, -c.q_mag, c.q_mag);
    ops::AttentionParams ap;
    ap.window = c.window;
    ap.softcap = c.softcap;
    ap.kv_scales = &e.s;
    const std::pair<cuda::DecodeLoader, const char*> loaders[] = {
        {cuda::DecodeLoader::kAuto, "auto"},
        {cuda::DecodeLoader::kCpAsync, "cp.async"},
        {cuda::DecodeLoader::kTma, "tma"}};
    std::vector<Tensor> outs;
    for (const auto& [loader, name] : loaders) {
      cuda::set_decode_loader(loader);
      Tensor out = poisoned_cuda({T, c.Hq, c.D}, c.qdt);
      ops::reset_attention_stats();
      ops::attention_paged(
          out, q.to(Device::CUDA), e.k, e.v, i32_host(table).view({B, P}).to(Device::CUDA), page,
          i32_host(cu).to(Device::CUDA), i32_host(posv).to(Device::CUDA), max_q, ap);
      EXPECT_EQ(ops::attention_stats().decode, 1u);
      outs.push_back(out.to(Device::CPU));
    }
    cuda::set_decode_loader(cuda::DecodeLoader::kAuto);
    ops::KvScales cs{e.s.k.to(Device::CPU), e.s.v.to(Device::CPU)};
    ops::AttentionParams cap = ap;
    cap.kv_scales = &cs;
    Tensor cpu_out = Tensor::empty({T, c.Hq, c.D}, DType::F32);
    ops::attention_paged(cpu_out, to_f32(q), e.k.to(Device::CPU), e.v.to(Device::CPU),
                         i32_host(table).view({B, P}), page, i32_host(cu), i32_host(posv), max_q,
                         cap);
    for (size_t l = 0; l < outs.size(); ++l) {
      expect_close(outs[l], cpu_out, kAttentionOut,
                   std::string(loaders[l].second) + " loader, D " + std::to_string(c.D) + ", " +
                       std::to_string(c.Hq) + "/" + std::to_string(c.Hkv) + " heads, " +
                       std::string(dtype_name(c.qdt)) + " q of magnitude " +
                       std::to_string(c.q_mag) + ", V " + std::to_string(c.v_mag));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, Kv8bitGpu, ::testing::Values(DType::F8E4M3, DType::I8),
                         [](const auto& i) { return std::string(dtype_name(i.param)); });

}  // namespace
}  // namespace llmk
