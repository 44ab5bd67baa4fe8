// Bad GGUF files: each gives one llmk::Error whose message names the file and the problem.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <string>

#include "core/error.h"
#include "formats/gguf.h"
#include "gguf_test_util.h"
#include "gguf_writer.h"

namespace llmk::gguf {
namespace {

using namespace testkit;  // NOLINT: the writer helpers

class GgufErrors : public ::testing::Test {
 protected:
  // Writes the builder's file and expects opening it to fail with the path and every phrase.
  std::string fails(const GgufBuilder& b, std::initializer_list<std::string_view> phrases) {
    return fails(b.build().bytes, phrases);
  }
  std::string fails(const std::vector<uint8_t>& bytes,
                    std::initializer_list<std::string_view> phrases) {
    const std::string path = dir_.write("bad" + std::to_string(n_++) + ".gguf", bytes);
    const std::string msg = expect_open_error(path, phrases);
    EXPECT_EQ(msg.rfind(path + ": ", 0), 0u) << "message does not start with the path: " << msg;
    return msg;
  }
  // A valid little file to start from.
  static GgufBuilder base() {
    GgufBuilder b;
    b.kv("general.architecture", string_value("llama"));
    b.tensor("w", {32, 2}, 0, 256);
    return b;
  }
  static std::vector<uint8_t> u32le(uint32_t v) { return Bytes().u32(v).buf; }

