// Benchmark of the training ops' CUDA kernels (kernels/cuda/grad.h) in bf16: the add, the gated
// activation (SiLU and GELU-tanh), RMS norm (alone and with the residual; backward with and
// without dw) and RoPE by tables (forward, inverse, and from a [B, H, S, D] input), at
// rows x D = 8192 x 4096, 4096 x 8192 and 16384 x 2048. RoPE runs the same tokens x hidden as
// [B = 4, S = rows / 4, H = D / 128, 128] with half-split pairs and one shared f32 table [S, 64].
//
// Bytes are the least each call must move, every tensor read or written once: add 3n (a, b read,
// out written) and gated_fwd 3n, gated_bwd 5n (dout, gate, up read, dgate, dup written),
// rms_norm_fwd 2n (+ 2n with the residual: it is read and the sum written), rms_norm_bwd 3n
// (dy, x read, dx written), rope 2n, times 2 bytes; plus the weight [D], rstd [rows] f32, dw [D]
// and the tables. The partial sums of dw (up to 4 x SMs rows of D floats, written then read back
// mostly from L2) are not counted: they are overhead the kernel pays. Inputs are device-side
// random values, never zero. Each op rotates over enough input sets to span 4x the L2 (read from
// the device). Per op: one pass over the sets as a warm-up, then `samples` timings (CUDA events)
// of `batch` back-to-back launches; the median gives us per call. The device-to-device copy rate
// (read + write, 1 GiB) is measured first: the floor of an op is its bytes / that rate.
//
// Prints one JSON line per measurement:
//   {"kind":..,"shape":[..],"bytes":..,"us":..,"gbps":..,"copy_gbps":..,"floor_us":..}
//   train_ops_bench [--samples N]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_util.cuh"
#include "core/cuda/check.h"
#include "core/cuda/device.h"
#include "core/cuda/stream.h"
#include "kernels/cuda/grad.h"

