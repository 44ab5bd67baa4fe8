// The real models in models/: known facts about their metadata and tensors, and tensor views
// that hold exactly the file's bytes.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <map>

#include "formats/gguf.h"
#include "gguf_model_util.h"
#include "gguf_test_util.h"
#include "test_paths.h"

namespace llmk::gguf {
namespace {

using namespace testkit;  // NOLINT: the writer helpers

std::vector<uint8_t> pread_bytes(int fd, uint64_t offset, uint64_t n) {
  std::vector<uint8_t> out(n);
  uint64_t done = 0;
  while (done < n) {
    const ssize_t got = pread(fd, out.data() + done, n - done, static_cast<off_t>(offset + done));
    if (got <= 0) throw std::runtime_error("pread failed");
    done += static_cast<uint64_t>(got);
  }
  return out;
}

TEST(GgufModel, SmolLM2KnownFacts) {
  const std::string path = test::model_path(test::kSmolLM2);
  const File f = File::open(path);

  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.file_size(), 98362432u);
  EXPECT_EQ(f.tensors().size(), 272u);
  EXPECT_EQ(f.metadata().size(), 33u);
  EXPECT_EQ(f.metadata().front().first, "general.architecture");
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_string("general.name"), "Smollm2 135M 8k Lc100K Mix1 Ep2");
  EXPECT_EQ(f.get_int("llama.block_count"), 30);
  EXPECT_EQ(f.get_int("llama.embedding_length"), 576);
  EXPECT_EQ(f.get_int("llama.attention.head_count"), 9);
  EXPECT_EQ(f.get_int("llama.attention.head_count_kv"), 3);
  EXPECT_EQ(f.get_float("llama.rope.freq_base"), 100000.0);
  EXPECT_EQ(static_cast<float>(f.get_float("llama.attention.layer_norm_rms_epsilon")), 1e-5f);
  EXPECT_EQ(f.get_int("tokenizer.ggml.eos_token_id"), 2);
  EXPECT_FALSE(f.get_bool("tokenizer.ggml.add_bos_token"));
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "gpt2");

  const Value::Array& tokens = f.get("tokenizer.ggml.tokens").as_array();
  EXPECT_EQ(tokens.elem, ValueType::STRING);
  ASSERT_EQ(tokens.size(), 49152u);
  ASSERT_EQ(tokens.strings.size(), 49152u);
  EXPECT_EQ(tokens.strings[0], "<|endoftext|>");
  EXPECT_EQ(tokens.strings[2], "<|im_end|>");
  EXPECT_EQ(tokens.strings.back(), "ectable");
  EXPECT_EQ(f.get("tokenizer.ggml.tokens").to_string(2),
            "[\"<|endoftext|>\", \"<|im_start|>\", ...] (49152 x string)");
  const Value::Array& types = f.get("tokenizer.ggml.token_type").as_array();
  EXPECT_EQ(types.elem, ValueType::I32);
  ASSERT_EQ(types.ints.size(), 49152u);
  EXPECT_EQ(types.ints[0], 3);
  EXPECT_EQ(types.ints[17], 1);
  const Value::Array& merges = f.get("tokenizer.ggml.merges").as_array();
  ASSERT_EQ(merges.strings.size(), 48900u);
  EXPECT_EQ(merges.strings[0], "\xc4\xa0 t");

  const TensorInfo& embd = f.tensor_info("token_embd.weight");
  EXPECT_EQ(embd.dtype, DType::Q8_0);
  EXPECT_EQ(embd.ggml_type, 8u);
  EXPECT_EQ(embd.shape, (Shape{49152, 576}));
  EXPECT_EQ(embd.offset, 0u);
  EXPECT_EQ(embd.nbytes, 49152u * 576 / 32 * 34);
  const TensorInfo& down = f.tensor_info("blk.0.ffn_down.weight");
  EXPECT_EQ(down.dtype, DType::Q4_1);
  EXPECT_EQ(down.shape, (Shape{576, 1536}));
  EXPECT_EQ(down.nbytes, 576u * 1536 / 32 * 20);
  EXPECT_EQ(f.tensor_info("blk.29.attn_v.weight").shape, (Shape{192, 576}));
  EXPECT_EQ(f.tensor_info("output_norm.weight").dtype, DType::F32);
  EXPECT_EQ(f.tensor_info("output_norm.weight").shape, (Shape{576}));

  std::map<DType, int> counts;
  for (const TensorInfo& t : f.tensors()) ++counts[t.dtype];
  EXPECT_EQ(counts[DType::Q4_1], 210);
  EXPECT_EQ(counts[DType::F32], 61);
  EXPECT_EQ(counts[DType::Q8_0], 1);
}