  TempDir dir_;
  int n_ = 0;
};

TEST_F(GgufErrors, BaseFileIsValid) {
  const File f = File::open(dir_.write("ok.gguf", base().build().bytes));
  EXPECT_EQ(f.tensor_info("w").shape, (Shape{2, 32}));
}

TEST_F(GgufErrors, MissingFileNamesThePathAndTheReason) {
  const std::string path = dir_.path() + "/does-not-exist.gguf";
  const std::string msg = expect_open_error(path, {"No such file or directory"});
  EXPECT_EQ(msg, path + ": cannot open: No such file or directory");
}

TEST_F(GgufErrors, UnreadableFile) {
  const std::string path = dir_.write("noperm.gguf", base().build().bytes);
  chmod(path.c_str(), 0);
  if (geteuid() == 0) {
    // root reads anything; the check is still that opening does not fail for other reasons.
    EXPECT_NO_THROW(File::open(path));
  } else {
    expect_open_error(path, {path, "Permission denied"});
  }
}

TEST_F(GgufErrors, DirectoryIsNotARegularFile) {
  expect_open_error(dir_.path(), {dir_.path(), "not a regular file"});
}

TEST_F(GgufErrors, FifoIsRejectedWithoutWaitingForAWriter) {
  const std::string path = dir_.path() + "/fifo.gguf";
  ASSERT_EQ(mkfifo(path.c_str(), 0600), 0);
  expect_open_error(path, {path, "not a regular file"});
}

TEST_F(GgufErrors, SmallerThanAHeader) {
  fails(std::vector<uint8_t>{}, {"too small", "0 bytes"});
  fails(std::vector<uint8_t>{'G', 'G', 'U', 'F', 3, 0, 0, 0, 0, 0}, {"too small", "10 bytes"});
  fails(std::vector<uint8_t>{'a', 'b', 'c', 'd', 'e'}, {"bad magic", "5 bytes"});
}

TEST_F(GgufErrors, WrongMagicSaysWhatWasFound) {
  GgufBuilder b = base();
  b.magic = "GGML";
  EXPECT_NE(fails(b, {"not a GGUF file", "bad magic 'GGML'"}).find("expected 'GGUF'"),
            std::string::npos);
  b.magic = std::string("\x00\x01GU", 4);
  fails(b, {"bad magic '\\x00\\x01GU'"});
  std::string lfs = "version https://git-lfs.github.com/spec/v1\noid sha256:0123\nsize 99\n";
  fails(std::vector<uint8_t>(lfs.begin(), lfs.end()), {"bad magic 'vers'", "Git LFS pointer"});
  std::string html = "<!DOCTYPE html><html><body>Not found</body></html>";
  fails(std::vector<uint8_t>(html.begin(), html.end()), {"HTML page"});
}

TEST_F(GgufErrors, UnsupportedVersions) {
  GgufBuilder b = base();
  b.version = 1;
  fails(b, {"GGUF version 1 is not supported"});
  b.version = 0;
  fails(b, {"unsupported GGUF version 0"});
  b.version = 4;
  fails(b, {"unsupported GGUF version 4"});
  b.version = 0x03000000;  // a big-endian v3 file read as little-endian
  fails(b, {"big-endian", "0x03000000"});
  b.version = 0x02000000;
  fails(b, {"big-endian"});
}

TEST_F(GgufErrors, CountsThatCannotFitAreRejectedBeforeAllocating) {
  GgufBuilder b = base();
  b.kv_count_override = 1ULL << 60;
  fails(b, {"metadata entries cannot fit", "1152921504606846976"});
  b = base();
  b.tensor_count_override = ~0ULL;
  fails(b, {"18446744073709551615 tensors", "cannot fit"});
  b = base();
  b.kv("general.description", string_value(std::string(1000, 'x')));
  b.tensor_count_override = 20;  // fits by the header's estimate, not after the metadata
  fails(b, {"20 tensor infos cannot fit", "truncated or corrupt"});
  b = base();
  b.tensor_count_override = 2;  // the second tensor info is read from the data section
  fails(b, {"tensor info 1 of 2", "empty tensor name"});
}

TEST_F(GgufErrors, StringLengthPastTheEnd) {
  GgufBuilder b = base();
  b.raw_kv("general.name", Bytes().u32(8).u64(1ULL << 62).buf);
  fails(b, {"general.name", "truncated or corrupt", "string value", "4611686018427387904"});
  b = base();
  // A key length past the end.
  std::vector<uint8_t> bytes = b.build().bytes;
  bytes[24] = 0xff;
  bytes[31] = 0x7f;
  fails(bytes, {"metadata entry 0 of 1", "key", "claims"});
}

TEST_F(GgufErrors, ArrayCountThatCannotFit) {
  GgufBuilder b = base();
  b.raw_kv("tokenizer.ggml.tokens", Bytes().u32(9).u32(8).u64(1ULL << 40).buf);
  fails(b, {"tokenizer.ggml.tokens", "array of 1099511627776 string elements", "cannot fit"});
  b = base();
  b.raw_kv("x", Bytes().u32(9).u32(4).u64(~0ULL).buf);
  fails(b, {"'x'", "cannot fit"});
  b = base();
  b.raw_kv("x", Bytes().u32(9).u32(9).u64(1ULL << 50).buf);  // array of arrays
  fails(b, {"'x'", "cannot fit"});
}

TEST_F(GgufErrors, UnknownValueTypes) {
  GgufBuilder b = base();
  b.raw_kv("weird.key", u32le(13));
  fails(b, {"'weird.key'", "unknown value type 13"});
  b = base();
  b.raw_kv("weird.array", Bytes().u32(9).u32(0xdeadbeef).u64(1).buf);
  fails(b, {"'weird.array'", "unknown value type 3735928559"});
}

TEST_F(GgufErrors, BadValues) {
  GgufBuilder b = base();
  b.raw_kv("flag", Bytes().u32(7).u8(2).buf);
  fails(b, {"'flag'", "invalid bool value 2"});
  b = base();
  b.raw_kv("flags", Bytes().u32(9).u32(7).u64(2).u8(1).u8(7).buf);
  fails(b, {"'flags'", "invalid bool value 7"});
  b = base();
  b.raw_kv("ids", Bytes().u32(9).u32(10).u64(1).u64(1ULL << 63).buf);
  fails(b, {"'ids'", "does not fit in int64"});
  b = base();
  b.raw_kv("", Bytes().u32(4).u32(1).buf);
  fails(b, {"empty metadata key"});
}

TEST_F(GgufErrors, ArraysNestedTooDeep) {
  Value v = int_array(ValueType::I32, {1});
  for (int i = 0; i < 9; ++i) v = nested_array({v});  // 10 levels in all
  GgufBuilder b = base();
  b.kv("deep", v);
  fails(b, {"'deep'", "nested more than 8 deep"});
  // One level less is fine.
  Value ok = int_array(ValueType::I32, {1});
  for (int i = 0; i < 8; ++i) ok = nested_array({ok});
  b = base();
  b.kv("deep", ok);
  EXPECT_EQ(File::open(dir_.write("deep-ok.gguf", b.build().bytes)).get("deep").to_string(),
            "[[[[[[[[[1] (1 x i32)] (1 x array)] (1 x array)] (1 x array)] (1 x array)] (1 x "
            "array)] (1 x array)] (1 x array)] (1 x array)");
}

TEST_F(GgufErrors, LongNamesAreCutInMessages) {
  // A name from the file is quoted in errors; a corrupt length once made a 130 MB "line".
  const std::string key(1 << 20, 'k');
  GgufBuilder b = base();
  b.kv(key, string_value("a")).kv(key, string_value("b"));
  const std::string msg = fails(b, {"duplicate metadata key", "... (1048576 bytes)"});
  EXPECT_LT(msg.size(), 400u) << msg.substr(0, 400);
  b = base();
  b.tensor(std::string(1 << 20, 't') + "\x1b[2J", {32, 2}, /*ggml type*/ 99, 256);
  const std::string msg2 = fails(b, {"tensor info 1 of 2", "... (1048580 bytes)"});
  EXPECT_LT(msg2.size(), 400u) << msg2.substr(0, 400);
  EXPECT_EQ(msg2.find('\x1b'), std::string::npos);
}

TEST_F(GgufErrors, DuplicateMetadataKey) {
  GgufBuilder b = base();
  b.kv("general.architecture", string_value("qwen2"));
  fails(b, {"duplicate metadata key 'general.architecture'", "entries 0 and 1"});
}

TEST_F(GgufErrors, BadAlignment) {
  GgufBuilder b = base();
  b.kv("general.alignment", int_value(ValueType::U32, 48));
  fails(b, {"general.alignment is 48, must be a power of two"});
  b = base();
  b.kv("general.alignment", int_value(ValueType::U32, 0));
  fails(b, {"general.alignment is 0"});
  b = base();
  b.kv("general.alignment", int_value(ValueType::I32, -32));
  fails(b, {"general.alignment is -32"});
  b = base();
  b.kv("general.alignment", u64_value(1ULL << 63));
  fails(b, {"must be a power of two"});
  b = base();
  b.kv("general.alignment", string_value("32"));
  fails(b, {"'general.alignment' is a string, expected an integer"});
}

TEST_F(GgufErrors, BadDimensions) {
  GgufBuilder b = base();
  b.tensor("scalar", {}, 0, 4);
  fails(b, {"tensor 'scalar' has 0 dimensions (must be 1 to 4)"});
  b = base();
  b.tensor("five", {1, 1, 1, 1, 1}, 0, 4);
  fails(b, {"tensor 'five' has 5 dimensions"});
  b = base();
  b.tensor("empty", {4, 0}, 0, 0);
  fails(b, {"tensor 'empty' has invalid dimension 1 = 0"});
  b = base();
  b.tensor("negative", {1ULL << 63}, 0, 4);
  fails(b, {"tensor 'negative' has invalid dimension 0 = 9223372036854775808"});
  b = base();
  b.tensor("huge", {1ULL << 32, 1ULL << 32}, 0, 4);
  fails(b, {"tensor 'huge'", "overflow"});
  b = base();
  b.tensor("bytes_overflow", {1ULL << 62}, 0, 4);  // 2^62 f32 elements: 2^64 bytes
  fails(b, {"tensor 'bytes_overflow' is too large"});
  b = base();
  b.tensor("q", {33, 2}, 2, 36);
  fails(b, {"tensor 'q'", "q4_0", "33 elements", "block size 32"});
}

TEST_F(GgufErrors, UnknownAndUnsupportedTensorTypes) {
  GgufBuilder b = base();
  b.tensor("blk.0.attn_q.weight", {32}, 99, 32);
  fails(b, {"tensor 'blk.0.attn_q.weight' has unknown ggml type 99"});
  b = base();
  b.tensor("blk.0.ffn_up.weight", {256}, 16, 66);
  fails(b, {"tensor 'blk.0.ffn_up.weight'", "iq2_xxs", "ggml type 16", "does not support"});
  b = base();
  b.tensor("d", {4}, 28, 32);
  fails(b, {"tensor 'd'", "f64", "ggml type 28"});
}

TEST_F(GgufErrors, DuplicateTensorName) {
  GgufBuilder b = base();
  b.tensor("w", {32}, 0, 128);
  fails(b, {"duplicate tensor name 'w'", "tensor infos 0 and 1"});
}

TEST_F(GgufErrors, MisalignedTensorOffset) {
  GgufBuilder b = base();
  TensorSpec t{"late", {4}, 0, std::vector<uint8_t>(16, 1), 256 + 8};
  b.tensor(t);
  fails(b, {"tensor 'late' data offset 264 is not a multiple of the alignment 32"});
}

TEST_F(GgufErrors, TensorDataPastTheEnd) {
  GgufBuilder b = base();
  TensorSpec t{"blk.29.ffn_down.weight", {64}, 0, std::vector<uint8_t>(100, 1), std::nullopt};
  b.tensor(t);  // claims 256 bytes, the file holds 100 of them
  const Layout layout = b.build();
  const std::string msg =
      fails(b, {"tensor 'blk.29.ffn_down.weight' data extends past the end of the file",
                "offset 256", "256 bytes", "file size " + std::to_string(layout.bytes.size())});
  b = base();
  b.tensor(TensorSpec{"far", {4}, 0, {}, 1ULL << 63});
  fails(b, {"tensor 'far'", "past the end"});
}

TEST_F(GgufErrors, OverlappingTensorData) {
  GgufBuilder b = base();
  b.tensor(TensorSpec{"second", {32}, 0, std::vector<uint8_t>(128, 2), 128});
  fails(b, {"overlaps", "'w' at offset 0 (256 bytes)", "'second' at offset 128"});
}

TEST_F(GgufErrors, TruncatedInsideTheDataSectionStart) {
  const Layout layout = base().build();
  std::vector<uint8_t> bytes(layout.bytes.begin(), layout.bytes.begin() + layout.data_offset - 1);
  fails(bytes, {"truncated file", "tensor data section should start"});
}

// Every possible truncation of a file with every kind of entry fails cleanly, and says where.
TEST_F(GgufErrors, EveryTruncationPoint) {
  GgufBuilder b;
  b.kv("general.alignment", int_value(ValueType::U32, 64));
  b.alignment = 64;
  b.kv("s", string_value("hello"))
      .kv("i", int_value(ValueType::I16, -3))
      .kv("u64", u64_value(7))
      .kv("f", float_value(ValueType::F64, 2.0))
      .kv("b", bool_value(true))
      .kv("strings", string_array({"a", "bc", ""}))
      .kv("floats", float_array(ValueType::F32, {1, 2}))
      .kv("nested", nested_array({int_array(ValueType::U16, {1, 2}), string_array({"z"})}));
  b.tensor("a", {32, 2}, 8, 68).tensor("b", {3}, 0, 12).tensor("c", {256}, 14, 210);
  const Layout layout = b.build();
  ASSERT_NO_THROW(File::open(dir_.write("full.gguf", layout.bytes)));
  const std::string path = dir_.path() + "/cut.gguf";
  for (size_t cut = 0; cut < layout.bytes.size(); ++cut) {
    SCOPED_TRACE("cut at " + std::to_string(cut));
    dir_.write("cut.gguf",
               std::vector<uint8_t>(layout.bytes.begin(),
                                    layout.bytes.begin() + static_cast<ptrdiff_t>(cut)));
    if (cut < 24) {
      expect_open_error(path, {path, "too small"});
    } else if (cut < layout.tensor_infos_offset) {
      const std::string msg = expect_open_error(path, {path, "truncated"});
      EXPECT_NE(msg.find("metadata"), std::string::npos) << msg;
    } else if (cut < layout.data_offset) {
      expect_open_error(path, {path, "truncated"});
    } else {
      expect_open_error(path, {path, "past the end of the file"});
    }
    if (HasFailure()) break;  // one report is enough
  }
}

}  // namespace
}  // namespace llmk::gguf