namespace llmk::bench {
namespace {

namespace cg = cuda::grad;
using bf16 = __nv_bfloat16;

constexpr int kMaxSets = 64;
constexpr float kEps = 1e-5f;

// How many input sets of `set_bytes` each span 4x the L2 (at most kMaxSets).
int sets_for(double set_bytes) {
  const double want = 4.0 * static_cast<double>(cuda::device_info().l2_bytes);
  return static_cast<int>(std::clamp(std::ceil(want / set_bytes), 1.0, double{kMaxSets}));
}

void report(const char* kind, const std::vector<int64_t>& shape, double bytes, double us,
            double copy_gbs) {
  std::string dims;
  for (size_t k = 0; k < shape.size(); ++k) {
    if (k > 0) dims += ',';
    dims += std::to_string(shape[k]);
  }
  std::printf(
      "{\"kind\":\"%s\",\"shape\":[%s],\"bytes\":%.0f,\"us\":%.2f,\"gbps\":%.1f,"
      "\"copy_gbps\":%.0f,\"floor_us\":%.2f}\n",
      kind, dims.c_str(), bytes, us, bytes / (us * 1e-6) / 1e9, copy_gbs,
      bytes / (copy_gbs * 1e9) * 1e6);
  std::fflush(stdout);
}

struct Ctx {
  int samples;
  double copy_gbs;
  Events& ev;
};

void run_elementwise(int64_t rows, int64_t D, Ctx& c) {
  const int64_t n = rows * D;
  const std::vector<int64_t> shape = {rows, D};
  {
    const double bytes = 3.0 * n * 2;
    const int sets = sets_for(bytes);
    const Pool a(n, sets, 11, 1.0f, true), b(n, sets, 12, 1.0f, true), out(n, sets, 13, 1.0f, true);
    const double us =
        time_us(c.ev, c.samples, sets, [&](int i) { cg::add(out.at(i), a.at(i), b.at(i), n); });
    report("add", shape, bytes, us, c.copy_gbs);
  }
  for (const cg::Act act : {cg::Act::SiLU, cg::Act::GeluTanh}) {
    const bool silu = act == cg::Act::SiLU;
    {
      const double bytes = 3.0 * n * 2;
      const int sets = sets_for(bytes);
      const Pool g(n, sets, 21, 4.0f, true), u(n, sets, 22, 1.0f, true),
          out(n, sets, 23, 1.0f, true);
      const double us = time_us(c.ev, c.samples, sets,
                                [&](int i) { cg::gated_fwd(out.at(i), g.at(i), u.at(i), n, act); });
      report(silu ? "gated_fwd_silu" : "gated_fwd_gelu_tanh", shape, bytes, us, c.copy_gbs);
    }
    {
      const double bytes = 5.0 * n * 2;
      const int sets = sets_for(bytes);
      const Pool d(n, sets, 31, 1.0f, true), g(n, sets, 32, 4.0f, true), u(n, sets, 33, 1.0f, true);
      const Pool dg(n, sets, 34, 1.0f, true), du(n, sets, 35, 1.0f, true);
      const double us = time_us(c.ev, c.samples, sets, [&](int i) {
        cg::gated_bwd(dg.at(i), du.at(i), d.at(i), g.at(i), u.at(i), n, act);
      });
      report(silu ? "gated_bwd_silu" : "gated_bwd_gelu_tanh", shape, bytes, us, c.copy_gbs);
    }
  }
}

void run_norms(int64_t rows, int64_t D, Ctx& c) {
  const int64_t n = rows * D;
  const std::vector<int64_t> shape = {rows, D};
  const Pool w(D, 1, 41, 1.0f, true);
  float* rstd = nullptr;
  LLMK_CUDA_CHECK(cudaMalloc(&rstd, static_cast<size_t>(rows) * sizeof(float)));
  const double extra = D * 2.0 + rows * 4.0;  // w read, rstd written or read
  {
    const double bytes = 2.0 * n * 2 + extra;
    const int sets = sets_for(bytes);
    const Pool x(n, sets, 42, 2.0f, true), y(n, sets, 43, 1.0f, true);
    const double us = time_us(c.ev, c.samples, sets, [&](int i) {
      cg::rms_norm_fwd<bf16>(y.at(i), rstd, x.at(i), nullptr, nullptr, w.at(0), rows, D, kEps);
    });
    report("rms_norm_fwd", shape, bytes, us, c.copy_gbs);
  }
  {
    const double bytes = 4.0 * n * 2 + extra;
    const int sets = sets_for(bytes);
    const Pool x(n, sets, 44, 2.0f, true), r(n, sets, 45, 1.0f, true), sum(n, sets, 46, 1.0f, true),
        y(n, sets, 47, 1.0f);
    const double us = time_us(c.ev, c.samples, sets, [&](int i) {
      cg::rms_norm_fwd(y.at(i), rstd, x.at(i), r.at(i), sum.at(i), w.at(0), rows, D, kEps);
    });
    report("rms_norm_fwd_residual", shape, bytes, us, c.copy_gbs);
  }
  {
    void* ws = nullptr;
    LLMK_CUDA_CHECK(cudaMalloc(&ws, std::max<size_t>(cg::rms_norm_bwd_workspace(rows, D), 16)));
    const Pool dw(D, 1, 48, 1.0f, true);
    for (const bool with_dw : {true, false}) {
      const double bytes = 3.0 * n * 2 + extra + (with_dw ? D * 2.0 : 0.0);
      const int sets = sets_for(bytes);
      const Pool dy(n, sets, 51, 1.0f, true), x(n, sets, 52, 2.0f, true),
          dx(n, sets, 53, 1.0f, true);
      // rstd of set 0's rows (the norm of one set stands for all: only its size matters here).
      cg::rms_norm_fwd<bf16>(dx.at(0), rstd, x.at(0), nullptr, nullptr, w.at(0), rows, D, kEps);
      const double us = time_us(c.ev, c.samples, sets, [&](int i) {
        cg::rms_norm_bwd(dx.at(i), with_dw ? dw.at(0) : nullptr, with_dw ? ws : nullptr, dy.at(i),
                         x.at(i), w.at(0), rstd, rows, D);
      });
      report(with_dw ? "rms_norm_bwd" : "rms_norm_bwd_no_dw", shape, bytes, us, c.copy_gbs);
    }
    LLMK_CUDA_CHECK(cudaFree(ws));
  }
  LLMK_CUDA_CHECK(cudaFree(rstd));
}

void run_rope(int64_t rows, int64_t D, Ctx& c) {
  constexpr int64_t kHead = 128, kHalf = kHead / 2;
  const int64_t B = 4, S = rows / B, H = D / kHead, n = rows * D;
  const std::vector<int64_t> shape = {B, S, H, kHead};
  std::vector<float> cos_host(static_cast<size_t>(S * kHalf)), sin_host(cos_host.size());
  for (int64_t s = 0; s < S; ++s) {
    for (int64_t i = 0; i < kHalf; ++i) {
      const double angle = static_cast<double>(s) * std::pow(1e4, -2.0 * i / kHead);
      cos_host[s * kHalf + i] = static_cast<float>(std::cos(angle));
      sin_host[s * kHalf + i] = static_cast<float>(std::sin(angle));
    }
  }
  float* cs = device_copy(cos_host);
  float* sn = device_copy(sin_host);
  const double bytes = 2.0 * n * 2 + 2.0 * S * kHalf * 4;
  const int sets = sets_for(bytes);
  const Pool x(n, sets, 61, 2.0f, true), y(n, sets, 62, 1.0f, true);
  cg::RopeShape bshd;
  bshd.B = B;
  bshd.S = S;
  bshd.H = H;
  bshd.D = kHead;
  const int64_t st[4] = {S * H * kHead, H * kHead, kHead, 1};
  std::copy(st, st + 4, bshd.x_st);
  std::copy(st, st + 4, bshd.y_st);
  bshd.cs_b = 0;
  bshd.cs_s = kHalf;
  bshd.rot_dim = static_cast<int>(kHead);
  bshd.half_split = true;
  cg::RopeShape bhsd = bshd;  // x laid out [B, H, S, D] (q after HF's transpose), y [B, S, H, D]
  const int64_t st_bhsd[4] = {H * S * kHead, kHead, S * kHead, 1};
  std::copy(st_bhsd, st_bhsd + 4, bhsd.x_st);
  struct Variant {
    const char* kind;
    const cg::RopeShape* shape;
    bool inverse;
  };
  for (const Variant& v : {Variant{"rope_fwd", &bshd, false}, Variant{"rope_bwd", &bshd, true},
                           Variant{"rope_fwd_bhsd_in", &bhsd, false}}) {
    const double us = time_us(c.ev, c.samples, sets, [&](int i) {
      cg::rope_rotate<bf16, float>(y.at(i), x.at(i), cs, sn, *v.shape, v.inverse);
    });
    report(v.kind, shape, bytes, us, c.copy_gbs);
  }
  LLMK_CUDA_CHECK(cudaFree(cs));
  LLMK_CUDA_CHECK(cudaFree(sn));
}

int main_impl(int argc, char** argv) {
  int samples = 21;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--samples") && i + 1 < argc) {
      samples = std::max(3, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: train_ops_bench [--samples N]\n");
      return 2;
    }
  }
  cuda::init();
  Events ev;
  const double copy = copy_rate_gbs(ev, samples);
  std::fprintf(stderr, "device %s, %d SMs, copy rate %.0f GB/s\n", cuda::device_info().name.c_str(),
               cuda::device_info().sm_count, copy);
  Ctx c{samples, copy, ev};
  const int64_t shapes[][2] = {{8192, 4096}, {4096, 8192}, {16384, 2048}};
  for (const auto& s : shapes) {
    run_norms(s[0], s[1], c);
    run_elementwise(s[0], s[1], c);
    run_rope(s[0], s[1], c);
  }
  return 0;
}

}  // namespace
}  // namespace llmk::bench

int main(int argc, char** argv) {
  return llmk::bench::guarded_main("train_ops_bench", llmk::bench::main_impl, argc, argv);
}
