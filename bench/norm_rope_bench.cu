// Benchmark of the bandwidth-bound per-token kernels: cuda::rms_norm, cuda::add_rms_norm (the
// residual add fused into the norm) and cuda::rope (half-split and adjacent pairs), bf16, at one
// token and at a 4096-token prefill (hidden 4096; 32 heads of 128).
//
// Bytes are what each call must move: every tensor read or written once (x read and out written
// for rms_norm; x and delta read, x and out written for add_rms_norm; x read and written for
// rope), plus the f32 weight or the i32 positions. Inputs are device-side random values
// (bench_util.cuh's fill). Each shape rotates over enough input sets to span 4x the L2 (read from
// the device; at most kMaxSets, so the one-token sets stay in L2, where that shape measures
// launch latency, not bandwidth). Per shape: one pass over the sets as a warm-up, then `samples`
// timings (CUDA events) of `batch` back-to-back launches; the median gives us per call. The
// device-to-device copy rate (read + write) is measured first: the floor of a shape is its bytes
// / that rate.
//
// Prints one JSON line per measurement:
//   {"kind":"rms_norm"|"add_rms_norm"|"rope_half"|"rope_adjacent","T":..,"H":..,"D":..,
//    "bytes":..,"us":..,"gbps":..,"copy_gbps":..,"floor_us":..}
//   norm_rope_bench [--samples N]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "bench_util.cuh"
#include "core/cuda/check.h"
#include "core/cuda/device.h"
#include "core/cuda/stream.h"
#include "kernels/cuda/rms_norm.h"
#include "kernels/cuda/rope.h"

namespace llmk::bench {
namespace {

constexpr int kMaxSets = 256;
constexpr float kEps = 1e-5f;

struct Shape {
  const char* kind;
  int64_t T, H, D;  // H = 1 for the norms (rows of D)
};

// How many input sets of `set_bytes` each span 4x the L2 (at most kMaxSets).
int sets_for(double set_bytes) {
  const double want = 4.0 * static_cast<double>(cuda::device_info().l2_bytes);
  return static_cast<int>(std::clamp(std::ceil(want / set_bytes), 1.0, double{kMaxSets}));
}

void report(const Shape& s, double bytes, double us, double copy_gbs) {
  std::printf(
      "{\"kind\":\"%s\",\"T\":%lld,\"H\":%lld,\"D\":%lld,\"bytes\":%.0f,\"us\":%.2f,"
      "\"gbps\":%.1f,\"copy_gbps\":%.0f,\"floor_us\":%.2f}\n",
      s.kind, static_cast<long long>(s.T), static_cast<long long>(s.H), static_cast<long long>(s.D),
      bytes, us, bytes / (us * 1e-6) / 1e9, copy_gbs, bytes / (copy_gbs * 1e9) * 1e6);
  std::fflush(stdout);
}

void run_norms(int64_t T, int64_t D, int samples, double copy_gbs, Events& ev) {
  std::vector<float> w_host(static_cast<size_t>(D));
  for (size_t i = 0; i < w_host.size(); ++i) w_host[i] = 1.0f + 0.01f * static_cast<float>(i % 7);
  float* w = device_copy(w_host);
  const int64_t n = T * D;
  {
    const double bytes = 2.0 * n * 2 + D * 4.0;
    const int sets = sets_for(bytes);
    const Pool x(n, sets, 11, 2.0f), out(n, sets, 12, 1.0f);
    const double us = time_us(ev, samples, sets, [&](int i) {
      cuda::rms_norm(DType::BF16, out.at(i), D, x.at(i), D, T, D, w, kEps, false);
    });
    report({"rms_norm", T, 1, D}, bytes, us, copy_gbs);
  }
  {
    // x grows by delta at every call; delta is small enough to keep it far from overflow.
    const double bytes = 4.0 * n * 2 + D * 4.0;
    const int sets = sets_for(bytes);
    const Pool x(n, sets, 21, 2.0f), delta(n, sets, 22, 0.01f), out(n, sets, 23, 1.0f);
    const double us = time_us(ev, samples, sets, [&](int i) {
      cuda::add_rms_norm(DType::BF16, x.at(i), D, delta.at(i), D, out.at(i), D, T, D, w, kEps,
                         false);
    });
    report({"add_rms_norm", T, 1, D}, bytes, us, copy_gbs);
  }
  LLMK_CUDA_CHECK(cudaFree(w));
}

void run_rope(int64_t T, int64_t H, int64_t D, int samples, double copy_gbs, Events& ev) {
  std::vector<int32_t> pos_host(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) pos_host[static_cast<size_t>(t)] = static_cast<int32_t>(1000 + t);
  int32_t* pos = device_copy(pos_host);
  const double bytes = 2.0 * T * H * D * 2 + T * 4.0;
  const int sets = sets_for(bytes);
  const Pool x(T * H * D, sets, 31, 1.0f);
  for (const bool half_split : {true, false}) {
    cuda::RopeArgs a;
    a.T = T;
    a.H = H;
    a.D = D;
    a.ld_t = H * D;
    a.ld_h = D;
    a.positions = pos;
    a.rot_dim = static_cast<int>(D);
    a.theta = 1e4;
    a.half_split = half_split;
    const double us = time_us(ev, samples, sets, [&](int i) {
      cuda::RopeArgs c = a;
      c.x = x.at(i);
      cuda::rope(c);
    });
    report({half_split ? "rope_half" : "rope_adjacent", T, H, D}, bytes, us, copy_gbs);
  }
  LLMK_CUDA_CHECK(cudaFree(pos));
}

int main_impl(int argc, char** argv) {
  int samples = 21;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--samples") && i + 1 < argc) {
      samples = std::max(3, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: norm_rope_bench [--samples N]\n");
      return 2;
    }
  }
  cuda::init();
  Events ev;
  const double copy = copy_rate_gbs(ev, samples);
  std::fprintf(stderr, "device %s, %d SMs, copy rate %.0f GB/s\n", cuda::device_info().name.c_str(),
               cuda::device_info().sm_count, copy);
  for (const int64_t T : {1, 4096}) run_norms(T, 4096, samples, copy, ev);
  for (const int64_t T : {1, 4096}) run_rope(T, 32, 128, samples, copy, ev);
  return 0;
}

}  // namespace
}  // namespace llmk::bench

int main(int argc, char** argv) {
  return llmk::bench::guarded_main("norm_rope_bench", llmk::bench::main_impl, argc, argv);
}
