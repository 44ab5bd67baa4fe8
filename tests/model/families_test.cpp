// Every family on the CPU against transformers' float32 logits of the same tiny random model
// (tests/fixtures/families, written by make_models.py there): from the Hugging Face folder, and
// from a GGUF file the test writes from it the way llama.cpp's converter lays it out.
//
// Bound: at every position, max_v |llmk - transformers| / max_v |transformers| <= 1e-4 (the row's
// largest logit magnitude sets the scale). Both sides compute in float32 on the same float32
// weights; what differs is the order of additions (and RoPE angles computed in double here), so
// the measured errors are ~1e-6, 100x below the bound. The "far off" tests show that each
// family-specific detail moves the logits by orders of magnitude more than the bound.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <span>

#include "core/error.h"
#include "core/tensor.h"
#include "formats/gguf_writer.h"
#include "formats/safetensors.h"
#include "model/family_fixtures.h"
#include "model/model.h"

namespace llmk {
namespace {

using test::FamilyReference;
using test::ScratchDir;

constexpr double kMaxRelErr = 1e-4;
// 8-bit KV caches (EightBitKvCacheStaysCloseToFloat32): measured at most 0.154 (E4M3) and 0.034
// (int8) across the four families; bounds 1.6-1.8x those.
constexpr double kFp8MaxRelErr = 0.25, kInt8MaxRelErr = 0.06;
// A change that matters (rope scaling off, no window, ...) must move some row by at least this.
constexpr double kFarOff = 1e-2;

// Runs the prompt through the model: the first `prefill` tokens in one pass, then one token per
// call (the decode path, reading the KV cache); returns the largest row error against the
// reference and checks the argmax of every row.
double max_rel_err(Model& m, const FamilyReference& ref, size_t prefill) {
  const size_t n = ref.ids.size();
  EXPECT_EQ(m.config().vocab_size, ref.vocab);
  double worst = 0;
  auto check = [&](const Tensor& logits, size_t first) {
    for (int64_t r = 0; r < logits.dim(0); ++r) {
      const float* got = logits.data<const float>() + r * ref.vocab;
      const size_t t = first + static_cast<size_t>(r);
      worst = std::max(worst, test::row_rel_err(got, ref.row(t), ref.vocab));
    }
  };
  const std::span<const int32_t> ids(ref.ids);
  check(m.forward(ids.first(prefill), 0, true), 0);
  for (size_t t = prefill; t < n; ++t) {
    check(m.forward(ids.subspan(t, 1), static_cast<int64_t>(t), true), t);
  }
  return worst;
}

std::unique_ptr<Model> load(const std::string& path) {
  return Model::load(path, LoadOptions{.context = 64});
}

class Family : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { ref_ = FamilyReference::load(GetParam()); }
  FamilyReference ref_;
};

TEST_P(Family, FixtureIsLongerThanItsWindow) {
  const auto cfg =
      nlohmann::json::parse(test::read_text(test::family_dir(GetParam()) + "/config.json"));
  ASSERT_EQ(ref_.ids.size(), 48u);
  if (cfg.contains("sliding_window") && !cfg["sliding_window"].is_null()) {
    EXPECT_LT(cfg["sliding_window"].get<int64_t>() * 2, static_cast<int64_t>(ref_.ids.size()));
  }
  double max_abs = 0;
  for (float v : ref_.logits) max_abs = std::max(max_abs, std::abs(static_cast<double>(v)));
  EXPECT_GT(max_abs, 1.0);  // informative logits, not all near zero
}

TEST_P(Family, HfFolderMatchesTransformersAtEveryPosition) {
  auto m = load(test::family_dir(GetParam()));
  const double err = max_rel_err(*m, ref_, ref_.ids.size());
  RecordProperty("max_rel_err", std::to_string(err));
  std::printf("[ %s ] HF folder, one prefill: max rel err %.3g\n", GetParam().c_str(), err);
  EXPECT_LE(err, kMaxRelErr);
}

TEST_P(Family, PrefillThenDecodeStepsMatch) {
  auto m = load(test::family_dir(GetParam()));
  const double err = max_rel_err(*m, ref_, 5);  // 43 decode steps cross every window
  std::printf("[ %s ] HF folder, prefill 5 + decode: max rel err %.3g\n", GetParam().c_str(), err);
  EXPECT_LE(err, kMaxRelErr);
}

// An 8-bit KV cache against transformers' float32 logits: each stored K/V element carries its
// format's rounding (E4M3 3 mantissa bits: up to 1/16 of the element; int8 half of a 1/127 step
// of its head row's largest value), which moves these tiny models' logits by far more than
// float32's bound (E4M3 0.084-0.154 of the largest logit, int8 0.021-0.034) but by far less than a
// wrong scale or row would.
TEST_P(Family, EightBitKvCacheStaysCloseToFloat32) {
  for (const KvType kv : {KvType::FP8, KvType::INT8}) {
    auto m = Model::load(test::family_dir(GetParam()), LoadOptions{.context = 64, .kv_type = kv});
    EXPECT_EQ(m->kv_dtype(), kv == KvType::FP8 ? DType::F8E4M3 : DType::I8);
    const double err = max_rel_err(*m, ref_, 5);
    std::printf("[ %s ] %s KV cache, prefill 5 + decode: max rel err %.3g\n", GetParam().c_str(),
                kv_type_name(kv), err);
    EXPECT_LE(err, kv == KvType::FP8 ? kFp8MaxRelErr : kInt8MaxRelErr);
    EXPECT_GT(err, kMaxRelErr) << "the cache should not be float32";
  }
}

INSTANTIATE_TEST_SUITE_P(Families, Family, ::testing::ValuesIn(test::family_names()),
                         [](const auto& p) { return std::string(p.param); });

// ---- the test can fail: each family detail matters -----------------------------------------

template <typename Edit>
double err_with_edited_config(const std::string& family, Edit&& edit) {
  ScratchDir dir;
  const std::string folder = dir.copy_family(family, family);
  test::edit_config(folder, edit);
  const FamilyReference ref = FamilyReference::load(family);
  auto m = load(folder);
  const double err = max_rel_err(*m, ref, ref.ids.size());
  std::printf("[ %s ] edited config.json: max rel err %.3g\n", family.c_str(), err);
  return err;
}

TEST(FamilyDetails, Llama3WithoutRopeScalingIsFarOff) {
  const double err = err_with_edited_config("llama3", [](auto& j) {
    j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 10000.0}};
  });
  EXPECT_GT(err, kFarOff);
}

