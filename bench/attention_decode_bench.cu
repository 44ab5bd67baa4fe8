// Benchmark of the split-KV decode kernel (cuda::attention_decode): one query token per sequence,
// 32 query / 8 KV heads, head dim 128, bf16, over paged KV pools (and a contiguous cache), at the
// shapes of one and many sequences at short and long contexts (B1 L4096, B1 L32768, B8 L4096,
// B32 L4096) and a split sweep; then the same four shapes with Phi-3-mini's heads (32 query and
// 32 KV heads, head dim 96).
//
// Each shape rotates over enough pools (each with its own shuffled page table) to span 4x the L2
// (read from the device), so every call streams K and V from HBM. Per shape: a warm-up, then
// `samples` timings (CUDA events) of one CUDA graph replaying `batch` calls; the median gives us
// per call. GB/s = the K and V bytes the sequences' keys occupy / time (the q, out and page-table
// bytes are under 0.1%). The device-to-device copy rate (read + write) is measured first: the
// floor of a shape is its bytes / that rate.
//
// Prints one JSON line per measurement:
//   {"kind":"decode","B":1,"Hq":32,"Hkv":8,"L":4096,"D":128,"page_size":16,"split":..,
//    "loader":"tma"|"cp.async","us":..,"host_us":..,"gbps":..,"copy_gbps":..}
// (host_us: the host time to enqueue one call outside a graph).
// ("kind":"decode_split" for the sweep lines). bench/attention.py merges them with SDPA's.
//   attention_decode_bench [--samples N] [--shape B L PAGE SPLIT [--heads HQ HKV D]]
//                          [--no-early-reads] [--loader auto|tma|cp-async]
//                          [--kv bf16-and-8bit|bf16|f8e4m3|i8]
// --kv bf16-and-8bit: instead, each of B1 L4096, B8 L4096, B32 L4096 and B1 L32768 (16-key
// pages) with a bf16 cache, then E4M3 and int8 caches (kernels/kv_quant.h: bytes and a float
// scale per row and head; random codes, no NaN), in turn; "kv" names the cache, and GB/s counts
// the bytes each reads (codes and scales for 8-bit). --kv bf16|f8e4m3|i8: the cache of --shape.
// --loader: which build of the kernel reads K/V (cuda::DecodeLoader; default auto).
// --shape: that one shape alone (page 0: contiguous; split 0: the heuristic), no copy rate and
// no floor (for a profiler, e.g. ncu -k regex:decode_kernel); --heads: its query heads, KV heads
// and head dim (default 32 8 128).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <numeric>
#include <random>
#include <vector>

#include "bench_util.cuh"
#include "core/cuda/check.h"
#include "core/cuda/device.h"
#include "core/cuda/stream.h"
#include "kernels/cuda/attention/attention.h"

