// `llmk quantize` end to end: the built binary writes GGUF files from the family fixtures
// (tests/fixtures/families: tiny random models) and from a wide random GGUF made here, and llmk's
// own loader reads them back.
//
// What is checked, and against what:
//  - --type f32 from a Hugging Face folder (names, metadata, tokenizer, Llama's interleaved Q/K
//    rows, Gemma's norms + 1, Llama 3's rope_freqs): the GGUF file's logits equal the folder's
//    (measured at most 6e-7 of the largest logit; bound 1e-5), its tokenizer gives the same ids.
//  - a GGUF input: folder -> f32 GGUF -> q4_k_m is the same file, byte for byte, as folder ->
//    q4_k_m.
//  - quantised files: every weight within its type's error of the f32 original, the types of
//    llama.cpp's Q4_K_M rule on a model whose rows are whole 256-blocks, logits near the
//    original's, and `llmk run` generating from them.
//  - each refusal is one "llmk: error:" line that names the problem, and leaves no file behind.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "apps/cli_util.h"
#include "core/half.h"
#include "formats/gguf.h"
#include "formats/gguf_write.h"
#include "kernels/cpu/dequant.h"
#include "model/family_fixtures.h"
#include "model/model.h"
#include "random_llama_gguf.h"
#include "tokenizer/tokenizer.h"