TEST(FamilyDetails, Phi3WithoutSlidingWindowIsFarOff) {
  EXPECT_GT(err_with_edited_config("phi3", [](auto& j) { j["sliding_window"] = nullptr; }),
            kFarOff);
}

TEST(FamilyDetails, Phi3WithFullRotaryIsFarOff) {
  EXPECT_GT(err_with_edited_config(
                "phi3", [](auto& j) { j["rope_parameters"]["partial_rotary_factor"] = 1.0; }),
            kFarOff);
}

TEST(FamilyDetails, Gemma3WithoutSlidingWindowIsFarOff) {
  EXPECT_GT(err_with_edited_config("gemma3", [](auto& j) { j["sliding_window"] = 4096; }), kFarOff);
}

TEST(FamilyDetails, Gemma3WithHeadDimScaleIsFarOff) {
  EXPECT_GT(err_with_edited_config("gemma3", [](auto& j) { j["query_pre_attn_scalar"] = 16; }),
            kFarOff);
}

TEST(FamilyDetails, Gemma3WithoutGlobalRopeScalingIsFarOff) {
  EXPECT_GT(err_with_edited_config("gemma3",
                                   [](auto& j) {
                                     j["rope_parameters"]["full_attention"] = {
                                         {"rope_type", "default"}, {"rope_theta", 1000000.0}};
                                   }),
            kFarOff);
}

TEST(FamilyDetails, Gemma3TransformersFourLayoutMatches) {
  // The same model described as transformers 4 wrote Gemma 3 configs: rope_theta,
  // rope_local_base_freq, rope_scaling for the global layers, sliding_window_pattern.
  const double err = err_with_edited_config("gemma3", [](auto& j) {
    j.erase("rope_parameters");
    j.erase("layer_types");
    j["rope_theta"] = 1000000.0;
    j["rope_local_base_freq"] = 10000.0;
    j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 4.0}};
    j["sliding_window_pattern"] = 6;
  });
  EXPECT_LE(err, kMaxRelErr);
}

TEST(FamilyDetails, Llama3TransformersFourLayoutMatches) {
  const double err = err_with_edited_config("llama3", [](auto& j) {
    auto rope = j["rope_parameters"];
    j.erase("rope_parameters");
    j["rope_theta"] = rope["rope_theta"];
    rope.erase("rope_theta");
    j["rope_scaling"] = rope;
  });
  EXPECT_LE(err, kMaxRelErr);
}

// ---- GGUF -----------------------------------------------------------------------------------

namespace gk = gguf::testkit;

std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(float));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

std::vector<float> values(const safetensors::Folder& st, const std::string& name) {
  const Tensor t = st.tensor(name);
  EXPECT_EQ(t.dtype(), DType::F32) << name;
  const float* p = t.data<const float>();
  return {p, p + t.numel()};
}