namespace llmk::bench {
namespace {

struct Shape {
  int B;
  int64_t L;
  int page_size;  // 0: contiguous cache per sequence (B = 1 only)
  int split = 0;  // 0: heuristic
  const char* kind = "decode";
  int Hq = 32, Hkv = 8, D = 128;  // Llama-3-8B's heads; Phi-3-mini: 32, 32, 96
  int kv_format = 0;              // AttentionArgs::kv_format: 0 bf16, 1 E4M3, 2 int8
};

// A device buffer of n random 8-bit codes (E4M3 without the NaN codes, or any int8), and n
// scales in [0.005, 0.01).
uint8_t* random_codes(int64_t n, int fmt, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> h(static_cast<size_t>(n));
  for (uint8_t& b : h) {
    b = static_cast<uint8_t>(rng());
    if (fmt == 1 && (b & 0x7F) == 0x7F) b &= 0xFE;
  }
  return device_copy(h);
}
float* random_scales(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(0.005f, 0.01f);
  std::vector<float> h(static_cast<size_t>(n));
  for (float& x : h) x = d(rng);
  return device_copy(h);
}

// As the model runner launches it (its kernel before, kv_append, writes only the new keys):
// the indices and the older keys' first tiles are read before the wait for the previous kernel
// (AttentionArgs::decode_early_reads). Here the kernel before is another decode call, which
// writes neither. --no-early-reads: wait first.
bool g_early_reads = true;

void run(const Shape& s, int samples, double copy_gbs, Events& ev) {
  const int Hq = s.Hq, Hkv = s.Hkv, D = s.D;
  const int B = s.B;
  const int64_t L = s.L;
  const bool paged = s.page_size > 0;
  const int pages_per_seq = paged ? static_cast<int>((L + s.page_size - 1) / s.page_size) : 0;
  const int64_t rows = paged ? static_cast<int64_t>(B) * pages_per_seq * s.page_size : L;
  const int elem = s.kv_format == 0 ? 2 : 1;
  const size_t kv_bytes = static_cast<size_t>(rows) * Hkv * D * elem;  // one of K, V
  const size_t l2 = cuda::device_info().l2_bytes;
  const int sets =
      static_cast<int>(std::max<size_t>(1, (4 * l2 + 2 * kv_bytes - 1) / (2 * kv_bytes)));
  const int batch = std::max(sets, 20);

  std::mt19937 rng(1234 + B);
  std::vector<void*> ks(sets), vs(sets);
  std::vector<float*> kss(sets, nullptr), vss(sets, nullptr);
  std::vector<int32_t*> tables(sets);
  for (int i = 0; i < sets; ++i) {
    if (s.kv_format != 0) {
      ks[i] = random_codes(rows * Hkv * D, s.kv_format, 10 + 2 * i);
      vs[i] = random_codes(rows * Hkv * D, s.kv_format, 11 + 2 * i);
      kss[i] = random_scales(rows * Hkv, 100 + i);
      vss[i] = random_scales(rows * Hkv, 200 + i);
    } else {
      LLMK_CUDA_CHECK(cudaMalloc(&ks[i], kv_bytes));
      LLMK_CUDA_CHECK(cudaMalloc(&vs[i], kv_bytes));
      fill(ks[i], rows * Hkv * D, 10 + 2 * i, 1.0f);
      fill(vs[i], rows * Hkv * D, 11 + 2 * i, 1.0f);
    }
    if (paged) {  // every page of the pool used once, in a shuffled order
      std::vector<int32_t> t(static_cast<size_t>(B) * pages_per_seq);
      std::iota(t.begin(), t.end(), 0);
      std::shuffle(t.begin(), t.end(), rng);
      tables[i] = device_copy(t);
    }
  }
  __nv_bfloat16 *q = nullptr, *out = nullptr;
  LLMK_CUDA_CHECK(cudaMalloc(&q, static_cast<size_t>(B) * Hq * D * 2));
  LLMK_CUDA_CHECK(cudaMalloc(&out, static_cast<size_t>(B) * Hq * D * 2));
  fill(q, static_cast<int64_t>(B) * Hq * D, 7, 1.0f);
  std::vector<int32_t> cu(B + 1), pos(B, static_cast<int32_t>(L - 1));
  std::iota(cu.begin(), cu.end(), 0);
  int32_t* d_cu = device_copy(cu);
  int32_t* d_pos = device_copy(pos);

  cuda::AttentionArgs a;
  a.out = out;
  a.out_t = Hq * D;
  a.out_h = D;
  a.q = q;
  a.q_t = Hq * D;
  a.q_h = D;
  a.k_t = a.v_t = Hkv * D;
  a.k_h = a.v_h = D;
  a.T = B;
  a.Hq = Hq;
  a.Hkv = Hkv;
  a.D = D;
  a.L = rows;
  a.scale = 1.0f / std::sqrt(static_cast<float>(D));
  a.B = B;
  a.positions = d_pos;
  if (paged || B > 1) {
    a.cu_q = d_cu;
    a.max_q_per_seq = 1;
  }
  if (paged) {
    a.page_size = s.page_size;
    a.pages_per_seq = pages_per_seq;
  }
  a.decode_split = s.split;
  a.decode_early_reads = g_early_reads;
  a.kv_format = s.kv_format;
  a.k_scale = kss[0];
  a.v_scale = vss[0];
  const int split = cuda::attention_decode_split(a);
  const char* loader = cuda::attention_decode_uses_tma(a) ? "tma" : "cp.async";
  auto call = [&](int i) {
    cuda::AttentionArgs c = a;
    c.k = static_cast<const __nv_bfloat16*>(ks[i % sets]);
    c.v = static_cast<const __nv_bfloat16*>(vs[i % sets]);
    c.k_scale = kss[i % sets];
    c.v_scale = vss[i % sets];
    c.page_table = paged ? tables[i % sets] : nullptr;
    cuda::attention_decode(c);
  };
  for (int i = 0; i < sets; ++i) call(i);  // warm-up (and the split workspace, before capture)
  LLMK_CUDA_CHECK(cudaStreamSynchronize(cuda::current_stream()));

  const double us = graph_ms(ev, samples,
                             [&] {
                               for (int i = 0; i < batch; ++i) call(i);
                             }) *
                    1e3 / batch;
  // Host time to enqueue one call outside a graph (argument checks, plan, tensor maps, launch):
  // the median of 20 rounds of `batch` calls, each round drained before the next.
  std::vector<double> host;
  for (int r = 0; r < 20; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < batch; ++i) call(i);
    const auto t1 = std::chrono::steady_clock::now();
    host.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / batch);
    LLMK_CUDA_CHECK(cudaStreamSynchronize(cuda::current_stream()));
  }
  std::sort(host.begin(), host.end());
  const double host_us = host[host.size() / 2];
  const double bytes = 2.0 * static_cast<double>(B) * L * Hkv * (s.kv_format ? D + 4 : D * 2);
  static const char* const kv_names[] = {"bf16", "f8e4m3", "i8"};
  std::printf(
      "{\"kv\":\"%s\",\"kind\":\"%s\",\"B\":%d,\"Hq\":%d,\"Hkv\":%d,\"L\":%lld,\"D\":%d,\"page_"
      "size\":%d,"
      "\"split\":%d,\"loader\":\"%s\",\"us\":%.2f,\"host_us\":%.2f,\"gbps\":%.0f,"
      "\"copy_gbps\":%.0f,\"floor_us\":%.2f}\n",
      kv_names[s.kv_format], s.kind, B, Hq, Hkv, static_cast<long long>(L), D, s.page_size, split,
      loader, us, host_us, bytes / (us * 1e-6) / 1e9, copy_gbs, bytes / (copy_gbs * 1e9) * 1e6);
  std::fflush(stdout);
  for (int i = 0; i < sets; ++i) {
    LLMK_CUDA_CHECK(cudaFree(ks[i]));
    LLMK_CUDA_CHECK(cudaFree(vs[i]));
    if (kss[i] != nullptr) LLMK_CUDA_CHECK(cudaFree(kss[i]));
    if (vss[i] != nullptr) LLMK_CUDA_CHECK(cudaFree(vss[i]));
    if (paged) LLMK_CUDA_CHECK(cudaFree(tables[i]));
  }
  LLMK_CUDA_CHECK(cudaFree(q));
  LLMK_CUDA_CHECK(cudaFree(out));
  LLMK_CUDA_CHECK(cudaFree(d_cu));
  LLMK_CUDA_CHECK(cudaFree(d_pos));
}