namespace llmk {
namespace {

namespace fs = std::filesystem;
using test::CliResult;
using test::run_llmk;

class QuantizeCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("llmk_quantize_cli_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  // `llmk quantize IN OUT --type TYPE`; expects success unless told otherwise.
  CliResult quantize(const std::string& in, const std::string& out, const std::string& type,
                     const std::string& extra = "", bool ok = true) const {
    const CliResult r =
        run_llmk("quantize '" + in + "' '" + out + "' --type " + type + " -t 2 " + extra, dir_);
    if (ok) {
      EXPECT_EQ(r.code, 0) << r.err;
      EXPECT_NE(r.out.find("bits per weight"), std::string::npos) << r.out;
    }
    return r;
  }
  // A copy of a family fixture, tokenizer files included, with config.json edited.
  template <typename Edit>
  std::string edited_family(const std::string& family, Edit&& edit) const {
    const fs::path dst = dir_ / (family + "-edited");
    fs::copy(test::family_dir(family), dst, fs::copy_options::recursive);
    test::edit_config(dst.string(), edit);
    return dst.string();
  }

  fs::path dir_;
};

// The ids of a short prompt that uses most of a 512-token vocabulary's range.
std::vector<int32_t> prompt_ids(int64_t vocab) {
  std::vector<int32_t> ids;
  for (int i = 0; i < 24; ++i) ids.push_back(static_cast<int32_t>((i * 37 + 5) % vocab));
  return ids;
}

// All logits of the prompt, prefilled in one pass.
std::vector<float> logits_of(const std::string& model, const std::vector<int32_t>& ids) {
  auto m = Model::load(model, LoadOptions{.context = 64});
  const Tensor t = m->forward(ids, 0, true);
  return {t.data<const float>(), t.data<const float>() + t.numel()};
}

// The largest row error between two [rows, vocab] logit sets (test::row_rel_err).
double max_rel_err(const std::vector<float>& got, const std::vector<float>& want, int64_t vocab) {
  EXPECT_EQ(got.size(), want.size());
  double worst = 0;
  for (size_t r = 0; r + static_cast<size_t>(vocab) <= want.size();
       r += static_cast<size_t>(vocab)) {
    worst = std::max(worst, test::row_rel_err(got.data() + r, want.data() + r, vocab));
  }
  return worst;
}

// ---- Hugging Face folders to GGUF ---------------------------------------------------------

struct FolderCase {
  const char* family;
  bool edit_gemma_scale;  // Gemma 3's fixture uses a query_pre_attn_scalar GGUF cannot carry
};

class QuantizeFolder : public QuantizeCli, public ::testing::WithParamInterface<FolderCase> {};

TEST_P(QuantizeFolder, F32GgufRunsAndTokenizesLikeTheFolder) {
  const FolderCase c = GetParam();
  const std::string folder =
      c.edit_gemma_scale
          ? edited_family(c.family, [](auto& j) { j["query_pre_attn_scalar"] = j["head_dim"]; })
          : test::family_dir(c.family);
  const std::string out = path(std::string(c.family) + ".gguf");
  quantize(folder, out, "f32");

  const ModelConfig cfg = Model::load(out, LoadOptions{.context = 64})->config();
  const std::vector<int32_t> ids = prompt_ids(cfg.vocab_size);
  const double err = max_rel_err(logits_of(out, ids), logits_of(folder, ids), cfg.vocab_size);
  std::printf("[ %s ] f32 GGUF vs folder: max rel err %.3g\n", c.family, err);
  EXPECT_LE(err, 1e-5);

  const Tokenizer hf = Tokenizer::from_hf_json(folder);
  const Tokenizer gg = Tokenizer::from_gguf(gguf::File::open(out));
  for (const char* text : {"Hello world, this is a test.", "  two spaces\tand a tab\nnewline",
                           "numbers 12345 and symbols #$%&", "caf\xc3\xa9 na\xc3\xafve"}) {
    EXPECT_EQ(gg.encode(text, false, true), hf.encode(text, false, true)) << text;
  }
  EXPECT_EQ(gg.chat_template(), hf.chat_template());
  EXPECT_EQ(gg.bos_id(), hf.bos_id());
  EXPECT_EQ(gg.eos_id(), hf.eos_id());
  EXPECT_EQ(gg.add_bos(), hf.add_bos());
  EXPECT_EQ(gg.end_of_generation_ids(), hf.end_of_generation_ids());
}

INSTANTIATE_TEST_SUITE_P(Families, QuantizeFolder,
                         ::testing::Values(FolderCase{"llama3", false}, FolderCase{"qwen2", false},
                                           FolderCase{"gemma3", true}),
                         [](const auto& p) { return std::string(p.param.family); });

TEST_F(QuantizeCli, GgufInputGivesTheSameFileAsTheFolder) {
  const std::string folder = test::family_dir("llama3");
  quantize(folder, path("f32.gguf"), "f32");
  quantize(path("f32.gguf"), path("from-gguf.gguf"), "q4_k_m");
  quantize(folder, path("from-folder.gguf"), "q4_k_m");
  const std::string a = test::slurp(path("from-gguf.gguf")),
                    b = test::slurp(path("from-folder.gguf"));
  ASSERT_GT(a.size(), 100000u);
  EXPECT_TRUE(a == b) << "the two q4_k_m files differ";
}

// ---- quantised files --------------------------------------------------------------------------

// Each weight of `q` against the same tensor of the f32 file: relative RMS error at most `bound`
// for its type (half a step of uniform rounding is 0.29 steps; a block's step is its range over
// its levels).
void expect_weights_close(const std::string& q, const std::string& f32) {
  const gguf::File fq = gguf::File::open(q), ff = gguf::File::open(f32);
  ASSERT_EQ(fq.tensors().size(), ff.tensors().size());
  for (const gguf::TensorInfo& t : fq.tensors()) {
    const Tensor want = ff.tensor(t.name);
    ASSERT_EQ(want.dtype(), DType::F32) << t.name;
    ASSERT_EQ(want.shape(), t.shape) << t.name;
    std::vector<float> got(static_cast<size_t>(want.numel()));
    cpu::dequantize_row(t.dtype, fq.tensor(t.name).data(), got.data(), want.numel());
    double err = 0, norm = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const double w = want.data<const float>()[i];
      err += (got[i] - w) * (got[i] - w);
      norm += w * w;
    }
    const double rel = std::sqrt(err / norm);
    // Random Gaussian weights: a block's range is about 5 standard deviations, so the RMS error
    // is about 0.29 * 5 / levels of the RMS weight (q8_0: 0.006, q5_0: 0.05, q4_k: 0.1).
    const double bound = t.dtype == DType::F32    ? 0.0
                         : t.dtype == DType::Q8_0 ? 0.01
                         : t.dtype == DType::Q6_K ? 0.03
                         : t.dtype == DType::Q5_0 ? 0.06
                                                  : 0.12;
    EXPECT_LE(rel, bound) << t.name << " (" << dtype_name(t.dtype) << ")";
  }
}

// The GGUF file `q` with every tensor dequantised to f32: the weights `q` holds, in a file that
// llmk runs through its float path. A quantised file's logits must equal this one's but for the
// order of the additions: that checks that the blocks are read as they were written.
std::string dequantized_copy(const std::string& q, const std::string& out) {
  const gguf::File f = gguf::File::open(q);
  gguf::Writer w;
  for (const auto& [key, value] : f.metadata()) w.set(key, value);
  for (const gguf::TensorInfo& t : f.tensors()) w.add_tensor(t.name, t.shape, DType::F32);
  w.open(out);
  for (const gguf::TensorInfo& t : f.tensors()) {
    std::vector<float> v(static_cast<size_t>(shape_numel(t.shape)));
    cpu::dequantize_row(t.dtype, f.tensor(t.name).data(), v.data(), shape_numel(t.shape));
    w.write(v.data(), v.size() * sizeof(float));
  }
  w.finish();
  return out;
}

TEST_F(QuantizeCli, QuantisedFilesStayCloseAndGenerate) {
  const std::string folder = test::family_dir("llama3");
  quantize(folder, path("f32.gguf"), "f32");
  const ModelConfig cfg = Model::load(path("f32.gguf"), LoadOptions{.context = 64})->config();
  const std::vector<int32_t> ids = prompt_ids(cfg.vocab_size);
  const std::vector<float> want = logits_of(path("f32.gguf"), ids);
  for (const char* type : {"q8_0", "q4_k_m", "q5_1"}) {
    SCOPED_TRACE(type);
    const std::string out = path(std::string(type) + ".gguf");
    quantize(folder, out, type);
    expect_weights_close(out, path("f32.gguf"));
    const std::vector<float> got = logits_of(out, ids);
    const std::string same = dequantized_copy(out, path(std::string(type) + "-dq.gguf"));
    const double exact = max_rel_err(got, logits_of(same, ids), cfg.vocab_size);
    const double err = max_rel_err(got, want, cfg.vocab_size);
    std::printf("[ %s ] logits vs its weights in f32: %.3g, vs the original: %.3g\n", type, exact,
                err);
    EXPECT_LE(exact, 1e-5);
    // Against the original, quantisation moves these tiny random models a lot: q8_0 measured
    // 0.040 here (transformers run on the same q8_0-rounded weights moves as much: 0.031 for
    // another prompt, where llmk gave 0.031 too); q4_k_m 0.33, q5_1 less.
    EXPECT_LE(err, std::string(type) == "q8_0" ? 0.08 : 0.5);
    const CliResult r =
        run_llmk("run -m " + out + " -p 'Hello' -n 8 --temp 0 --ignore-eos -t 2", dir_);
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_FALSE(r.out.empty());
  }
}

// A random Llama model whose rows are whole 256-blocks (the fixtures' 128-wide rows make every
// k-quant fall back), written with the library's GGUF writer: f32, no tokenizer.
std::string write_wide_model(const std::string& path, int64_t layers) {
  return test::write_random_llama(path, {.layers = layers},
                                  [](const std::string&) { return DType::F32; });
}

TEST_F(QuantizeCli, Q4KMFollowsLlamaCppOnWholeBlockRows) {
  const int64_t layers = 8;  // use_more_bits: layers 0 and 7 (first and last eighth), 3 and 6
  const std::string f32 = write_wide_model(path("wide.gguf"), layers);
  const std::string out = path("wide-q4km.gguf");
  quantize(f32, out, "q4_k_m");
  const gguf::File f = gguf::File::open(out);
  EXPECT_EQ(f.get_int("general.file_type"), 15);  // LLAMA_FTYPE_MOSTLY_Q4_K_M
  EXPECT_EQ(f.tensor_info("output.weight").dtype, DType::Q6_K);
  EXPECT_EQ(f.tensor_info("token_embd.weight").dtype, DType::Q4_K);
  EXPECT_EQ(f.tensor_info("output_norm.weight").dtype, DType::F32);
  for (int64_t i = 0; i < layers; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".";
    const DType more = i == 0 || i == 3 || i == 6 || i == 7 ? DType::Q6_K : DType::Q4_K;
    EXPECT_EQ(f.tensor_info(b + "attn_v.weight").dtype, more) << i;
    EXPECT_EQ(f.tensor_info(b + "ffn_down.weight").dtype, more) << i;
    for (const char* n : {"attn_q.weight", "attn_k.weight", "attn_output.weight", "ffn_gate.weight",
                          "ffn_up.weight"}) {
      EXPECT_EQ(f.tensor_info(b + n).dtype, DType::Q4_K) << b << n;
    }
  }
  expect_weights_close(out, f32);
  const std::vector<int32_t> ids = prompt_ids(256);
  const double err = max_rel_err(logits_of(out, ids),
                                 logits_of(dequantized_copy(out, path("wide-dq.gguf")), ids), 256);
  std::printf("[ wide q4_k_m ] logits vs its weights in f32: max rel err %.3g\n", err);
  EXPECT_LE(err, 1e-5);
}

// ---- refusals ---------------------------------------------------------------------------------

TEST_F(QuantizeCli, HelpNamesEveryType) {
  const CliResult r = run_llmk("quantize --help", dir_);
  EXPECT_EQ(r.code, 0);
  for (const char* t : {"q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k", "q4_k_m"}) {
    EXPECT_NE(r.out.find(std::string("\n  ") + t + " "), std::string::npos) << t;
  }
}

TEST_F(QuantizeCli, RefusalsAreOneClearLine) {
  const std::string folder = test::family_dir("llama3");
  const std::string out = path("out.gguf");
  test::expect_clean_error(quantize(path("absent"), out, "q8_0", "", false),
                           {"absent: no such file or folder"});
  test::expect_clean_error(quantize(folder, out, "q3_k", "", false),
                           {"unknown type 'q3_k'", "q4_k_m"});
  test::expect_clean_error(quantize(folder, path("no/such/dir/x.gguf"), "q8_0", "", false),
                           {"does not exist"});
  test::expect_clean_error(quantize(test::family_dir("phi3"), out, "q8_0", "", false),
                           {"phi3/tokenizer.json", "adds a space before the text"});
  test::expect_clean_error(quantize(test::family_dir("gemma3"), out, "q8_0", "", false),
                           {"query_pre_attn_scalar 24 differs from the head dim 64"});
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(fs::exists(out + ".partial"));

  quantize(folder, out, "q8_0");
  const std::string first = test::slurp(out);
  test::expect_clean_error(quantize(folder, out, "q4_0", "", false),
                           {"out.gguf: already exists; pass --force"});
  EXPECT_EQ(test::slurp(out), first);  // left as it was
  test::expect_clean_error(quantize(out, out, "q4_0", "--force", false), {"is the input"});
  test::expect_clean_error(quantize(out, path("again.gguf"), "q4_0", "", false),
                           {"already quantised", "is q8_0", "requantising is not supported"});
  quantize(folder, out, "q4_0", "--force");
  EXPECT_NE(test::slurp(out), first);
}

TEST_F(QuantizeCli, IntegerTensorIsRefused) {
  gguf::Writer w;
  w.set("general.architecture", gguf::Value(gguf::ValueType::STRING, std::string("llama")));
  w.add_tensor("token_embd.weight", {4, 32}, DType::F32);
  w.add_tensor("ids.weight", {8}, DType::I32);
  w.open(path("ints.gguf"));
  const std::vector<uint8_t> zeros(512, 0);
  w.write(zeros.data(), 4 * 32 * 4);
  w.write(zeros.data(), 8 * 4);
  w.finish();
  test::expect_clean_error(quantize(path("ints.gguf"), path("out.gguf"), "q8_0", "", false),
                           {"tensor 'ids.weight' has dtype i32"});
}

}  // namespace
}  // namespace llmk