// The header written again from what the reader parsed is byte for byte the file's, so the
// reader lost or changed nothing; its length is where the data section starts.
TEST(GgufModel, SmolLM2HeaderRewritesToTheSameBytesAndViewsMatchTheFile) {
  const std::string path = test::model_path(test::kSmolLM2);
  const File f = File::open(path);
  const Layout header = rewrite_header(f);
  ASSERT_EQ(header.data_offset, 1785664u);  // as gguf-py reports it

  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  EXPECT_TRUE(pread_bytes(fd, 0, header.data_offset) == header.bytes)
      << "re-serialised header differs from the file's first " << header.data_offset << " bytes";

  uint64_t total = 0;
  for (const TensorInfo& t : f.tensors()) {
    const Tensor view = f.tensor(t.name);
    ASSERT_EQ(static_cast<uint64_t>(view.nbytes()), t.nbytes) << t.name;
    ASSERT_EQ(view.shape(), t.shape) << t.name;
    const std::vector<uint8_t> want = pread_bytes(fd, header.data_offset + t.offset, t.nbytes);
    ASSERT_EQ(std::memcmp(view.data(), want.data(), t.nbytes), 0) << t.name;
    total += t.nbytes;
  }
  close(fd);
  // The tensors fill the data section exactly (each is a multiple of 32 bytes here).
  EXPECT_EQ(header.data_offset + total, f.file_size());
  // Not vacuous: the data is not all zeros.
  const Tensor norm = f.tensor("output_norm.weight");
  EXPECT_NE(norm.data<float>()[0], 0.0f);
}

TEST(GgufModel, Gemma3HasKQuants) {
  const File f = File::open(test::model_path(test::kGemma3));
  EXPECT_EQ(f.get_string("general.architecture"), "gemma3");
  EXPECT_EQ(f.get_int("gemma3.block_count"), 18);
  EXPECT_EQ(f.get_int("gemma3.embedding_length"), 640);
  EXPECT_EQ(f.tensors().size(), 236u);
  EXPECT_EQ(f.get("tokenizer.ggml.tokens").as_array().size(), 262144u);
  EXPECT_EQ(f.get("tokenizer.ggml.scores").as_array().floats.size(), 262144u);
  std::map<DType, int> counts;
  for (const TensorInfo& t : f.tensors()) ++counts[t.dtype];
  EXPECT_EQ(counts[DType::Q5_0], 81);
  EXPECT_EQ(counts[DType::Q4_K], 27);
  EXPECT_EQ(counts[DType::Q6_K], 9);
  EXPECT_EQ(counts[DType::Q8_0], 10);
  EXPECT_EQ(counts[DType::F32], 109);
  EXPECT_EQ(f.tensor_info("blk.0.attn_output.weight").dtype, DType::Q4_K);
  EXPECT_EQ(f.tensor_info("blk.0.attn_output.weight").shape, (Shape{640, 1024}));
  EXPECT_EQ(f.tensor_info("blk.0.ffn_down.weight").dtype, DType::Q6_K);
  EXPECT_EQ(f.tensor_info("blk.0.attn_k.weight").dtype, DType::Q5_0);
  EXPECT_EQ(f.tensor_info("blk.0.attn_k.weight").shape, (Shape{256, 640}));
  EXPECT_EQ(rewrite_header(f).data_offset, 6525120u);
}

}  // namespace
}  // namespace llmk::gguf
