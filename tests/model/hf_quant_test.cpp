// Hugging Face AWQ and GPTQ checkpoints (formats/hf_quant.h) on the CPU against their f16 twins:
// tests/fixtures/hf_quant, written by make_hf_quant.py there from the llama3 family fixture
// (4-bit, groups of 64; the GPTQ one in act order, with a shuffled g_idx and v1's zero points
// less one). The twin holds each quantised layer as the f16 weights scale * (q - zero), computed
// in float32 by the script and rounded once. The GPTQ checkpoint (act order: no Q5_0 block can
// hold a group) is dequantised to those same f16 weights, so its logits are compared bit for bit;
// the AWQ one is kept as Q5_0 blocks, whose weights are scale * (q - zero) exactly (checked layer
// by layer: each, rounded to f16, is the twin's weight), so its logits differ from the twin's by
// the twin's f16 rounding alone. The same for a compressed-tensors int8 checkpoint (a scale an
// output row), kept as Q8_0 blocks. Then what the loader refuses, one clear line each.
#include "formats/hf_quant.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "core/tensor.h"
#include "formats/hf_config.h"
#include "formats/safetensors.h"
#include "model/family_fixtures.h"
#include "model/model.h"
#include "ops/ops.h"
#include "test_paths.h"

namespace llmk {
namespace {

std::string fixture(const std::string& name) {
  return test::source_path("tests/fixtures/hf_quant/" + name);
}

std::unique_ptr<Model> load(const std::string& path) {
  return Model::load(path, {.context = 64, .device = Device::CPU});
}

// All-position logits of a prefill of 12 tokens, then 3 single-token steps, concatenated.
std::vector<float> logits(Model& m) {
  std::mt19937 rng(3);
  std::vector<int32_t> ids(15);
  for (int32_t& t : ids) t = static_cast<int32_t>(rng() % 512);
  std::vector<float> all;
  const auto add = [&](const Tensor& t) {
    all.insert(all.end(), t.data<const float>(), t.data<const float>() + t.numel());
  };
  add(m.forward(std::span<const int32_t>(ids).first(12), 0, true));
  for (size_t p = 12; p < ids.size(); ++p) {
    add(m.forward(std::span<const int32_t>(ids).subspan(p, 1), static_cast<int64_t>(p), true));
  }
  return all;
}

void expect_same_bits(const std::vector<float>& got, const std::vector<float>& want,
                      const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  ASSERT_GT(got.size(), 0u);
  size_t differ = 0;
  for (size_t i = 0; i < got.size(); ++i) differ += std::memcmp(&got[i], &want[i], 4) != 0;
  EXPECT_EQ(differ, 0u) << what << ": " << differ << " of " << got.size() << " logits differ";
}

// The fixture's packed layers (PackedLinear) by name, "<layer>" for "<layer>.qweight".
std::vector<std::pair<std::string, PackedLinear>> packed_layers(const safetensors::Folder& f) {
  std::vector<std::pair<std::string, PackedLinear>> out;
  for (const std::string& n : f.names()) {
    const std::string suffix = kPackedParts[0];
    if (!n.ends_with(suffix)) continue;
    const std::string base = n.substr(0, n.size() - suffix.size());
    const auto part = [&](const char* s) {
      return f.find(base + s) ? f.tensor(base + s) : Tensor();
    };
    out.push_back({base,
                   {part(kPackedParts[0]), part(kPackedParts[1]), part(kPackedParts[2]),
                    part(kPackedParts[3])}});
  }
  return out;
}

// Every packed layer of the fixture as blocks of `type` whose weights, rounded to f16, are
// dequantize_packed's f16 weights (the reference code's), weight for weight.
void expect_exact_blocks(const std::string& name_of_fixture, const HfQuant& q, DType type) {
  const auto f = safetensors::Folder::open(fixture(name_of_fixture));
  const auto layers = packed_layers(f);
  ASSERT_EQ(layers.size(), 7u * 3);  // the llama3 fixture: 3 layers of 7 linears
  for (const auto& [name, p] : layers) {
    const Tensor blocks = repack_packed_blocks(q, p, name);
    ASSERT_TRUE(blocks.defined()) << name;
    ASSERT_EQ(blocks.dtype(), type) << name;
    const Tensor f16 = dequantize_packed(q, p, name);
    ASSERT_EQ(blocks.shape(), f16.shape()) << name;
    Tensor exact = Tensor::empty(f16.shape(), DType::F32);
    ops::dequantize(exact, blocks);
    int64_t differ = 0;
    for (int64_t i = 0; i < exact.numel(); ++i) {
      differ += float_to_fp16(exact.data<const float>()[i]) != f16.data<const uint16_t>()[i];
    }
    EXPECT_EQ(differ, 0) << name << ": weights whose f16 rounding is not the f16 path's";
  }
}

TEST(HfQuant, AwqLayersBecomeExactQ5_0Blocks) {
  const HfQuant q = read_hf_quant(HfConfig::open(fixture("awq")));
  EXPECT_EQ(q.method, HfQuant::Method::Awq);
  EXPECT_EQ(q.group_size, 64);
  EXPECT_EQ(q.describe(), "AWQ 4-bit, group 64");
  expect_exact_blocks("awq", q, DType::Q5_0);
}

// A symmetric GPTQ checkpoint (every zero point 8) in order: Q4_0 blocks, 4.5 bits a weight.
TEST(HfQuant, SymmetricGptqLayersBecomeExactQ4_0Blocks) {
  const HfQuant q = read_hf_quant(HfConfig::open(fixture("gptq_sym")));
  EXPECT_EQ(q.method, HfQuant::Method::Gptq);
  expect_exact_blocks("gptq_sym", q, DType::Q4_0);
}

// A model on quantised blocks against its f16 twin: the twin's weights are the exact ones rounded
// to f16 (relative error at most 2^-11 each, of either sign), which moves each logit by a small
// multiple of 2^-11 of the logits' scale; 2^-8 of the largest logit bounds it with room, and the
// greedy token of every position must agree.
void expect_near_twin(const std::string& quant, const std::string& twin_name) {
  auto q = load(fixture(quant));
  auto twin = load(fixture(twin_name));
  const std::vector<float> a = logits(*q), t = logits(*twin);
  ASSERT_EQ(a.size(), t.size());
  float scale = 0, worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    scale = std::max(scale, std::fabs(t[i]));
    worst = std::max(worst, std::fabs(a[i] - t[i]));
  }
  std::printf("  %s: largest logit %g, largest difference from the twin %g\n", quant.c_str(), scale,
              worst);
  EXPECT_GT(worst, 0.0f) << quant << " ran as the f16 twin: not kept quantised?";
  EXPECT_LE(worst, scale / 256) << quant << ": largest logit " << scale;
  const size_t vocab = 512, rows = a.size() / vocab;
  ASSERT_EQ(rows * vocab, a.size());
  for (size_t r = 0; r < rows; ++r) {
    const auto top = [&](const std::vector<float>& v) {
      return std::max_element(v.begin() + r * vocab, v.begin() + (r + 1) * vocab) - v.begin();
    };
    EXPECT_EQ(top(a), top(t)) << quant << " position " << r;
  }
}

TEST(HfQuant, AwqCheckpointRunsNearItsF16Twin) { expect_near_twin("awq", "awq_twin"); }

TEST(HfQuant, SymmetricGptqCheckpointRunsNearItsF16Twin) {
  expect_near_twin("gptq_sym", "gptq_sym_twin");
}

TEST(HfQuant, GptqActOrderCheckpointRunsAsItsF16Twin) {
  const HfQuant q = read_hf_quant(HfConfig::open(fixture("gptq")));
  EXPECT_EQ(q.method, HfQuant::Method::Gptq);
  EXPECT_TRUE(q.zero_less_one);
  const auto f = safetensors::Folder::open(fixture("gptq"));
  for (const auto& [name, p] : packed_layers(f)) {
    EXPECT_FALSE(repack_packed_blocks(q, p, name).defined()) << name << ": act order as blocks";
  }
  auto gptq = load(fixture("gptq"));
  auto twin = load(fixture("gptq_twin"));
  expect_same_bits(logits(*gptq), logits(*twin), "gptq");
  // The two quantisations differ (other groups), so the comparison can tell them apart.
  auto awq_twin = load(fixture("awq_twin"));
  const std::vector<float> a = logits(*awq_twin), g = logits(*twin);
  EXPECT_NE(std::memcmp(a.data(), g.data(), a.size() * 4), 0);
}

// The fixture's int8 layers ("<layer>.weight" of dtype I8) by name.
std::vector<std::pair<std::string, ChannelInt8>> int8_layers(const safetensors::Folder& f) {
  std::vector<std::pair<std::string, ChannelInt8>> out;
  for (const std::string& n : f.names()) {
    if (!n.ends_with(".weight") || f.tensor(n).dtype() != DType::I8) continue;
    const std::string base = n.substr(0, n.size() - std::string_view(".weight").size());
    out.push_back({base,
                   {f.tensor(n), f.tensor(base + kChannelScale),
                    f.find(base + kChannelZero) ? f.tensor(base + kChannelZero) : Tensor()}});
  }
  return out;
}

TEST(HfQuant, ChannelInt8LayersBecomeExactQ8_0Blocks) {
  const HfQuant q = read_hf_quant(HfConfig::open(fixture("ct_int8")));
  EXPECT_EQ(q.method, HfQuant::Method::ChannelInt8);
  EXPECT_EQ(q.describe(), "compressed-tensors int8, a scale an output channel");
  const auto f = safetensors::Folder::open(fixture("ct_int8"));
  const auto twin = safetensors::Folder::open(fixture("ct_int8_twin"));
  const auto layers = int8_layers(f);
  ASSERT_EQ(layers.size(), 7u * 3);  // the llama3 fixture: 3 layers of 7 linears
  for (const auto& [name, c] : layers) {
    const Tensor blocks = repack_channel_int8_q8_0(c, name);
    ASSERT_TRUE(blocks.defined()) << name;
    ASSERT_EQ(blocks.dtype(), DType::Q8_0) << name;
    const Tensor want = twin.tensor(name + ".weight");  // f16, scale * q rounded once
    ASSERT_EQ(blocks.shape(), want.shape()) << name;
    Tensor exact = Tensor::empty(want.shape(), DType::F32);
    ops::dequantize(exact, blocks);
    const Tensor f16 = dequantize_channel_int8(c, name);
    int64_t differ = 0;
    for (int64_t i = 0; i < exact.numel(); ++i) {
      const uint16_t h = float_to_fp16(exact.data<const float>()[i]);
      differ += h != want.data<const uint16_t>()[i] || h != f16.data<const uint16_t>()[i];
    }
    EXPECT_EQ(differ, 0) << name << ": weights whose f16 rounding is not the twin's";
  }
}

TEST(HfQuant, ChannelInt8CheckpointRunsNearItsF16Twin) {
  expect_near_twin("ct_int8", "ct_int8_twin");
}

// What Q8_0 blocks cannot hold goes to f16 weights scale * (q - zero): a zero point, a row not
// whole blocks of 32, a scale that is not an f16 value. And the format's shapes are checked.
TEST(HfQuant, ChannelInt8FallsBackToF16AndChecksShapes) {
  Tensor w = Tensor::empty({2, 64}, DType::I8);
  for (int64_t i = 0; i < w.numel(); ++i) w.data<int8_t>()[i] = static_cast<int8_t>(i * 37 - 100);
  Tensor s = Tensor::empty({2, 1}, DType::F32);
  s.data<float>()[0] = 0.25f;
  s.data<float>()[1] = 0.0625f;
  Tensor z = Tensor::empty({2, 1}, DType::I8);
  z.data<int8_t>()[0] = 0;
  z.data<int8_t>()[1] = 3;
  EXPECT_TRUE(repack_channel_int8_q8_0({w, s, Tensor()}, "l").defined());
  EXPECT_FALSE(repack_channel_int8_q8_0({w, s, z}, "l").defined());
  const Tensor f16 = read_channel_int8({w, s, z}, "l");
  ASSERT_EQ(f16.dtype(), DType::F16);
  for (int64_t n = 0; n < 2; ++n) {
    for (int64_t k = 0; k < 64; ++k) {
      const float want = s.data<float>()[n] *
                         static_cast<float>(w.data<int8_t>()[n * 64 + k] - z.data<int8_t>()[n]);
      EXPECT_EQ(f16.data<const uint16_t>()[n * 64 + k], float_to_fp16(want)) << n << ", " << k;
    }
  }
  Tensor s_odd = Tensor::empty({2, 1}, DType::F32);
  s_odd.data<float>()[0] = 0.1f;  // not an f16 value
  s_odd.data<float>()[1] = 0.25f;
  EXPECT_FALSE(repack_channel_int8_q8_0({w, s_odd, Tensor()}, "l").defined());
  Tensor w48 = Tensor::empty({2, 48}, DType::I8);
  std::memset(w48.data(), 1, 96);
  EXPECT_FALSE(repack_channel_int8_q8_0({w48, s, Tensor()}, "l").defined());
  Tensor s3 = Tensor::empty({3, 1}, DType::F32);
  try {
    dequantize_channel_int8({w, s3, Tensor()}, "model.x");
    ADD_FAILURE() << "a scale a row for 3 rows of a 2-row weight";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.x.weight_scale: shape [3, 1], expected [2, 1]"),
              std::string::npos)
        << e.what();
  }
}

