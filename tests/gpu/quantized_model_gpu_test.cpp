// A model whose GGUF matrices are block-quantised, on CUDA with its weights kept quantised
// (LoadOptions::quantized_weights, kernels/cuda/gemm/qlinear.h) against the CPU path on the same
// file, beside the same model with its weights dequantised to bf16 at load (the path every GGUF
// took before): logits of a prefill of more than 16 tokens (bands of dequantised weights through
// cuBLASLt), of one of 10 (qgemv, two token tiles), and of graph-replayed decode steps (qgemv, one
// token).
//
// The model: random Llama weights (d 256, so the k-quants apply), every kept type somewhere, each
// layer differently: separate Q|K|V of two types (Q4_K, Q6_K) and a stacked gate|up (Q4_0) in
// layer 0; a stacked Q|K|V of one type (Q5_0) and a stacked gate|up of another (Q4_1) in layer
// 1; Q5_K beside Q8_0 and a stacked gate|up of Q5_1 in layer 2; the output Q6_K, the embeddings
// Q8_0 (rows dequantised per token: cuda::qembedding).
//
// Yardstick: the bf16 model's own error against the CPU. The quantised path rounds each weight
// once to bf16 in fp32 (qlinear.h), as the bf16 load does, so its error is the bf16 model's up to
// the order of the sums and the rare weight whose two fp32 values round differently: 1.2x.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "core/cuda/allocator.h"
#include "core/cuda/device.h"
#include "engine/generator.h"
#include "formats/gguf_write.h"
#include "kernels/cpu/quantize.h"
#include "kernels/cuda/gemm/linear.h"
#include "model/model.h"
#include "ops/ops.h"
#include "ops_gpu_util.h"
#include "random_llama_gguf.h"

