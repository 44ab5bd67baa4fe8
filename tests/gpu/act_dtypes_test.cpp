// The engine's CUDA ops at fp16 and f32 activations (LoadOptions::dtype), against the same ops
// on the CPU fed the inputs rounded to that dtype (as ops_gpu_util.h's convention). Widths and
// offsets take both the 16-byte vector kernels and the element-by-element ones.
//
// Tolerances: f32 outputs, kF32Out (fp32 math in another order). fp16 outputs of fp32 math:
// fp16 keeps 11 significant bits, so one rounding is at most 2^-11 = 4.9e-4 of the value;
// scaled from the bf16 bound (kBf16Out: rel L2 1.15 x 2^-8, max abs 2 x 2^-8), rel L2 <= 6e-4
// and max abs <= 2^-10 of max |ref|.
#include <gtest/gtest.h>

#include <string>

#include "ops_gpu_util.h"

namespace llmk::gpu_test {
namespace {

constexpr Tolerance kF16Out{6e-4, 1.0 / 1024};

class CudaActDtype : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { cuda::init(); }
  DType dt() const { return GetParam(); }
  const Tolerance& tol() const { return dt() == DType::F32 ? kF32Out : kF16Out; }
  // Random host data in the activation dtype, and its f32 copy (the CPU's input).
  Tensor random(const Shape& s, uint32_t seed, float lo = -2, float hi = 2) const {
    return random_host(s, dt(), seed, lo, hi);
  }
  std::string what(const std::string& op) const {
    return op + " (" + std::string(dtype_name(dt())) + ")";
  }
};

TEST_P(CudaActDtype, NormsAndMapsMatchCpu) {
  uint32_t seed = 100;
  for (int64_t rows : {1, 5}) {
    for (int64_t D : {3, 127, 576, 4099}) {
      for (int64_t off : {0, 1}) {
        const std::string shape = " rows=" + std::to_string(rows) + " D=" + std::to_string(D) +
                                  " off=" + std::to_string(off);
        const Tensor x_host = random({rows, D + 8}, seed++), d_host = random({rows, D + 8}, seed++);
        const Tensor w_host = random_host({D}, DType::F32, seed++);
        const Tensor xs = x_host.slice(1, off, off + D), ds = d_host.slice(1, off, off + D);
        const Tensor w = w_host.to(Device::CUDA);
        {  // rms_norm
          const Tensor x = x_host.to(Device::CUDA);
          Tensor out_dev = poisoned_cuda({rows, D + 8}, dt());
          Tensor out = out_dev.slice(1, off, off + D);
          ops::rms_norm(out, x.slice(1, off, off + D), w, 1e-5f, false);
          Tensor ref = Tensor::empty({rows, D}, DType::F32);
          ops::rms_norm(ref, to_f32(xs), w_host, 1e-5f, false);
          expect_close(out_dev.to(Device::CPU).slice(1, off, off + D), ref, tol(),
                       what("rms_norm") + shape);
        }
        {  // add_rms_norm: x += delta (rounded to dt), then the norm of the rounded sum
          Tensor x = x_host.to(Device::CUDA);
          const Tensor delta = d_host.to(Device::CUDA);
          Tensor out = poisoned_cuda({rows, D}, dt());
          Tensor xv = x.slice(1, off, off + D);
          ops::add_rms_norm(xv, delta.slice(1, off, off + D), out, w, 1e-5f, true);
          Tensor sum = Tensor::empty({rows, D}, DType::F32);
          ops::add(sum, to_f32(xs), to_f32(ds));
          Tensor sum_dt = Tensor::empty({rows, D}, dt());
          ops::copy(sum_dt, sum);
          Tensor ref = Tensor::empty({rows, D}, DType::F32);
          ops::rms_norm(ref, to_f32(sum_dt), w_host, 1e-5f, true);
          expect_close(x.to(Device::CPU).slice(1, off, off + D), sum, tol(),
                       what("add_rms_norm x") + shape);
          expect_close(out.to(Device::CPU), ref, tol(), what("add_rms_norm out") + shape);
        }
        {  // gated_act (SiLU), add, scale
          const Tensor g = x_host.to(Device::CUDA), u = d_host.to(Device::CUDA);
          Tensor out = poisoned_cuda({rows, D}, dt());
          ops::gated_act(out, g.slice(1, off, off + D), u.slice(1, off, off + D),
                         ops::Activation::SiLU);
          Tensor ref = Tensor::empty({rows, D}, DType::F32);
          ops::gated_act(ref, to_f32(xs), to_f32(ds), ops::Activation::SiLU);
          expect_close(out.to(Device::CPU), ref, tol(), what("gated_act") + shape);
          Tensor sum = poisoned_cuda({rows, D}, dt());
          ops::add(sum, g.slice(1, off, off + D), u.slice(1, off, off + D));
          ops::scale(sum, 0.75f);
          Tensor sref = Tensor::empty({rows, D}, DType::F32);
          ops::add(sref, to_f32(xs), to_f32(ds));
          ops::scale(sref, 0.75f);
          // Two roundings (the sum, then the scaled sum): twice the one-rounding bounds.
          const Tolerance two{2 * tol().rel_l2, 2 * tol().max_abs_rel};
          expect_close(sum.to(Device::CPU), sref, two, what("add + scale") + shape);
        }
      }
    }
  }
}

TEST_P(CudaActDtype, EmbeddingRopeAndKvAppendMatchCpu) {
  uint32_t seed = 300;
  for (int64_t D : {16, 64, 96}) {
    const int64_t T = 7, H = 4, Hkv = 2, V = 50;
    const std::string shape = " D=" + std::to_string(D);
    {  // embedding: rows copied as they are (one id out of range: zeros)
      const Tensor table = random({V, D}, seed++);
      const Tensor ids = i32_host({3, 0, 49, 7, 50, 3, 12});
      Tensor out = poisoned_cuda({T, D}, dt());
      ops::embedding(out, table.to(Device::CUDA), ids.to(Device::CUDA));
      const Tensor got = to_f32(out.to(Device::CPU)), tab = to_f32(table);
      int64_t bad = 0;
      for (int64_t t = 0; t < T; ++t) {
        const int32_t id = ids.data<const int32_t>()[t];
        for (int64_t i = 0; i < D; ++i) {
          const float want = id < V ? tab.data<const float>()[id * D + i] : 0.0f;
          bad += got.data<const float>()[t * D + i] != want;
        }
      }
      EXPECT_EQ(bad, 0) << what("embedding") + shape;
    }
    for (const ops::RopeLayout layout : {ops::RopeLayout::HalfSplit, ops::RopeLayout::Adjacent}) {
      // rope on q|k heads, then the keys and values into a cache of the same dtype.
      const Tensor qk_host = random({T, H + Hkv, D}, seed++), v_host = random({T, Hkv, D}, seed++);
      const Tensor pos = i32_host({5, 6, 7, 8, 9, 10, 11});
      const Tensor rows = i32_host({0, 3, 4, 9, 1, 2, 8});
      const ops::RopeParams rp{.rot_dim = 0, .theta = 10000.0f, .layout = layout};
      Tensor qk = qk_host.to(Device::CUDA);
      Tensor kc = poisoned_cuda({10, Hkv, D}, dt()), vc = poisoned_cuda({10, Hkv, D}, dt());
      ops::rope_kv_append(qk, pos.to(Device::CUDA), rp, kc, vc, v_host.to(Device::CUDA),
                          rows.to(Device::CUDA), nullptr);
      Tensor ref = to_f32(qk_host);
      ops::rope(ref, pos, rp);
      const std::string l = layout == ops::RopeLayout::HalfSplit ? " half-split" : " adjacent";
      expect_close(qk.to(Device::CPU), ref, tol(), what("rope") + shape + l);
      const Tensor kc_host = to_f32(kc.to(Device::CPU)), vc_host = to_f32(vc.to(Device::CPU));
      for (int64_t t = 0; t < T; ++t) {
        const int32_t r = rows.data<const int32_t>()[t];
        // The cache row holds the rotated key as qk holds it, and the value as given.
        expect_close(kc_host.select(0, r),
                     to_f32(qk.to(Device::CPU)).select(0, t).slice(0, H, H + Hkv), Tolerance{0, 0},
                     what("kv append k") + shape + l);
        expect_close(vc_host.select(0, r), to_f32(v_host).select(0, t), Tolerance{0, 0},
                     what("kv append v") + shape + l);
      }
    }
  }
}

TEST_P(CudaActDtype, LinearMatchesCpu) {
  uint32_t seed = 500;
  for (int64_t M : {1, 3, 70}) {
    for (int64_t K : {8, 200, 1024}) {
      const int64_t N = 72;
      const std::string shape =
          " M=" + std::to_string(M) + " K=" + std::to_string(K) + " N=" + std::to_string(N);
      const float ws = 1.0f / static_cast<float>(K);
      const Tensor x = random({M, K}, seed++, -1, 1), w = random({N, K}, seed++, -ws, ws);
      const Tensor b = random({N}, seed++, -0.5f, 0.5f);
      Tensor out = poisoned_cuda({M, N}, dt());
      const Tensor bd = b.to(Device::CUDA);
      ops::linear(out, x.to(Device::CUDA), w.to(Device::CUDA), &bd);
      Tensor ref = Tensor::empty({M, N}, DType::F32);
      const Tensor bf = to_f32(b);
      ops::linear(ref, to_f32(x), to_f32(w), &bf);
      expect_close(out.to(Device::CPU), ref, tol(), what("linear") + shape);
      Tensor logits = poisoned_cuda({M, N}, DType::F32);  // f32 out, as the LM head's
      ops::linear(logits, x.to(Device::CUDA), w.to(Device::CUDA));
      Tensor lref = Tensor::empty({M, N}, DType::F32);
      ops::linear(lref, to_f32(x), to_f32(w));
      expect_close(logits.to(Device::CPU), lref, kF32Out, what("linear, f32 out") + shape);
    }
  }
  // Operands of two dtypes are refused with a message naming both.
  Tensor out = poisoned_cuda({2, 8}, dt());
  const Tensor x = random({2, 16}, 1).to(Device::CUDA);
  const Tensor w = random_host({8, 16}, DType::BF16, 2).to(Device::CUDA);
  if (dt() != DType::BF16) {
    EXPECT_NE(error_message([&] { ops::linear(out, x, w); }).find("share one dtype"),
              std::string::npos);
  }
}

TEST_P(CudaActDtype, AttentionMatchesCpu) {
  uint32_t seed = 700;
  // T > 8 (prefill path), T <= 8 (decode path): both take the fallback kernel at f32; fp16 runs
  // the tensor-core kernels at head dims 64 and 128.
  for (int64_t D : {16, 64, 128}) {
    for (int64_t T : {3, 20}) {
      const int64_t L = 40, Hq = 4, Hkv = 2, pos0 = L - T;
      const std::string shape = " D=" + std::to_string(D) + " T=" + std::to_string(T);
      const Tensor q = random({T, Hq, D}, seed++), k = random({L, Hkv, D}, seed++);
      const Tensor v = random({L, Hkv, D}, seed++);
      std::vector<int32_t> p(static_cast<size_t>(T));
      for (int64_t t = 0; t < T; ++t) p[static_cast<size_t>(t)] = static_cast<int32_t>(pos0 + t);
      const Tensor pos = i32_host(p);
      Tensor out = poisoned_cuda({T, Hq, D}, dt());
      ops::attention(out, q.to(Device::CUDA), k.to(Device::CUDA), v.to(Device::CUDA),
                     pos.to(Device::CUDA), {});
      Tensor ref = Tensor::empty({T, Hq, D}, DType::F32);
      ops::attention(ref, to_f32(q), to_f32(k), to_f32(v), pos, {});
      // fp16 through the tensor-core kernels: the softmax weights are rounded to 16 bits too
      // (kAttentionOut's reasoning, at fp16's eighth of bf16's rounding unit).
      const Tolerance t = dt() == DType::F32
                              ? kF32Out
                              : Tolerance{kAttentionOut.rel_l2 / 8, kAttentionOut.max_abs_rel / 8};
      expect_close(out.to(Device::CPU), ref, t, what("attention") + shape);
    }
  }
}

// A batched decode step over a paged pool (the engine's call): fp16 through the decode kernel
// at head dims 64 and 128, f32 (and other head dims) through the fallback kernel.
TEST_P(CudaActDtype, PagedDecodeMatchesCpu) {
  uint32_t seed = 900;
  for (int64_t D : {16, 64, 128}) {
    const int64_t B = 3, Hq = 8, Hkv = 2, page = 16, pages = 12, per_seq = 4;
    const std::string shape = " D=" + std::to_string(D);
    const Tensor q = random({B, Hq, D}, seed++);
    const Tensor k = random({pages * page, Hkv, D}, seed++),
                 v = random({pages * page, Hkv, D}, seed++);
    // Sequence b's pages: a permutation of the pool, so that pages are not in order.
    const Tensor table = i32_host({7, 2, 9, 0, 4, 11, 1, 5, 3, 10, 6, 8});
    const Tensor cu = i32_host({0, 1, 2, 3});
    const Tensor pos = i32_host({5, 33, 63});
    Tensor out = poisoned_cuda({B, Hq, D}, dt());
    ops::attention_paged(out, q.to(Device::CUDA), k.to(Device::CUDA), v.to(Device::CUDA),
                         table.view({B, per_seq}).to(Device::CUDA), page, cu.to(Device::CUDA),
                         pos.to(Device::CUDA), 1, {});
    Tensor ref = Tensor::empty({B, Hq, D}, DType::F32);
    ops::attention_paged(ref, to_f32(q), to_f32(k), to_f32(v), table.view({B, per_seq}), page, cu,
                         pos, 1, {});
    const Tolerance t = dt() == DType::F32
                            ? kF32Out
                            : Tolerance{kAttentionOut.rel_l2 / 8, kAttentionOut.max_abs_rel / 8};
    expect_close(out.to(Device::CPU), ref, t, what("attention_paged") + shape);
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaActDtype, ::testing::Values(DType::F16, DType::F32),
                         [](const auto& p) { return std::string(dtype_name(p.param)); });

}  // namespace
}  // namespace llmk::gpu_test
