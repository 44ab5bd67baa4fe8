// ops::attention on the GPU (bf16, the prefill and decode kernels) against the CPU op (f32) on the
// same inputs: fresh random q, k, v rounded to bf16 before the CPU reference sees them, so the
// comparison measures the kernels, not the input rounding. Outputs are poisoned with NaN first,
// and cache rows past the last position hold NaN, so an unwritten output or a key read past a
// query's position shows up as NaN. Also: a captured decode step replayed at new positions.
//
// Tolerance: gpu_test::kAttentionOut (ops_gpu_util.h), relative L2 error <= 1e-2 and
// max |gpu - cpu| <= 1e-2 max |cpu|: the bf16 rounding of the output and of the softmax weights
// the tensor cores multiply, both relative to the outputs, which shrink as the context grows.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/cuda/check.h"
#include "core/cuda/device.h"
#include "core/cuda/stream.h"
#include "core/error.h"
#include "core/half.h"
#include "core/tensor.h"
#include "ops/ops.h"
#include "ops_gpu_util.h"

namespace llmk {
namespace {

constexpr uint16_t kBf16NaN = 0x7fc0;

using gpu_test::error_message;

std::vector<float> random_bf16_values(size_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = bf16_to_float(float_to_bf16(dist(rng)));
  return v;
}

Tensor host_f32(const Shape& shape, const std::vector<float>& v) {
  Tensor t = Tensor::empty(shape, DType::F32);
  std::copy(v.begin(), v.end(), t.data<float>());
  return t;
}

Tensor device_bf16(const Shape& shape, const std::vector<float>& v) {
  Tensor h = Tensor::empty(shape, DType::BF16);
  for (size_t i = 0; i < v.size(); ++i) h.data<uint16_t>()[i] = float_to_bf16(v[i]);
  return h.to(Device::CUDA);
}

Tensor device_nan_bf16(const Shape& shape) {
  Tensor h = Tensor::empty(shape, DType::BF16);
  std::fill(h.data<uint16_t>(), h.data<uint16_t>() + h.numel(), kBf16NaN);
  return h.to(Device::CUDA);
}

Tensor positions_tensor(int64_t pos0, int64_t T, Device device) {
  Tensor p = Tensor::empty({T}, DType::I32);
  for (int64_t t = 0; t < T; ++t) p.data<int32_t>()[t] = static_cast<int32_t>(pos0 + t);
  return device == Device::CPU ? p : p.to(device);
}

std::vector<float> download(const Tensor& bf16_device) {
  const Tensor h = bf16_device.to(Device::CPU);
  std::vector<float> v(static_cast<size_t>(h.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = bf16_to_float(h.data<uint16_t>()[i]);
  return v;
}

// Compares got (T * Hq rows of D values, row r at got[r * row_pitch]) with the reference.
void expect_close(const std::vector<float>& got, int64_t row_pitch, const std::vector<float>& ref,
                  int64_t D) {
  gpu_test::DiffAccumulator acc;
  const int64_t rows = static_cast<int64_t>(ref.size()) / D;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t d = 0; d < D; ++d) {
      acc.add(got[static_cast<size_t>(r * row_pitch + d)], ref[static_cast<size_t>(r * D + d)]);
    }
  }
  const gpu_test::Diff e = acc.result();
  ASSERT_EQ(e.nonfinite, 0) << "non-finite outputs, the first at element " << e.first_nonfinite;
  ASSERT_GT(e.max_ref, 0.0) << "reference output is all zeros: the test would pass vacuously";
  gpu_test::expect_within(e, gpu_test::kAttentionOut, "attention output");
}

class AttentionGpu : public ::testing::Test {
 protected:
  void SetUp() override { cuda::init(); }
};

struct Case {
  int64_t T, pos0, Hq, Hkv, D;
  int window = 0;
  float softcap = 0.0f;
  int64_t spare = 5;     // cache rows past the last position (NaN)
  bool strided = false;  // k, v views of one [L, 2, Hkv, D] buffer; out with head stride D + 8
};

std::string describe(const Case& c) {
  char buf[200];
  std::snprintf(
      buf, sizeof buf, "T=%lld pos0=%lld Hq/Hkv=%lld/%lld D=%lld window=%d softcap=%g spare=%lld%s",
      static_cast<long long>(c.T), static_cast<long long>(c.pos0), static_cast<long long>(c.Hq),
      static_cast<long long>(c.Hkv), static_cast<long long>(c.D), c.window,
      static_cast<double>(c.softcap), static_cast<long long>(c.spare), c.strided ? " strided" : "");
  return buf;
}

void run_case(const Case& c, uint32_t seed) {
  SCOPED_TRACE(describe(c));
  const int64_t L = c.pos0 + c.T + c.spare;
  const int64_t T = c.T, D = c.D, Hq = c.Hq, Hkv = c.Hkv;
  const size_t kv_n = static_cast<size_t>(L * Hkv * D);
  // Larger q with a softcap, so tanh bends the logits noticeably.
  const float qa = c.softcap > 0.0f ? 8.0f : 3.0f;
  const std::vector<float> q = random_bf16_values(static_cast<size_t>(T * Hq * D), seed, -qa, qa);
  std::vector<float> k = random_bf16_values(kv_n, seed + 1, -1, 1);
  std::vector<float> v = random_bf16_values(kv_n, seed + 2, -1, 1);
  const size_t valid = static_cast<size_t>((c.pos0 + T) * Hkv * D);
  std::fill(k.begin() + static_cast<ptrdiff_t>(valid), k.end(), NAN);
  std::fill(v.begin() + static_cast<ptrdiff_t>(valid), v.end(), NAN);

  ops::AttentionParams p;
  p.window = c.window;
  p.softcap = c.softcap;

  // CPU reference on the bf16-rounded values.
  Tensor out_ref = Tensor::empty({T, Hq, D}, DType::F32);
  ops::attention(out_ref, host_f32({T, Hq, D}, q), host_f32({L, Hkv, D}, k),
                 host_f32({L, Hkv, D}, v), positions_tensor(c.pos0, T, Device::CPU), p);
  const std::vector<float> ref(out_ref.data<float>(), out_ref.data<float>() + out_ref.numel());

  const Tensor qg = device_bf16({T, Hq, D}, q);
  Tensor kv_joint, kg, vg;
  if (c.strided) {
    std::vector<float> joint(2 * kv_n);
    for (int64_t j = 0; j < L; ++j) {
      for (int64_t i = 0; i < Hkv * D; ++i) {
        joint[static_cast<size_t>((2 * j) * Hkv * D + i)] = k[static_cast<size_t>(j * Hkv * D + i)];
        joint[static_cast<size_t>((2 * j + 1) * Hkv * D + i)] =
            v[static_cast<size_t>(j * Hkv * D + i)];
      }
    }
    kv_joint = device_bf16({L, 2, Hkv, D}, joint);
    kg = kv_joint.select(1, 0);
    vg = kv_joint.select(1, 1);
  } else {
    kg = device_bf16({L, Hkv, D}, k);
    vg = device_bf16({L, Hkv, D}, v);
  }
  const int64_t pitch = c.strided ? D + 8 : D;
  Tensor out_buf = device_nan_bf16({T, Hq, pitch});
  Tensor out = c.strided ? out_buf.slice(2, 0, D) : out_buf;
  const Tensor pos = positions_tensor(c.pos0, T, Device::CUDA);

  ops::attention(out, qg, kg, vg, pos, p);
  const std::vector<float> got = download(out_buf);
  expect_close(got, pitch, ref, D);
  if (c.strided) {
    for (int64_t r = 0; r < T * Hq; ++r) {
      for (int64_t d = D; d < pitch; ++d) {
        ASSERT_TRUE(std::isnan(got[static_cast<size_t>(r * pitch + d)]))
            << "padding of out row " << r << " was written";
      }
    }
  }
}

// T > 8: the prefill kernel.
TEST_F(AttentionGpu, PrefillMatchesCpu) {
  const Case cases[] = {
      {.T = 17, .pos0 = 0, .Hq = 8, .Hkv = 8, .D = 64},
      {.T = 127, .pos0 = 0, .Hq = 32, .Hkv = 8, .D = 128},
      {.T = 1000, .pos0 = 0, .Hq = 14, .Hkv = 2, .D = 128, .window = 300},
      {.T = 127, .pos0 = 0, .Hq = 9, .Hkv = 3, .D = 256, .softcap = 30.0f},
      {.T = 17, .pos0 = 1000, .Hq = 32, .Hkv = 8, .D = 128},
      {.T = 127, .pos0 = 17, .Hq = 14, .Hkv = 2, .D = 64, .window = 37, .softcap = 5.0f},
      {.T = 1000, .pos0 = 127, .Hq = 8, .Hkv = 8, .D = 256},
      {.T = 17, .pos0 = 127, .Hq = 9, .Hkv = 3, .D = 256, .window = 100},
      {.T = 1000, .pos0 = 17, .Hq = 9, .Hkv = 3, .D = 64, .window = 1},
      {.T = 127, .pos0 = 1, .Hq = 32, .Hkv = 8, .D = 128, .softcap = 50.0f, .strided = true},
      {.T = 9, .pos0 = 3, .Hq = 14, .Hkv = 2, .D = 256, .spare = 3000},
      {.T = 4099, .pos0 = 0, .Hq = 8, .Hkv = 8, .D = 64, .window = 2048},
  };
  uint32_t seed = 100;
  for (const Case& c : cases) {
    run_case(c, seed += 10);
    if (HasFatalFailure()) return;
  }
}

// T <= 8: the decode kernel (cache fills 1, 17, 127, 1000, 4099).
TEST_F(AttentionGpu, DecodeMatchesCpu) {
  const Case cases[] = {
      {.T = 1, .pos0 = 0, .Hq = 8, .Hkv = 8, .D = 64},
      {.T = 1, .pos0 = 16, .Hq = 32, .Hkv = 8, .D = 128, .softcap = 5.0f},
      {.T = 1, .pos0 = 126, .Hq = 14, .Hkv = 2, .D = 256, .window = 50},
      {.T = 1, .pos0 = 999, .Hq = 9, .Hkv = 3, .D = 128},
      {.T = 1, .pos0 = 4098, .Hq = 32, .Hkv = 8, .D = 128},
      {.T = 1, .pos0 = 4098, .Hq = 8, .Hkv = 8, .D = 256, .window = 1000, .softcap = 50.0f},
      {.T = 8, .pos0 = 1000, .Hq = 14, .Hkv = 2, .D = 64, .window = 300},
      {.T = 2, .pos0 = 0, .Hq = 9, .Hkv = 3, .D = 256},
      {.T = 8, .pos0 = 0, .Hq = 32, .Hkv = 8, .D = 128},
      {.T = 5, .pos0 = 999, .Hq = 8, .Hkv = 8, .D = 256, .softcap = 30.0f},
      {.T = 3, .pos0 = 127, .Hq = 32, .Hkv = 8, .D = 64, .window = 64, .strided = true},
      {.T = 1, .pos0 = 10, .Hq = 32, .Hkv = 8, .D = 128, .spare = 4000},  // mostly empty cache
      {.T = 1, .pos0 = 1000, .Hq = 14, .Hkv = 2, .D = 128, .window = 1},
  };
  uint32_t seed = 500;
  for (const Case& c : cases) {
    run_case(c, seed += 10);
    if (HasFatalFailure()) return;
  }
}

TEST_F(AttentionGpu, ArgumentErrors) {
  // Head dims past the fallback kernel's 256 (80 runs there).
  const Tensor q = device_bf16({1, 4, 264}, random_bf16_values(4 * 264, 1, -1, 1));
  const Tensor k = device_bf16({8, 2, 264}, random_bf16_values(8 * 2 * 264, 2, -1, 1));
  Tensor out = device_nan_bf16({1, 4, 264});
  const Tensor pos = positions_tensor(3, 1, Device::CUDA);
  EXPECT_NE(error_message([&] { ops::attention(out, q, k, k, pos, {}); }).find("head dim 264"),
            std::string::npos);

  const Tensor q64 = device_bf16({1, 4, 64}, random_bf16_values(4 * 64, 3, -1, 1));
  const Tensor k64 = device_bf16({8, 2, 64}, random_bf16_values(8 * 2 * 64, 4, -1, 1));
  Tensor out64 = device_nan_bf16({1, 4, 64});
  const std::string host_pos = error_message(
      [&] { ops::attention(out64, q64, k64, k64, positions_tensor(3, 1, Device::CPU), {}); });
  EXPECT_NE(host_pos.find("positions"), std::string::npos) << host_pos;
  EXPECT_NE(host_pos.find("one device"), std::string::npos) << host_pos;

  Tensor q_f32 = Tensor::zeros({1, 4, 64}, DType::F32).to(Device::CUDA);
  const std::string f32 = error_message([&] { ops::attention(out64, q_f32, k64, k64, pos, {}); });
  EXPECT_NE(f32.find("bf16"), std::string::npos) << f32;
}

// One decode step captured in a CUDA graph, replayed after the device positions change, equals
// a fresh launch bit for bit and matches the CPU at every position.
TEST_F(AttentionGpu, CapturedDecodeReplaysAtNewPositions) {
  const int64_t Hq = 32, Hkv = 8, D = 128, L = 600;
  for (const int64_t T : {int64_t{1}, int64_t{3}, int64_t{17}}) {
    SCOPED_TRACE("T=" + std::to_string(T));
    const std::vector<float> q = random_bf16_values(static_cast<size_t>(T * Hq * D), 7, -3, 3);
    const std::vector<float> k = random_bf16_values(static_cast<size_t>(L * Hkv * D), 8, -1, 1);
    const std::vector<float> v = random_bf16_values(static_cast<size_t>(L * Hkv * D), 9, -1, 1);
    const Tensor qg = device_bf16({T, Hq, D}, q), kg = device_bf16({L, Hkv, D}, k),
                 vg = device_bf16({L, Hkv, D}, v);
    Tensor pos = positions_tensor(5, T, Device::CUDA);
    Tensor out_graph = device_nan_bf16({T, Hq, D}), out_fresh = device_nan_bf16({T, Hq, D});
    ops::attention(out_fresh, qg, kg, vg, pos, {});  // first launch outside the capture
    cuda::synchronize();

    cudaStream_t stream = cuda::current_stream();
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    LLMK_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    ops::attention(out_graph, qg, kg, vg, pos, {});
    LLMK_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    LLMK_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));