namespace llmk {
namespace {

constexpr int64_t kD = 256, kFF = 768, kVocab = 512, kHeads = 4, kKvHeads = 2, kHd = 64;

// Each projection's type by layer (blocks of 32 and of 256; stacked and separate).
DType type_of(const std::string& name) {
  const DType q[3] = {DType::Q4_K, DType::Q5_0, DType::Q5_K};
  const DType k[3] = {DType::Q4_K, DType::Q5_0, DType::Q8_0};
  const DType v[3] = {DType::Q6_K, DType::Q5_0, DType::Q5_K};
  const DType o[3] = {DType::Q8_0, DType::Q4_K, DType::Q6_K};
  const DType gu[3] = {DType::Q4_0, DType::Q4_1, DType::Q5_1};
  const DType down[3] = {DType::Q4_1, DType::Q4_K, DType::Q5_K};
  if (name == "token_embd.weight") return DType::Q8_0;
  if (name == "output.weight") return DType::Q6_K;
  if (name.rfind("blk.", 0) != 0) return DType::F32;
  const int i = name[4] - '0';
  const auto is = [&](const char* n) { return name.find(n) != std::string::npos; };
  if (is("attn_q.")) return q[i];
  if (is("attn_k.")) return k[i];
  if (is("attn_v.")) return v[i];
  if (is("attn_output.")) return o[i];
  if (is("ffn_gate.") || is("ffn_up.")) return gu[i];
  if (is("ffn_down.")) return down[i];
  return DType::F32;  // the norms
}

std::string write_model(const std::string& path) {
  return test::write_random_llama(path,
                                  {.layers = 3,
                                   .d = kD,
                                   .ff = kFF,
                                   .vocab = kVocab,
                                   .heads = kHeads,
                                   .kv_heads = kKvHeads,
                                   .head_dim = kHd,
                                   .seed = 11},
                                  type_of);
}

struct Errors {
  double worst = 0, sum = 0;
  int64_t count = 0, top1 = 0;
};

// Logits of seq on `gpu`: a prefill of the first `prefill` tokens, then graph-replayed steps.
Tensor gpu_logits(Model& gpu, const std::vector<int32_t>& seq, int64_t prefill) {
  const auto n = static_cast<int64_t>(seq.size());
  Tensor out = Tensor::empty({n, kVocab}, DType::F32);
  Tensor pre = out.slice(0, 0, prefill);
  ops::transfer(pre, gpu.forward({seq.data(), static_cast<size_t>(prefill)}, 0, true));
  SamplerConfig greedy;
  greedy.temperature = 0;
  Decoder dec(gpu, greedy, /*cuda_graph=*/true);
  for (int64_t p = prefill; p < n; ++p) {
    dec.step(seq[static_cast<size_t>(p)], p);
    Tensor row = out.slice(0, p, p + 1);
    ops::transfer(row, dec.last_logits());
  }
  return out;
}

void add(Errors& e, const Tensor& got, const Tensor& ref) {
  for (int64_t p = 0; p < got.dim(0); ++p) {
    const float* g = got.data<float>() + p * kVocab;
    const float* r = ref.data<float>() + p * kVocab;
    const double err = gpu_test::rel_l2(g, r, kVocab);
    e.worst = std::max(e.worst, err);
    e.sum += err;
    ++e.count;
    e.top1 += std::max_element(g, g + kVocab) - g == std::max_element(r, r + kVocab) - r;
  }
}

TEST(QuantizedModelGpu, KeptQuantisedWeightsMatchTheCpuAsBf16WeightsDo) {
  cuda::init();
  const std::string path =
      (std::filesystem::temp_directory_path() / "llmk_quantized_model_gpu_test.gguf").string();
  write_model(path);
  auto cpu = Model::load(path, {.context = 64, .device = Device::CPU});
  const size_t before = cuda::allocator().stats().bytes_in_use;
  auto quant =
      Model::load(path, {.context = 64, .device = Device::CUDA, .quantized_weights = true});
  const size_t quant_bytes = cuda::allocator().stats().bytes_in_use - before;
  auto bf16 =
      Model::load(path, {.context = 64, .device = Device::CUDA, .quantized_weights = false});
  const size_t bf16_bytes = cuda::allocator().stats().bytes_in_use - before - quant_bytes;
  std::printf("device bytes after load: quantised weights %zu, bf16 weights %zu\n", quant_bytes,
              bf16_bytes);
  EXPECT_LT(quant_bytes, bf16_bytes);

  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> id(0, kVocab - 1);
  Errors eq, eb;
  const cuda::LinearStats s0 = cuda::linear_stats();
  for (const int64_t prefill : {20, 10}) {
    std::vector<int32_t> seq(static_cast<size_t>(prefill + 6));
    for (int32_t& t : seq) t = id(rng);
    const Tensor ref = cpu->forward(seq, 0, true);
    add(eq, gpu_logits(*quant, seq, prefill), ref);
    add(eb, gpu_logits(*bf16, seq, prefill), ref);
  }
  const cuda::LinearStats s1 = cuda::linear_stats();
  EXPECT_GT(s1.qgemv, s0.qgemv) << "qgemv never ran";
  EXPECT_GT(s1.qgemm + s1.qbands, s0.qgemm + s0.qbands) << "no GEMM over quantised weights ran";
  std::printf(
      "relative logit error against the CPU over %lld positions: quantised weights worst %.2e "
      "mean %.2e top-1 %lld; bf16 weights worst %.2e mean %.2e top-1 %lld\n",
      static_cast<long long>(eq.count), eq.worst, eq.sum / eq.count,
      static_cast<long long>(eq.top1), eb.worst, eb.sum / eb.count,
      static_cast<long long>(eb.top1));
  EXPECT_LE(eq.worst, 1.2 * eb.worst);
  EXPECT_LE(eq.sum, 1.2 * eb.sum);
  EXPECT_GE(eq.top1, eb.top1 - 1);
  EXPECT_GT(eq.worst, 0.0);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace llmk