// llama.cpp's converter permutes the Q and K rows of Llama checkpoints so that RoPE rotates
// adjacent pairs: within each head, row s*(D/2) + j moves to 2j + s.
std::vector<float> permute_rows(const std::vector<float>& w, int64_t heads, int64_t cols) {
  const int64_t rows = static_cast<int64_t>(w.size()) / cols, d = rows / heads;
  std::vector<float> out(w.size());
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t s = 0; s < 2; ++s) {
      for (int64_t j = 0; j < d / 2; ++j) {
        const int64_t from = h * d + s * (d / 2) + j, to = h * d + 2 * j + s;
        std::copy_n(w.begin() + from * cols, cols, out.begin() + to * cols);
      }
    }
  }
  return out;
}

struct GgufOptions {
  bool rope_freqs = true;              // llama: write rope_freqs.weight
  std::string rope_scaling_type;       // "" = no rope.scaling.type key
  std::optional<double> freq_base;     // rope.freq_base instead of the config's
  std::optional<int64_t> block_count;  // block_count instead of the config's layer count
};

// Writes the fixture of `family` (llama3, qwen2 or phi3) as a float32 GGUF file, with the names,
// metadata and row order llama.cpp's convert_hf_to_gguf.py gives it.
std::string write_gguf(const ScratchDir& dir, const std::string& family,
                       const GgufOptions& opt = {}) {
  const std::string folder = test::family_dir(family);
  const auto cfg = nlohmann::json::parse(test::read_text(folder + "/config.json"));
  const auto st = safetensors::Folder::open(folder);
  const std::string arch = family == "llama3" ? "llama" : family;
  const int64_t d = cfg["hidden_size"], heads = cfg["num_attention_heads"];
  const int64_t kv_heads = cfg["num_key_value_heads"], layers = cfg["num_hidden_layers"];
  const int64_t head_dim = d / heads;
  const std::string p = arch + ".";
  using gguf::ValueType;
  gk::GgufBuilder b;
  b.kv("general.architecture", gk::string_value(arch))
      .kv(p + "block_count", gk::int_value(ValueType::U32, opt.block_count.value_or(layers)))
      .kv(p + "embedding_length", gk::int_value(ValueType::U32, d))
      .kv(p + "attention.head_count", gk::int_value(ValueType::U32, heads))
      .kv(p + "attention.head_count_kv", gk::int_value(ValueType::U32, kv_heads))
      .kv(p + "feed_forward_length", gk::int_value(ValueType::U32, cfg["intermediate_size"]))
      .kv(p + "context_length", gk::int_value(ValueType::U32, cfg["max_position_embeddings"]))
      .kv(p + "vocab_size", gk::int_value(ValueType::U32, cfg["vocab_size"]))
      .kv(p + "attention.layer_norm_rms_epsilon",
          gk::float_value(ValueType::F32, cfg["rms_norm_eps"]))
      .kv(p + "rope.freq_base",
          gk::float_value(ValueType::F32, opt.freq_base.value_or(
                                              cfg["rope_parameters"]["rope_theta"].get<double>())));
  int64_t rope_dim = head_dim;
  if (family == "phi3") {
    rope_dim = static_cast<int64_t>(static_cast<double>(head_dim) *
                                    cfg["rope_parameters"]["partial_rotary_factor"].get<double>());
    b.kv(p + "attention.sliding_window", gk::int_value(ValueType::U32, cfg["sliding_window"]));
  }
  b.kv(p + "rope.dimension_count", gk::int_value(ValueType::U32, rope_dim));
  if (!opt.rope_scaling_type.empty()) {
    b.kv(p + "rope.scaling.type", gk::string_value(opt.rope_scaling_type));
    b.kv(p + "rope.scaling.factor", gk::float_value(ValueType::F32, 4.0));
  }

  auto add = [&](const std::string& name, const Shape& shape, const std::vector<float>& v) {
    EXPECT_EQ(shape_numel(shape), static_cast<int64_t>(v.size())) << name;
    std::vector<uint64_t> ne(shape.rbegin(), shape.rend());
    b.tensor(gk::TensorSpec{name, ne, /*F32*/ 0, f32_bytes(v), std::nullopt});
  };
  auto copy = [&](const std::string& gguf_name, const std::string& hf_name) {
    add(gguf_name, st.tensor_info(hf_name).shape, values(st, hf_name));
  };
  copy("token_embd.weight", "model.embed_tokens.weight");
  copy("output_norm.weight", "model.norm.weight");
  if (st.find("lm_head.weight") != nullptr) copy("output.weight", "lm_head.weight");
  if (family == "llama3" && opt.rope_freqs) {
    const auto f = FamilyReference::load(family).meta.at("llama_cpp_rope_freqs");
    add("rope_freqs.weight", {head_dim / 2}, f.get<std::vector<float>>());
  }
  for (int64_t i = 0; i < layers; ++i) {
    const std::string g = "blk." + std::to_string(i) + ".";
    const std::string h = "model.layers." + std::to_string(i) + ".";
    copy(g + "attn_norm.weight", h + "input_layernorm.weight");
    copy(g + "ffn_norm.weight", h + "post_attention_layernorm.weight");
    copy(g + "attn_output.weight", h + "self_attn.o_proj.weight");
    copy(g + "ffn_down.weight", h + "mlp.down_proj.weight");
    if (family == "phi3") {
      copy(g + "attn_qkv.weight", h + "self_attn.qkv_proj.weight");
      copy(g + "ffn_up.weight", h + "mlp.gate_up_proj.weight");  // gate|up, as the converter
      continue;
    }
    copy(g + "ffn_gate.weight", h + "mlp.gate_proj.weight");
    copy(g + "ffn_up.weight", h + "mlp.up_proj.weight");
    copy(g + "attn_v.weight", h + "self_attn.v_proj.weight");
    if (family == "llama3") {
      add(g + "attn_q.weight", {heads * head_dim, d},
          permute_rows(values(st, h + "self_attn.q_proj.weight"), heads, d));
      add(g + "attn_k.weight", {kv_heads * head_dim, d},
          permute_rows(values(st, h + "self_attn.k_proj.weight"), kv_heads, d));
    } else {  // qwen2: rows as they are, and the biases
      copy(g + "attn_q.weight", h + "self_attn.q_proj.weight");
      copy(g + "attn_k.weight", h + "self_attn.k_proj.weight");
      for (const char* x : {"q", "k", "v"}) {
        copy(g + "attn_" + x + ".bias", h + "self_attn." + x + "_proj.bias");
      }
    }
  }
  const std::string path = dir.path() + "/" + family + ".gguf";
  test::write_text(path, std::string(reinterpret_cast<const char*>(b.build().bytes.data()),
                                     b.build().bytes.size()));
  return path;
}