int main_impl(int argc, char** argv) {
  int samples = 30;
  Shape one{0, 0, 16};  // --shape B L PAGE SPLIT: that shape alone (for a profiler)
  bool kv_compare = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--kv") == 0 && i + 1 < argc) {
      const char* kv = argv[++i];
      kv_compare = std::strcmp(kv, "bf16-and-8bit") == 0;
      if (std::strcmp(kv, "f8e4m3") == 0) {
        one.kv_format = 1;
      } else if (std::strcmp(kv, "i8") == 0) {
        one.kv_format = 2;
      } else if (!kv_compare && std::strcmp(kv, "bf16") != 0) {
        std::fprintf(stderr,
                     "attention_decode_bench: --kv %s: expected bf16-and-8bit, bf16, f8e4m3 or "
                     "i8\n",
                     kv);
        return 2;
      }
    }
    if (std::strcmp(argv[i], "--samples") == 0 && i + 1 < argc) samples = std::atoi(argv[++i]);
    if (std::strcmp(argv[i], "--no-early-reads") == 0) g_early_reads = false;
    if (std::strcmp(argv[i], "--loader") == 0 && i + 1 < argc) {
      const char* l = argv[++i];
      if (std::strcmp(l, "cp-async") == 0) {
        cuda::set_decode_loader(cuda::DecodeLoader::kCpAsync);
      } else if (std::strcmp(l, "tma") == 0) {
        cuda::set_decode_loader(cuda::DecodeLoader::kTma);
      } else if (std::strcmp(l, "auto") != 0) {
        std::fprintf(stderr,
                     "attention_decode_bench: --loader %s: expected auto, tma or cp-async\n", l);
        return 2;
      }
    }
    if (std::strcmp(argv[i], "--heads") == 0 && i + 3 < argc) {
      one.Hq = std::atoi(argv[++i]);
      one.Hkv = std::atoi(argv[++i]);
      one.D = std::atoi(argv[++i]);
    }
    if (std::strcmp(argv[i], "--shape") == 0 && i + 4 < argc) {
      one.B = std::atoi(argv[++i]);
      one.L = std::atoll(argv[++i]);
      one.page_size = std::atoi(argv[++i]);
      one.split = std::atoi(argv[++i]);
    }
  }
  cuda::init();
  Events ev;
  if (one.B > 0) {
    run(one, samples, 0.0, ev);
    return 0;
  }
  const double copy = copy_rate_gbs(ev, samples);
  std::fprintf(stderr, "device %s, %d SMs, copy rate %.0f GB/s\n", cuda::device_info().name.c_str(),
               cuda::device_info().sm_count, copy);
  const std::pair<int, int64_t> shapes[] = {{1, 4096}, {1, 32768}, {8, 4096}, {32, 4096}};
  if (kv_compare) {
    for (auto [B, L] : shapes) {
      for (int fmt : {0, 1, 2, 0}) {  // bf16 again last: the clocks drift under load
        Shape sh{B, L, 16};
        sh.kv_format = fmt;
        run(sh, samples, copy, ev);
      }
    }
    return 0;
  }
  for (int page : {16, 64}) {
    for (auto [B, L] : shapes) run({B, L, page}, samples, copy, ev);
  }
  run({1, 4096, 0}, samples, copy, ev);
  run({1, 32768, 0}, samples, copy, ev);
  for (auto [B, L] : shapes) {
    for (int split : {1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 64}) {
      run({B, L, 16, split, "decode_split"}, samples, copy, ev);
    }
  }
  run({1, 8192, 16}, samples, copy, ev);  // the Llama-3-8B e2e context
  // Phi-3-mini's heads (32 query and 32 KV heads of 96 dims), 16-key pages.
  for (auto [B, L] : shapes) run({B, L, 16, 0, "decode", 32, 32, 96}, samples, copy, ev);
  return 0;
}

}  // namespace
}  // namespace llmk::bench

int main(int argc, char** argv) {
  return llmk::bench::guarded_main("attention_decode_bench", llmk::bench::main_impl, argc, argv);
}
