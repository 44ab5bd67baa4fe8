// The element-wise, gather and row-reduction ops on CUDA against the same ops on the CPU, fed
// the same bf16-rounded inputs: embedding, gated_act, add, scale, softmax, argmax, copy and
// kv_append. Ops whose fp32 math is the same on both sides (gathers, copies, add, scale) must
// match the CPU result rounded to bf16 bit for bit; the others use the tolerances of
// ops_gpu_util.h (kBf16Out for bf16 outputs, kF32Out for f32). argmax must match exactly (ties
// included: both sides pick the lowest index). Widths 1, 3, 17, 127, 1000, 4099 and aligned and
// odd-offset views reach both the vector and the element-by-element kernels.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "ops_gpu_util.h"

namespace llmk::gpu_test {
namespace {

constexpr int64_t kWidths[] = {1, 3, 17, 127, 1000, 4099, 4096};
constexpr int64_t kRows[] = {1, 3, 17, 130};

std::string label(const char* op, int64_t rows, int64_t D, int64_t offset) {
  return std::string(op) + " rows=" + std::to_string(rows) + " D=" + std::to_string(D) +
         " offset=" + std::to_string(offset);
}

using CudaOpEmbedding = CudaOpTest;

TEST_F(CudaOpEmbedding, GathersRowsAndZeroesBadIds) {
  uint32_t seed = 1;
  for (int64_t D : {1, 3, 17, 576, 1000, 4096}) {
    for (int64_t offset : {0, 1}) {
      const int64_t V = 50;
      const Tensor table_host = random_host({V, D + 8}, DType::BF16, seed++);
      const std::vector<int32_t> id_values = {7, 0, 49, 7, 23, -1, 50, 12};  // -1, 50: invalid
      const int64_t T = static_cast<int64_t>(id_values.size());
      const Tensor ids = i32_host(id_values).to(Device::CUDA);
      const Tensor table_dev = table_host.to(Device::CUDA);
      Tensor out_dev = poisoned_cuda({T, D + 8}, DType::BF16);
      Tensor out = out_dev.slice(1, offset, offset + D);
      ops::embedding(out, table_dev.slice(1, offset, offset + D), ids);
      const Tensor got = out_dev.to(Device::CPU);
      const Tensor table32 = to_f32(table_host.slice(1, offset, offset + D));
      Tensor ref = Tensor::empty({T, D}, DType::F32);
      for (int64_t t = 0; t < T; ++t) {
        const int32_t id = id_values[static_cast<size_t>(t)];
        for (int64_t d = 0; d < D; ++d) {
          ref.data<float>()[t * D + d] = id >= 0 && id < V ? table32.data<float>()[id * D + d] : 0;
        }
      }
      const std::string what = label("embedding", T, D, offset);
      expect_bf16_exact(got.slice(1, offset, offset + D), ref, what);
      EXPECT_EQ(unpoisoned(got.slice(1, 0, offset)) + unpoisoned(got.slice(1, offset + D, D + 8)),
                0)
          << what;
    }
  }
}

using CudaOpGatedAct = CudaOpTest;

TEST_F(CudaOpGatedAct, MatchesCpu) {
  uint32_t seed = 10;
  for (auto act : {ops::Activation::SiLU, ops::Activation::GeluTanh}) {
    for (int64_t rows : kRows) {
      for (int64_t F : kWidths) {
        for (int64_t offset : {0, 1}) {
          const std::string what =
              label(act == ops::Activation::SiLU ? "silu" : "gelu", rows, F, offset);
          // gate and up: the halves of a fused [rows, 2F + 8] projection output.
          const Tensor gu_host = random_host({rows, 2 * F + 8}, DType::BF16, seed++, -6, 6);
          const Tensor gu = gu_host.to(Device::CUDA);
          const Tensor gate = gu.slice(1, offset, offset + F);
          const Tensor up = gu.slice(1, F + offset, F + offset + F);
          Tensor out_dev = poisoned_cuda({rows, F + 8}, DType::BF16);
          Tensor out = out_dev.slice(1, offset, offset + F);
          ops::gated_act(out, gate, up, act);
          Tensor ref = Tensor::empty({rows, F}, DType::F32);
          ops::gated_act(ref, to_f32(gu_host.slice(1, offset, offset + F)),
                         to_f32(gu_host.slice(1, F + offset, F + offset + F)), act);
          const Tensor got = out_dev.to(Device::CPU);
          expect_close(got.slice(1, offset, offset + F), ref, kBf16Out, what);
          EXPECT_EQ(
              unpoisoned(got.slice(1, 0, offset)) + unpoisoned(got.slice(1, offset + F, F + 8)), 0)
              << what;
        }
      }
    }
  }
  // In place over gate (out and gate the same view; up in another buffer: the ops' overlap
  // check compares byte spans, so halves of one fused row buffer count as overlapping).
  const Tensor g_host = random_host({5, 136}, DType::BF16, 77, -4, 4);
  const Tensor u_host = random_host({5, 128}, DType::BF16, 78, -4, 4);
  Tensor g_dev = g_host.to(Device::CUDA);
  Tensor gate = g_dev.slice(1, 8, 136);
  ops::gated_act(gate, gate, u_host.to(Device::CUDA), ops::Activation::SiLU);
  Tensor ref = Tensor::empty({5, 128}, DType::F32);
  ops::gated_act(ref, to_f32(g_host.slice(1, 8, 136)), to_f32(u_host), ops::Activation::SiLU);
  expect_close(g_dev.to(Device::CPU).slice(1, 8, 136), ref, kBf16Out, "silu in place");
}

using CudaOpAddScale = CudaOpTest;

TEST_F(CudaOpAddScale, MatchCpuBitForBit) {
  uint32_t seed = 20;
  for (int64_t rows : kRows) {
    for (int64_t D : kWidths) {
      for (int64_t offset : {0, 1}) {
        const std::string what = label("add", rows, D, offset);
        const Tensor a_host = random_host({rows, D + 8}, DType::BF16, seed++, -3, 3);
        const Tensor b_host = random_host({rows, D + 8}, DType::BF16, seed++, -3, 3);
        const Tensor a = a_host.to(Device::CUDA), b = b_host.to(Device::CUDA);
        Tensor out_dev = poisoned_cuda({rows, D + 8}, DType::BF16);
        Tensor out = out_dev.slice(1, offset, offset + D);
        const auto cols = [&](const Tensor& t) { return t.slice(1, offset, offset + D); };
        ops::add(out, cols(a), cols(b));
        Tensor ref = Tensor::empty({rows, D}, DType::F32);
        ops::add(ref, to_f32(cols(a_host)), to_f32(cols(b_host)));
        Tensor got = out_dev.to(Device::CPU);
        expect_bf16_exact(cols(got), ref, what);
        EXPECT_EQ(unpoisoned(got.slice(1, 0, offset)) + unpoisoned(got.slice(1, offset + D, D + 8)),
                  0)
            << what;
        // In place on a, then scale a.
        Tensor a_view = cols(a);
        ops::add(a_view, a_view, cols(b));
        ops::scale(a_view, -0.37f);
        Tensor sum_bf16 = Tensor::empty({rows, D}, DType::BF16);
        ops::copy(sum_bf16, ref);  // the stored sum
        Tensor scaled = to_f32(sum_bf16);
        ops::scale(scaled, -0.37f);
        got = a.to(Device::CPU);
        expect_bf16_exact(cols(got), scaled, label("add in place + scale", rows, D, offset));
      }
    }
  }
  // Leading dims that do not merge: a [2, 3, 40] view of a [2, 4, 48] buffer, several runs.
  const Tensor x_host = random_host({2, 4, 48}, DType::BF16, 99);
  Tensor x_dev = x_host.to(Device::CUDA);
  Tensor x = x_dev.slice(1, 1, 4).slice(2, 8, 48);
  ops::scale(x, 3.0f);
  Tensor ref = to_f32(x_host.slice(1, 1, 4).slice(2, 8, 48));
  ops::scale(ref, 3.0f);
  const Tensor got = x_dev.to(Device::CPU);
  expect_bf16_exact(got.slice(1, 1, 4).slice(2, 8, 48), ref, "scale 3-d view");
  EXPECT_EQ(compare(got.slice(1, 0, 1), x_host.slice(1, 0, 1)).max_abs, 0.0);
}

using CudaOpSoftmax = CudaOpTest;

TEST_F(CudaOpSoftmax, MatchesCpuForEveryDtypePair) {
  uint32_t seed = 30;
  for (DType xt : {DType::F32, DType::BF16}) {
    for (DType ot : {DType::F32, DType::BF16}) {
      for (int64_t rows : {1, 3, 17}) {
        for (int64_t N : {1, 3, 17, 127, 1000, 4099, 32001}) {
          const std::string what = std::string("softmax ") + std::string(dtype_name(xt)) + "->" +
                                   std::string(dtype_name(ot)) + " rows=" + std::to_string(rows) +
                                   " N=" + std::to_string(N);
          const Tensor x_host = random_host({rows, N + 3}, xt, seed++, -12, 12);
          const Tensor x_dev = x_host.to(Device::CUDA);
          Tensor out_dev = poisoned_cuda({rows, N + 3}, ot);
          Tensor out = out_dev.slice(1, 1, N + 1);
          ops::softmax(out, x_dev.slice(1, 1, N + 1));
          Tensor ref = Tensor::empty({rows, N}, DType::F32);
          ops::softmax(ref, to_f32(x_host.slice(1, 1, N + 1)));
          const Tensor got = out_dev.to(Device::CPU);
          expect_close(got.slice(1, 1, N + 1), ref, ot == DType::BF16 ? kBf16Out : kF32Out, what);
          EXPECT_EQ(unpoisoned(got.slice(1, 0, 1)) + unpoisoned(got.slice(1, N + 1, N + 3)), 0)
              << what;
        }
      }
    }
  }
  // In place, with -inf entries (masked logits).
  Tensor x_host = random_host({2, 100}, DType::F32, 31, -5, 5);
  for (int64_t i = 0; i < 100; i += 3) x_host.data<float>()[i] = -INFINITY;
  Tensor x = x_host.to(Device::CUDA);
  ops::softmax(x, x);
  Tensor ref = Tensor::empty({2, 100}, DType::F32);
  ops::softmax(ref, x_host);
  expect_close(x.to(Device::CPU), ref, kF32Out, "softmax in place with -inf");
}

using CudaOpArgmax = CudaOpTest;

TEST_F(CudaOpArgmax, MatchesCpuExactly) {
  uint32_t seed = 40;
  for (DType xt : {DType::F32, DType::BF16}) {
    for (int64_t rows : {1, 3, 17}) {
      for (int64_t N : {1, 3, 17, 127, 1000, 4099, 32000, 262144}) {
        for (int64_t offset : {0, 1}) {
          const std::string what = std::string("argmax ") + std::string(dtype_name(xt)) +
                                   " rows=" + std::to_string(rows) + " N=" + std::to_string(N) +
                                   " offset=" + std::to_string(offset);
          // bf16 inputs in [-8, 8) repeat values often: ties for the maximum are common, and
          // one row gets an explicit tie far apart.
          Tensor x_host = random_host({rows, N + 8}, xt, seed++, -8, 8);
          if (N > 2) {
            const float big = 9.0f;
            for (int64_t i : {offset + N - 1, offset + N / 2}) {
              if (xt == DType::F32) {
                x_host.data<float>()[i] = big;
              } else {
                x_host.data<uint16_t>()[i] = float_to_bf16(big);
              }
            }
          }
          const Tensor x_dev = x_host.to(Device::CUDA);
          Tensor out = poisoned_cuda({rows}, DType::I32);
          ops::argmax(out, x_dev.slice(1, offset, offset + N));
          Tensor ref = Tensor::empty({rows}, DType::I32);
          ops::argmax(ref, to_f32(x_host.slice(1, offset, offset + N)));
          const Tensor got = out.to(Device::CPU);
          for (int64_t r = 0; r < rows; ++r) {
            ASSERT_EQ(got.data<int32_t>()[r], ref.data<int32_t>()[r]) << what << " row " << r;
          }
          if (N > 2) {
            EXPECT_EQ(got.data<int32_t>()[0], N / 2) << what << ": the first of a tie";
          }
        }
      }
    }
  }
  // NaN counts as -inf; rows of -inf give 0.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor x_host = Tensor::empty({3, 5}, DType::F32);
  const float vals[15] = {nan,       -1,        4,   4,   nan, -INFINITY, -INFINITY, -INFINITY,
                          -INFINITY, -INFINITY, nan, nan, nan, -INFINITY, -3};
  std::copy(vals, vals + 15, x_host.data<float>());
  Tensor out = poisoned_cuda({3}, DType::I32);
  ops::argmax(out, x_host.to(Device::CUDA));
  const Tensor got = out.to(Device::CPU);
  EXPECT_EQ(got.data<int32_t>()[0], 2);
  EXPECT_EQ(got.data<int32_t>()[1], 0);
  EXPECT_EQ(got.data<int32_t>()[2], 4);
}

using CudaOpCopy = CudaOpTest;

TEST_F(CudaOpCopy, ConvertsStridedViews) {
  uint32_t seed = 50;
  const DType types[] = {DType::F32, DType::F16, DType::BF16};
  for (DType st : types) {
    for (DType dt : types) {
      const std::string pair = std::string(dtype_name(st)) + "->" + std::string(dtype_name(dt));
      // 1-D contiguous, a 2-D transpose, a 3-D sliced view, a 4-D permutation.
      const Tensor a_host = random_host({4099}, st, seed++, -100, 100);
      const Tensor b_host = random_host({17, 33}, st, seed++, -100, 100);
      const Tensor c_host = random_host({5, 7, 130}, st, seed++, -100, 100);
      const Tensor e_host = random_host({3, 4, 5, 6}, st, seed++, -100, 100);
      struct Case {
        const char* name;
        Tensor src_host;
        std::function<Tensor(const Tensor&)> view;  // applied to the whole source buffer
      };
      const Case cases[] = {
          {"1-d", a_host, [](const Tensor& t) { return t; }},
          {"2-d transposed", b_host, [](const Tensor& t) { return t.transpose(0, 1); }},
          {"3-d sliced", c_host, [](const Tensor& t) { return t.slice(1, 2, 6).slice(2, 1, 128); }},
          {"4-d permuted", e_host,
           [](const Tensor& t) { return t.transpose(0, 3).transpose(1, 2); }},
      };
      for (const Case& c : cases) {
        const Tensor src_dev_buf = c.src_host.to(Device::CUDA);
        const Tensor src = c.view(src_dev_buf);
        // dst: a padded row-major buffer viewed to src's shape (last dim sliced).
        Shape padded = src.shape();
        padded.back() += 3;
        Tensor dst_buf = poisoned_cuda(padded, dt);
        Tensor dst = dst_buf.slice(src.ndim() - 1, 1, 1 + src.dim(-1));
        ops::copy(dst, src);
        const Tensor got = dst_buf.to(Device::CPU);
        const Tensor src_host = c.view(c.src_host);
        Tensor want = Tensor::empty(src.shape(), dt);
        ops::copy(want, src_host);  // the CPU conversion: round to nearest even
        const Tensor got_view = got.slice(src.ndim() - 1, 1, 1 + src.dim(-1)).contiguous();
        const Tensor want_c = want.contiguous();
        EXPECT_EQ(std::memcmp(got_view.data(), want_c.data(), static_cast<size_t>(want_c.nbytes())),
                  0)
            << pair << " " << c.name;
        EXPECT_EQ(unpoisoned(got) - got_view.numel(), 0) << pair << " " << c.name;
      }
    }
  }
  // Same-dtype copies of i32 and of a block type (bytes).
  const Tensor ids = i32_host({5, -3, 7, 1 << 30});
  Tensor ids_dev = poisoned_cuda({4}, DType::I32);
  ops::copy(ids_dev, ids.to(Device::CUDA));
  const Tensor ids_back = ids_dev.to(Device::CPU);
  for (int k = 0; k < 4; ++k) EXPECT_EQ(ids_back.data<int32_t>()[k], ids.data<int32_t>()[k]);
  Tensor q = Tensor::empty({2, 64}, DType::Q8_0);
  for (int64_t i = 0; i < q.nbytes(); ++i) q.data<uint8_t>()[i] = static_cast<uint8_t>(i * 7);
  Tensor q_dev = Tensor::empty({2, 64}, DType::Q8_0, Device::CUDA);
  ops::copy(q_dev, q.to(Device::CUDA));
  const Tensor q_back = q_dev.to(Device::CPU);
  EXPECT_EQ(std::memcmp(q_back.data(), q.data(), static_cast<size_t>(q.nbytes())), 0);
}

using CudaOpKvAppend = CudaOpTest;

TEST_F(CudaOpKvAppend, WritesRowsAtDevicePositions) {
  uint32_t seed = 60;
  for (DType src_type : {DType::BF16, DType::F32}) {
    for (int64_t D : {3, 64, 128}) {
      for (bool interleaved : {false, true}) {
        const int64_t L = 40, H = 3;
        const std::string what = std::string("kv_append ") + std::string(dtype_name(src_type)) +
                                 " D=" + std::to_string(D) + (interleaved ? " interleaved" : "");
        // Caches: separate [L, H, D] tensors, or k/v halves of one [L, 2, H, D] buffer.
        const Tensor kv_host = random_host({L, 2, H, D}, DType::BF16, seed++);
        Tensor kv_dev = kv_host.to(Device::CUDA);
        Tensor kc_sep = kv_host.select(1, 0).contiguous().to(Device::CUDA);
        Tensor vc_sep = kv_host.select(1, 1).contiguous().to(Device::CUDA);
        Tensor kc = interleaved ? kv_dev.select(1, 0) : kc_sep;
        Tensor vc = interleaved ? kv_dev.select(1, 1) : vc_sep;
        // k, v: heads of a fused [T, 3H, D] projection.
        const std::vector<int32_t> pos_values = {17, 3, 39, 0, 25};
        const int64_t T = static_cast<int64_t>(pos_values.size());
        const Tensor qkv_host = random_host({T, 3 * H, D}, src_type, seed++);
        const Tensor qkv = qkv_host.to(Device::CUDA);
        ops::kv_append(kc, vc, qkv.slice(1, H, 2 * H), qkv.slice(1, 2 * H, 3 * H),
                       i32_host(pos_values).to(Device::CUDA));
        // CPU: the same append into f32 copies of the caches, then rounded to bf16.
        Tensor kc_ref = to_f32(kv_host.select(1, 0)), vc_ref = to_f32(kv_host.select(1, 1));
        ops::kv_append(kc_ref, vc_ref, to_f32(qkv_host.slice(1, H, 2 * H)),
                       to_f32(qkv_host.slice(1, 2 * H, 3 * H)), i32_host(pos_values));
        const Tensor kc_got =
            interleaved ? kv_dev.to(Device::CPU).select(1, 0) : kc.to(Device::CPU);
        const Tensor vc_got =
            interleaved ? kv_dev.to(Device::CPU).select(1, 1) : vc.to(Device::CPU);
        expect_bf16_exact(kc_got, kc_ref, what + " (k)");
        expect_bf16_exact(vc_got, vc_ref, what + " (v)");
      }
    }
  }
}

TEST_F(CudaOpKvAppend, PositionOutsideTheCacheWritesNothing) {
  const Tensor kc_host = random_host({8, 2, 16}, DType::BF16, 70);
  Tensor kc = kc_host.to(Device::CUDA), vc = kc_host.to(Device::CUDA);
  const Tensor k = random_host({2, 2, 16}, DType::BF16, 71).to(Device::CUDA);
  ops::kv_append(kc, vc, k, k, i32_host({8, -1}).to(Device::CUDA));
  EXPECT_EQ(compare(kc.to(Device::CPU), kc_host).max_abs, 0.0);
  EXPECT_EQ(compare(vc.to(Device::CPU), kc_host).max_abs, 0.0);
}

using CudaOpDispatch = CudaOpTest;

TEST_F(CudaOpDispatch, DtypeAndDeviceErrors) {
  Tensor x = Tensor::empty({2, 16}, DType::F32, Device::CUDA);
  Tensor xb = Tensor::empty({2, 16}, DType::BF16, Device::CUDA);
  Tensor w = Tensor::empty({16}, DType::F32, Device::CUDA);
  Tensor w_host = Tensor::empty({16}, DType::F32);
  auto message = [](const std::function<void()>& fn) -> std::string {
    try {
      fn();
    } catch (const Error& e) {
      return e.what();
    }
    return "<no llmk::Error thrown>";
  };
  // Any of bf16, f16 and f32 (the activation dtypes), but one of them for all of a call's tensors.
  Tensor out16 = Tensor::empty({2, 16}, DType::F16, Device::CUDA);
  EXPECT_NE(message([&] { ops::rms_norm(out16, x, w, 1e-6f); }).find("must share one dtype"),
            std::string::npos);
  Tensor xi = Tensor::empty({2, 16}, DType::I32, Device::CUDA);
  EXPECT_NE(message([&] { ops::rms_norm(xi, xi, w, 1e-6f); }).find("must be bf16, f16 or f32"),
            std::string::npos);
  EXPECT_NE(message([&] { ops::rms_norm(xb, xb, w_host, 1e-6f); }).find("one device"),
            std::string::npos);
  Tensor ids = Tensor::empty({2}, DType::I32, Device::CUDA);
  Tensor x16 = Tensor::empty({2, 16}, DType::F16, Device::CUDA);
  EXPECT_NE(message([&] { ops::argmax(ids, x16); }).find("must be f32 or bf16"), std::string::npos);
}

}  // namespace
}  // namespace llmk::gpu_test