class GgufFamily : public ::testing::TestWithParam<std::string> {};

TEST_P(GgufFamily, GgufFileMatchesTransformersAtEveryPosition) {
  ScratchDir dir;
  const FamilyReference ref = FamilyReference::load(GetParam());
  auto m = load(write_gguf(dir, GetParam()));
  ASSERT_TRUE(m->gguf().has_value());
  const double err = max_rel_err(*m, ref, 7);
  std::printf("[ %s ] GGUF, prefill 7 + decode: max rel err %.3g\n", GetParam().c_str(), err);
  EXPECT_LE(err, kMaxRelErr);
}

INSTANTIATE_TEST_SUITE_P(Families, GgufFamily, ::testing::Values("llama3", "qwen2", "phi3"),
                         [](const auto& p) { return std::string(p.param); });

TEST(GgufFamilyDetails, Llama3WithoutRopeFreqsTensorIsFarOff) {
  ScratchDir dir;
  const FamilyReference ref = FamilyReference::load("llama3");
  auto m = load(write_gguf(dir, "llama3", {.rope_freqs = false}));
  EXPECT_GT(max_rel_err(*m, ref, ref.ids.size()), kFarOff);
}

TEST(GgufFamilyDetails, LinearRopeScalingKeyIsRead) {
  // rope.scaling.type linear with factor 4 changes the angles: far from the unscaled reference.
  ScratchDir dir;
  const FamilyReference ref = FamilyReference::load("qwen2");
  auto m = load(write_gguf(dir, "qwen2", {.rope_scaling_type = "linear"}));
  EXPECT_FLOAT_EQ(m->config().rope_freq_scale, 0.25f);
  EXPECT_GT(max_rel_err(*m, ref, ref.ids.size()), kFarOff);
}

// Loading `path` fails with one line that names the file and holds `phrase`.
void expect_gguf_error(const std::string& path, const std::string& phrase) {
  try {
    load(path);
    ADD_FAILURE() << "loaded " << path << "; expected an error with " << phrase;
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind(path + ": ", 0), 0u) << msg;
    EXPECT_NE(msg.find(phrase), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

TEST(GgufFamilyDetails, UnknownRopeScalingTypeIsOneClearLine) {
  ScratchDir dir;
  expect_gguf_error(write_gguf(dir, "qwen2", {.rope_scaling_type = "yarn"}),
                    "qwen2.rope.scaling.type 'yarn' is not supported");
}

TEST(GgufFamilyDetails, NanRopeBaseNamesFileAndKey) {
  ScratchDir dir;
  expect_gguf_error(write_gguf(dir, "qwen2", {.freq_base = std::nan("")}),
                    "qwen2.rope.freq_base = nan must be a finite number > 1");
}

TEST(GgufFamilyDetails, BlockCountBelowTheStoredLayersIsAnError) {
  // The file holds 3 layers; running 2 of them would be a silent wrong answer.
  ScratchDir dir;
  expect_gguf_error(write_gguf(dir, "llama3", {.block_count = 2}),
                    "belongs to layer 2, but its block_count says the model has 2 layers");
}

}  // namespace
}  // namespace llmk