// A copy of a fixture folder with config.json's quantization_config edited.
std::string edited(const test::ScratchDir& dir, const std::string& name,
                   const std::function<void(nlohmann::json&)>& edit) {
  namespace fs = std::filesystem;
  const fs::path dst = fs::path(dir.path()) / name;
  fs::create_directories(dst);
  for (const char* f : {"model.safetensors", "config.json"}) {
    fs::copy_file(fs::path(fixture(name)) / f, dst / f, fs::copy_options::overwrite_existing);
  }
  std::ifstream in(dst / "config.json");
  nlohmann::json c;
  in >> c;
  in.close();
  edit(c["quantization_config"]);
  std::ofstream(dst / "config.json") << c.dump(2);
  return dst.string();
}

void expect_refused(const std::string& path, const std::string& part) {
  try {
    load(path);
    ADD_FAILURE() << path << ": loaded, expected an error containing: " << part;
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(part), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << "one line: " << m;
  }
}

TEST(HfQuant, RefusesWhatItCannotRead) {
  test::ScratchDir dir;
  expect_refused(edited(dir, "awq", [](nlohmann::json& q) { q["bits"] = 8; }),
                 "quantization_config: 8-bit weights are not supported (4-bit only)");
  expect_refused(edited(dir, "gptq", [](nlohmann::json& q) { q["quant_method"] = "bitsandbytes"; }),
                 "quantization_config.quant_method 'bitsandbytes' is not supported");
  expect_refused(edited(dir, "awq", [](nlohmann::json& q) { q["version"] = "gemv"; }),
                 "quantization_config.version 'gemv' is not supported");
  expect_refused(edited(dir, "awq", [](nlohmann::json& q) { q["zero_point"] = false; }),
                 "quantization_config.zero_point false is not supported");
  expect_refused(edited(dir, "gptq", [](nlohmann::json& q) { q["checkpoint_format"] = "marlin"; }),
                 "checkpoint_format 'marlin' is not supported");
  expect_refused(edited(dir, "awq", [](nlohmann::json& q) { q["group_size"] = 0; }),
                 "quantization_config.group_size 0 is not a group size");
  expect_refused(edited(dir, "awq", [](nlohmann::json& q) { q["group_size"] = -1; }),
                 "quantization_config.group_size -1 is not a group size");
  // Groups of 32 where the tensors hold groups of 64: the scales' shape says so.
  expect_refused(
      edited(dir, "awq", [](nlohmann::json& q) { q["group_size"] = 32; }),
      "self_attn.q_proj.scales: shape [2, 128], expected [4, 128] (AWQ 4-bit, group 32)");
  // 48 does not divide the 128 input rows.
  expect_refused(edited(dir, "gptq", [](nlohmann::json& q) { q["group_size"] = 48; }),
                 "128 input rows are not whole groups of 48");
  // The GPTQ fixture's g_idx is read (act order): groups of 128 make its group 1 entries
  // outside the one group there is.
  expect_refused(edited(dir, "gptq", [](nlohmann::json& q) { q["group_size"] = 128; }),
                 "self_attn.q_proj.scales: shape [2, 128], expected [1, 128]");
  // compressed-tensors: int8 with a scale a channel only.
  expect_refused(edited(dir, "ct_int8", [](nlohmann::json& q) { q["format"] = "pack-quantized"; }),
                 "quantization_config.format 'pack-quantized' is not supported");
  expect_refused(edited(dir, "ct_int8",
                        [](nlohmann::json& q) {
                          q["config_groups"]["group_0"]["weights"]["num_bits"] = 4;
                          q["config_groups"]["group_0"]["weights"]["strategy"] = "group";
                        }),
                 "quantization_config.config_groups.group_0.weights: 4-bit int weights by 'group' "
                 "are not supported");
  expect_refused(edited(dir, "ct_int8",
                        [](nlohmann::json& q) {
                          q["config_groups"]["group_1"] = q["config_groups"]["group_0"];
                        }),
                 "quantization_config.config_groups: llmk reads one group of int8 weights, got 2");
}

}  // namespace
}  // namespace llmk