    for (const int64_t pos0 : {int64_t{5}, int64_t{77}, int64_t{300}, L - T}) {
      SCOPED_TRACE("pos0=" + std::to_string(pos0));
      const Tensor host_pos = positions_tensor(pos0, T, Device::CPU);
      cuda::memcpy_sync(pos.data(), host_pos.data(), static_cast<size_t>(T) * sizeof(int32_t),
                        cudaMemcpyHostToDevice);
      LLMK_CUDA_CHECK(cudaMemsetAsync(out_graph.data(), 0xff, out_graph.nbytes(), stream));  // NaN
      LLMK_CUDA_CHECK(cudaGraphLaunch(exec, stream));
      ops::attention(out_fresh, qg, kg, vg, pos, {});
      cuda::synchronize();
      const std::vector<float> g = download(out_graph), f = download(out_fresh);
      for (size_t i = 0; i < g.size(); ++i) {
        ASSERT_EQ(float_to_bits(g[i]), float_to_bits(f[i])) << "element " << i;
      }
      Tensor ref = Tensor::empty({T, Hq, D}, DType::F32);
      ops::attention(ref, host_f32({T, Hq, D}, q), host_f32({L, Hkv, D}, k),
                     host_f32({L, Hkv, D}, v), host_pos, {});
      expect_close(g, D, std::vector<float>(ref.data<float>(), ref.data<float>() + ref.numel()), D);
    }
    LLMK_CUDA_CHECK(cudaGraphExecDestroy(exec));
    LLMK_CUDA_CHECK(cudaGraphDestroy(graph));
  }
}

}  // namespace
}  // namespace llmk
