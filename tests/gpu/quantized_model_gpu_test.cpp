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
// 1; Q5_K (not kept: dequantised at load) beside Q8_0 in layer 2; the output Q6_K, the
// embeddings Q8_0 (rows dequantised per token: cuda::qembedding).
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

namespace llmk {
namespace {

constexpr int64_t kD = 256, kFF = 768, kVocab = 512, kHeads = 4, kKvHeads = 2, kHd = 64;

std::string write_model(const std::string& path) {
  gguf::Writer w;
  using gguf::Value;
  using gguf::ValueType;
  const auto u32 = [](int64_t v) { return Value(ValueType::U32, v); };
  w.set("general.architecture", Value(ValueType::STRING, std::string("llama")));
  w.set("llama.block_count", u32(3));
  w.set("llama.embedding_length", u32(kD));
  w.set("llama.feed_forward_length", u32(kFF));
  w.set("llama.attention.head_count", u32(kHeads));
  w.set("llama.attention.head_count_kv", u32(kKvHeads));
  w.set("llama.context_length", u32(128));
  w.set("llama.vocab_size", u32(kVocab));
  w.set("llama.attention.layer_norm_rms_epsilon", Value(ValueType::F32, 1e-5));
  struct T {
    std::string name;
    Shape shape;
    DType dtype;
  };
  std::vector<T> ts = {{"token_embd.weight", {kVocab, kD}, DType::Q8_0},
                       {"output_norm.weight", {kD}, DType::F32},
                       {"output.weight", {kVocab, kD}, DType::Q6_K}};
  const DType q[3] = {DType::Q4_K, DType::Q5_0, DType::Q5_K};
  const DType k[3] = {DType::Q4_K, DType::Q5_0, DType::Q8_0};
  const DType v[3] = {DType::Q6_K, DType::Q5_0, DType::Q5_K};
  const DType o[3] = {DType::Q8_0, DType::Q4_K, DType::Q6_K};
  const DType gu[3] = {DType::Q4_0, DType::Q4_1, DType::Q8_0};
  const DType down[3] = {DType::Q4_1, DType::Q4_K, DType::Q5_K};
  for (int i = 0; i < 3; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".";
    ts.push_back({b + "attn_norm.weight", {kD}, DType::F32});
    ts.push_back({b + "attn_q.weight", {kHeads * kHd, kD}, q[i]});
    ts.push_back({b + "attn_k.weight", {kKvHeads * kHd, kD}, k[i]});
    ts.push_back({b + "attn_v.weight", {kKvHeads * kHd, kD}, v[i]});
    ts.push_back({b + "attn_output.weight", {kD, kHeads * kHd}, o[i]});
    ts.push_back({b + "ffn_norm.weight", {kD}, DType::F32});
    ts.push_back({b + "ffn_gate.weight", {kFF, kD}, gu[i]});
    ts.push_back({b + "ffn_up.weight", {kFF, kD}, gu[i]});
    ts.push_back({b + "ffn_down.weight", {kD, kFF}, down[i]});
  }
  for (const T& t : ts) w.add_tensor(t.name, t.shape, t.dtype);
  w.open(path);
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const T& t : ts) {
    std::vector<float> x(static_cast<size_t>(shape_numel(t.shape)));
    const bool norm = t.shape.size() == 1;
    const float scale = 1.0f / std::sqrt(static_cast<float>(t.shape.back()));
    for (float& e : x) e = norm ? 1.0f + 0.1f * normal(rng) : scale * normal(rng);
    if (t.dtype == DType::F32) {
      w.write(x.data(), x.size() * sizeof(float));
      continue;
    }
    const int64_t cols = t.shape.back(), rows = static_cast<int64_t>(x.size()) / cols;
    std::vector<uint8_t> row(static_cast<size_t>(bytes_for(t.dtype, cols)));
    for (int64_t r = 0; r < rows; ++r) {
      cpu::quantize_row(t.dtype, x.data() + r * cols, row.data(), cols);
      w.write(row.data(), row.size());
    }
  }
  w.finish();
  return path;
}

double rel_err(const float* a, const float* ref, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(a[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return std::sqrt(num / den);
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
    const double err = rel_err(g, r, kVocab);
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
  EXPECT_GT(s1.qbands, s0.qbands) << "no band of dequantised weights ran";
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
