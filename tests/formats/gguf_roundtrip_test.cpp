// GGUF files written by the test writer read back exactly: every metadata value type, arrays of
// every kind, custom alignment, tensors of several dtypes with their shapes, offsets and bytes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include "core/error.h"
#include "formats/gguf.h"
#include "gguf_test_util.h"
#include "gguf_writer.h"

namespace llmk::gguf {
namespace {

using namespace testkit;  // NOLINT: the writer helpers

GgufBuilder every_value_type(uint32_t version) {
  GgufBuilder b;
  b.version = version;
  b.kv("t.u8", int_value(ValueType::U8, 255))
      .kv("t.i8", int_value(ValueType::I8, -128))
      .kv("t.u16", int_value(ValueType::U16, 65535))
      .kv("t.i16", int_value(ValueType::I16, -32768))
      .kv("t.u32", int_value(ValueType::U32, 4294967295))
      .kv("t.i32", int_value(ValueType::I32, std::numeric_limits<int32_t>::min()))
      .kv("t.f32", float_value(ValueType::F32, static_cast<double>(1e-5f)))
      .kv("t.bool_true", bool_value(true))
      .kv("t.bool_false", bool_value(false))
      .kv("t.string", string_value("h\xc3\xa9llo\nworld"))
      .kv("t.empty_string", string_value(""))
      .kv("t.u64", u64_value(std::numeric_limits<uint64_t>::max()))
      .kv("t.i64", int_value(ValueType::I64, std::numeric_limits<int64_t>::min()))
      .kv("t.f64", float_value(ValueType::F64, M_PI))
      .kv("a.u8", int_array(ValueType::U8, {0, 1, 255}))
      .kv("a.i8", int_array(ValueType::I8, {-1, 127}))
      .kv("a.u16", int_array(ValueType::U16, {65535}))
      .kv("a.i16", int_array(ValueType::I16, {-2, 3}))
      .kv("a.u32", int_array(ValueType::U32, {4000000000}))
      .kv("a.i32", int_array(ValueType::I32, {1, -2, 3, -4, 5}))
      .kv("a.u64", int_array(ValueType::U64, {std::numeric_limits<int64_t>::max(), 0}))
      .kv("a.i64", int_array(ValueType::I64, {-5, 1LL << 40}))
      .kv("a.bool", int_array(ValueType::BOOL, {1, 0, 1}))
      .kv("a.f32", float_array(ValueType::F32, {0.5, -1.25, 3e38}))
      .kv("a.f64", float_array(ValueType::F64, {1e-300, -2.5}))
      .kv("a.strings", string_array({"<s>", "", "a\"b", "\xe2\x96\x81the"}))
      .kv("a.empty", int_array(ValueType::I32, {}))
      .kv("a.nested", nested_array({int_array(ValueType::I32, {1, 2}), string_array({"x"}),
                                    nested_array({float_array(ValueType::F32, {0.25})})}));
  return b;
}

class RoundTrip : public ::testing::TestWithParam<uint32_t> {};

TEST_P(RoundTrip, EveryValueTypeInFileOrder) {
  TempDir dir;
  const uint32_t version = GetParam();
  const std::string path = dir.write("values.gguf", every_value_type(version).build().bytes);
  const File f = File::open(path);

  EXPECT_EQ(f.path(), path);
  EXPECT_EQ(f.version(), version);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.file_size(), std::filesystem::file_size(path));
  EXPECT_TRUE(f.tensors().empty());

  const auto& md = f.metadata();
  ASSERT_EQ(md.size(), 28u);
  EXPECT_EQ(md[0].first, "t.u8");
  EXPECT_EQ(md[13].first, "t.f64");
  EXPECT_EQ(md[27].first, "a.nested");

  EXPECT_EQ(f.get("t.u8").type(), ValueType::U8);
  EXPECT_EQ(f.get_int("t.u8"), 255);
  EXPECT_EQ(f.get_int("t.i8"), -128);
  EXPECT_EQ(f.get_int("t.u16"), 65535);
  EXPECT_EQ(f.get_int("t.i16"), -32768);
  EXPECT_EQ(f.get_int("t.u32"), 4294967295);
  EXPECT_EQ(f.get_int("t.i32"), std::numeric_limits<int32_t>::min());
  EXPECT_EQ(f.get("t.f32").type(), ValueType::F32);
  EXPECT_EQ(static_cast<float>(f.get_float("t.f32")), 1e-5f);
  EXPECT_TRUE(f.get_bool("t.bool_true"));
  EXPECT_FALSE(f.get_bool("t.bool_false"));
  EXPECT_FALSE(f.get_bool("t.bool_false", true));
  EXPECT_EQ(f.get_string("t.string"), "h\xc3\xa9llo\nworld");
  EXPECT_EQ(f.get_string("t.empty_string"), "");
  EXPECT_EQ(f.get("t.u64").type(), ValueType::U64);
  EXPECT_EQ(f.get("t.u64").to_string(), "18446744073709551615");
  EXPECT_EQ(f.get_int("t.i64"), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(f.get_float("t.f64"), M_PI);

  const auto& u8 = f.get("a.u8").as_array();
  EXPECT_EQ(u8.elem, ValueType::U8);
  EXPECT_EQ(u8.ints, (std::vector<int64_t>{0, 1, 255}));
  EXPECT_EQ(f.get("a.i8").as_array().ints, (std::vector<int64_t>{-1, 127}));
  EXPECT_EQ(f.get("a.u16").as_array().ints, (std::vector<int64_t>{65535}));
  EXPECT_EQ(f.get("a.i16").as_array().ints, (std::vector<int64_t>{-2, 3}));
  EXPECT_EQ(f.get("a.u32").as_array().ints, (std::vector<int64_t>{4000000000}));
  EXPECT_EQ(f.get("a.i32").as_array().ints, (std::vector<int64_t>{1, -2, 3, -4, 5}));
  EXPECT_EQ(f.get("a.u64").as_array().ints,
            (std::vector<int64_t>{std::numeric_limits<int64_t>::max(), 0}));
  EXPECT_EQ(f.get("a.i64").as_array().ints, (std::vector<int64_t>{-5, 1LL << 40}));
  EXPECT_EQ(f.get("a.bool").as_array().elem, ValueType::BOOL);
  EXPECT_EQ(f.get("a.bool").as_array().ints, (std::vector<int64_t>{1, 0, 1}));
  const auto& f32 = f.get("a.f32").as_array();
  EXPECT_EQ(f32.elem, ValueType::F32);
  ASSERT_EQ(f32.size(), 3u);
  EXPECT_EQ(f32.floats[1], -1.25);
  EXPECT_EQ(static_cast<float>(f32.floats[2]), 3e38f);
  EXPECT_EQ(f.get("a.f64").as_array().floats, (std::vector<double>{1e-300, -2.5}));
  EXPECT_EQ(f.get("a.strings").as_array().strings,
            (std::vector<std::string>{"<s>", "", "a\"b", "\xe2\x96\x81the"}));
  EXPECT_EQ(f.get("a.empty").as_array().size(), 0u);
  EXPECT_EQ(f.get("a.empty").as_array().elem, ValueType::I32);

  const auto& nested = f.get("a.nested").as_array();
  ASSERT_EQ(nested.elem, ValueType::ARRAY);
  ASSERT_EQ(nested.size(), 3u);
  EXPECT_EQ(nested.nested[0].as_array().ints, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(nested.nested[1].as_array().strings, (std::vector<std::string>{"x"}));
  EXPECT_EQ(nested.nested[2].as_array().nested[0].as_array().floats, (std::vector<double>{0.25}));

  // Writing the parsed metadata again gives the same bytes.
  GgufBuilder again;
  again.version = version;
  for (const auto& [k, v] : md) again.kv(k, v);
  EXPECT_EQ(again.build().bytes, every_value_type(version).build().bytes);
}

INSTANTIATE_TEST_SUITE_P(Versions, RoundTrip, ::testing::Values(2u, 3u));

TEST(GgufValue, ToStringShowsScalarsAndTheFirstArrayItems) {
  EXPECT_EQ(int_value(ValueType::I32, -7).to_string(), "-7");
  EXPECT_EQ(u64_value(std::numeric_limits<uint64_t>::max()).to_string(), "18446744073709551615");
  EXPECT_EQ(float_value(ValueType::F32, static_cast<double>(1e-5f)).to_string(), "1e-05");
  EXPECT_EQ(float_value(ValueType::F64, 0.1).to_string(), "0.1");
  EXPECT_EQ(bool_value(true).to_string(), "true");
  EXPECT_EQ(string_value("llama").to_string(), "llama");
  EXPECT_EQ(int_array(ValueType::I32, {1, 2, 3, 4, 5}).to_string(3), "[1, 2, 3, ...] (5 x i32)");
  EXPECT_EQ(int_array(ValueType::U8, {1, 2}).to_string(), "[1, 2] (2 x u8)");
  EXPECT_EQ(int_array(ValueType::BOOL, {1, 0}).to_string(), "[true, false] (2 x bool)");
  EXPECT_EQ(string_array({"a", "b\n", "c"}).to_string(2), "[\"a\", \"b\\n\", ...] (3 x string)");
  EXPECT_EQ(float_array(ValueType::F32, {0.5}).to_string(), "[0.5] (1 x f32)");
  EXPECT_EQ(int_array(ValueType::I32, {}).to_string(), "[] (0 x i32)");
  EXPECT_EQ(int_array(ValueType::I32, {1}).to_string(0), "[...] (1 x i32)");
  EXPECT_EQ(nested_array({int_array(ValueType::I8, {1, 2}), string_array({})}).to_string(),
            "[[1, 2] (2 x i8), [] (0 x string)] (2 x array)");
}

TEST(GgufValue, TypedAccessChecksTheType) {
  EXPECT_EQ(int_value(ValueType::U16, 7).as_float(), 7.0);
  EXPECT_TRUE(int_value(ValueType::U16, 7).is_integer());
  EXPECT_FALSE(int_value(ValueType::U16, 7).is_float());
  EXPECT_TRUE(float_value(ValueType::F64, 1).is_float());
  EXPECT_EQ(error_of([] { string_value("x").as_int(); }),
            "metadata value is a string, expected an integer");
  EXPECT_EQ(error_of([] { int_value(ValueType::U32, 1).as_string(); }),
            "metadata value is an integer (u32), expected a string");
  EXPECT_EQ(error_of([] { string_array({}).as_bool(); }),
            "metadata value is an array of string, expected a bool");
  EXPECT_THROW(int_value(ValueType::I32, 1).as_array(), Error);
  EXPECT_THROW(bool_value(true).as_float(), Error);
  const std::string big = error_of([] { u64_value(1ULL << 63).as_int(); });
  EXPECT_NE(big.find("does not fit"), std::string::npos) << big;
  EXPECT_EQ(u64_value(1ULL << 62).as_int(), 1LL << 62);
  // A value whose contents do not match its type gives llmk::Error, not bad_variant_access.
  const Value bad(ValueType::F32, std::string("x"));
  EXPECT_NE(error_of([&] { bad.as_float(); }).find("do not match its type f32"), std::string::npos);
  EXPECT_THROW(bad.to_string(), Error);
  EXPECT_EQ(Value(ValueType::U64, int64_t{5}).to_string(), "5");
}

TEST(GgufFile, GettersNameThePathKeyAndBothTypes) {
  TempDir dir;
  GgufBuilder b;
  b.kv("llama.block_count", string_value("thirty"))
      .kv("llama.embedding_length", int_value(ValueType::U32, 576))
      .kv("llama.rope.freq_base", float_value(ValueType::F32, 10000.0))
      .kv("flag", bool_value(true))
      .kv("big", u64_value(1ULL << 63));
  const std::string path = dir.write("getters.gguf", b.build().bytes);
  const File f = File::open(path);

  EXPECT_EQ(error_of([&] { f.get_int("llama.block_count"); }),
            path + ": metadata key 'llama.block_count' is a string, expected an integer");
  EXPECT_EQ(error_of([&] { f.get_int("llama.block_count", 3); }),
            path + ": metadata key 'llama.block_count' is a string, expected an integer");
  EXPECT_EQ(
      error_of([&] { f.get_string("llama.embedding_length"); }),
      path + ": metadata key 'llama.embedding_length' is an integer (u32), expected a string");
  EXPECT_EQ(error_of([&] { f.get_bool("llama.rope.freq_base"); }),
            path + ": metadata key 'llama.rope.freq_base' is a float (f32), expected a bool");
  EXPECT_EQ(error_of([&] { f.get_float("flag"); }),
            path + ": metadata key 'flag' is a bool, expected a float");
  EXPECT_EQ(error_of([&] { f.get("nope"); }), path + ": missing metadata key 'nope'");
  EXPECT_EQ(error_of([&] { f.get_int("nope"); }), path + ": missing metadata key 'nope'");
  EXPECT_EQ(error_of([&] { f.tensor_info("w"); }), path + ": missing tensor 'w'");
  EXPECT_EQ(error_of([&] { f.tensor("w"); }), path + ": missing tensor 'w'");
  const std::string big = error_of([&] { f.get_int("big"); });
  EXPECT_NE(big.find(path + ": metadata key 'big'"), std::string::npos) << big;

  EXPECT_EQ(f.get_int("llama.embedding_length"), 576);
  EXPECT_EQ(f.get_int("llama.embedding_length", 1), 576);
  EXPECT_EQ(f.get_int("absent", 42), 42);
  EXPECT_EQ(f.get_float("llama.embedding_length"), 576.0);  // integers convert
  EXPECT_EQ(f.get_float("llama.rope.freq_base", 1.0), 10000.0);
  EXPECT_EQ(f.get_float("absent", 0.5), 0.5);
  EXPECT_EQ(f.get_string("llama.block_count", "x"), "thirty");
  EXPECT_EQ(f.get_string("absent", "dflt"), "dflt");
  EXPECT_TRUE(f.get_bool("flag", false));
  EXPECT_TRUE(f.get_bool("absent", true));
  EXPECT_EQ(f.find("absent"), nullptr);
  ASSERT_NE(f.find("flag"), nullptr);
  EXPECT_EQ(f.find("flag")->type(), ValueType::BOOL);
  EXPECT_EQ(f.find_tensor("w"), nullptr);
}

struct Expected {
  const char* name;
  std::vector<uint64_t> ne;
  uint32_t ggml_type;
  DType dtype;
  Shape shape;
  uint64_t nbytes;
};

const std::vector<Expected>& several_dtypes() {
  static const std::vector<Expected> e = {
      {"f32.matrix", {4, 3}, 0, DType::F32, {3, 4}, 48},
      {"f16.vec", {8}, 1, DType::F16, {8}, 16},
      {"bf16.3d", {4, 3, 2}, 30, DType::BF16, {2, 3, 4}, 48},
      {"q4_0.w", {64, 3}, 2, DType::Q4_0, {3, 64}, 6 * 18},
      {"q4_1.w", {32, 1}, 3, DType::Q4_1, {1, 32}, 20},
      {"q5_0.w", {32, 2}, 6, DType::Q5_0, {2, 32}, 44},
      {"q5_1.w", {64}, 7, DType::Q5_1, {64}, 48},
      {"q8_0.4d", {32, 2, 1, 3}, 8, DType::Q8_0, {3, 1, 2, 32}, 6 * 34},
      {"q2_K.w", {256}, 10, DType::Q2_K, {256}, 84},
      {"q3_K.w", {256}, 11, DType::Q3_K, {256}, 110},
      {"q4_K.w", {512, 2}, 12, DType::Q4_K, {2, 512}, 4 * 144},
      {"q5_K.w", {256}, 13, DType::Q5_K, {256}, 176},
      {"q6_K.w", {256, 3}, 14, DType::Q6_K, {3, 256}, 3 * 210},
      {"q8_K.w", {256}, 15, DType::Q8_K, {256}, 292},
      {"i8.v", {5}, 24, DType::I8, {5}, 5},
      {"i32.v", {3}, 26, DType::I32, {3}, 12},
  };
  return e;
}

void check_tensors(uint64_t alignment) {
  TempDir dir;
  GgufBuilder b;
  b.alignment = alignment;
  if (alignment != 32) b.kv("general.alignment", int_value(ValueType::U32, int64_t(alignment)));
  b.kv("general.architecture", string_value("llama"));
  uint8_t seed = 3;
  for (const Expected& e : several_dtypes()) b.tensor(e.name, e.ne, e.ggml_type, e.nbytes, seed++);
  const Layout layout = b.build();
  const std::string path = dir.write("tensors.gguf", layout.bytes);
  const File f = File::open(path);

  EXPECT_EQ(f.alignment(), alignment);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  const auto& expected = several_dtypes();
  ASSERT_EQ(f.tensors().size(), expected.size());
  uint64_t next = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    const Expected& e = expected[i];
    const TensorInfo& t = f.tensors()[i];
    SCOPED_TRACE(e.name);
    EXPECT_EQ(t.name, e.name);
    EXPECT_EQ(t.shape, e.shape);
    EXPECT_EQ(t.dtype, e.dtype);
    EXPECT_EQ(t.ggml_type, e.ggml_type);
    EXPECT_EQ(t.nbytes, e.nbytes);
    // Tensors follow each other, each at the next multiple of the alignment.
    const uint64_t want_offset = (next + alignment - 1) / alignment * alignment;
    EXPECT_EQ(t.offset, want_offset);
    next = want_offset + e.nbytes;
    EXPECT_EQ(f.find_tensor(e.name), &t);
    EXPECT_EQ(&f.tensor_info(e.name), &t);

    const Tensor view = f.tensor(e.name);
    EXPECT_EQ(view.shape(), e.shape);
    EXPECT_EQ(view.dtype(), e.dtype);
    EXPECT_EQ(view.device(), Device::CPU);
    EXPECT_EQ(static_cast<uint64_t>(view.nbytes()), e.nbytes);
    const uint8_t* want = layout.bytes.data() + layout.data_offset + layout.tensor_offsets[i];
    EXPECT_EQ(std::memcmp(view.data(), want, e.nbytes), 0);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(view.data()) % alignment, 0u);
  }
  EXPECT_EQ(f.tensors()[0].offset, 0u);
}

TEST(GgufFile, TensorsOfSeveralDtypesDefaultAlignment) { check_tensors(32); }
TEST(GgufFile, TensorsOfSeveralDtypesCustomAlignment) { check_tensors(64); }
TEST(GgufFile, TensorsOfSeveralDtypesAlignmentOne) { check_tensors(1); }

TEST(GgufFile, AlignmentAsAnyIntegerType) {
  TempDir dir;
  GgufBuilder b;
  b.alignment = 128;
  b.kv("general.alignment", u64_value(128));
  b.tensor("w", {4}, 0, 16);
  b.tensor("v", {4}, 0, 16);
  const File f = File::open(dir.write("a.gguf", b.build().bytes));
  EXPECT_EQ(f.alignment(), 128u);
  EXPECT_EQ(f.tensor_info("v").offset, 128u);
}

TEST(GgufFile, TensorViewOutlivesTheFileObjectAndTheDirectoryEntry) {
  TempDir dir;
  GgufBuilder b;
  b.tensor("w", {2, 2}, 0, 16, 9);
  const Layout layout = b.build();
  const std::string path = dir.write("w.gguf", layout.bytes);
  Tensor w;
  {
    const File f = File::open(path);
    w = f.tensor("w");
  }
  std::filesystem::remove(path);
  Tensor row = w.select(0, 1);  // a view of the view still holds the mapping
  w = Tensor();
  ASSERT_EQ(row.shape(), (Shape{2}));
  EXPECT_EQ(std::memcmp(row.data(), layout.bytes.data() + layout.data_offset + 8, 8), 0);
}

TEST(GgufFile, FileWithoutTensorsMayEndRightAfterTheMetadata) {
  TempDir dir;
  GgufBuilder b;
  b.pad_data_section = false;
  b.kv("k", int_value(ValueType::U8, 1));  // 24 + 9 + 4 + 1 = 38 bytes, not a multiple of 32
  const Layout layout = b.build();
  ASSERT_EQ(layout.bytes.size(), 38u);
  const File f = File::open(dir.write("nt.gguf", layout.bytes));
  EXPECT_EQ(f.get_int("k"), 1);
  EXPECT_TRUE(f.tensors().empty());
}

TEST(GgufTypes, GgmlIdsMapToDtypesOrNamedErrors) {
  EXPECT_EQ(dtype_from_ggml(0), DType::F32);
  EXPECT_EQ(dtype_from_ggml(1), DType::F16);
  EXPECT_EQ(dtype_from_ggml(2), DType::Q4_0);
  EXPECT_EQ(dtype_from_ggml(3), DType::Q4_1);
  EXPECT_EQ(dtype_from_ggml(6), DType::Q5_0);
  EXPECT_EQ(dtype_from_ggml(7), DType::Q5_1);
  EXPECT_EQ(dtype_from_ggml(8), DType::Q8_0);
  EXPECT_EQ(dtype_from_ggml(10), DType::Q2_K);
  EXPECT_EQ(dtype_from_ggml(11), DType::Q3_K);
  EXPECT_EQ(dtype_from_ggml(12), DType::Q4_K);
  EXPECT_EQ(dtype_from_ggml(13), DType::Q5_K);
  EXPECT_EQ(dtype_from_ggml(14), DType::Q6_K);
  EXPECT_EQ(dtype_from_ggml(15), DType::Q8_K);
  EXPECT_EQ(dtype_from_ggml(24), DType::I8);
  EXPECT_EQ(dtype_from_ggml(26), DType::I32);
  EXPECT_EQ(dtype_from_ggml(30), DType::BF16);
  EXPECT_EQ(ggml_type_name(12), "q4_K");
  EXPECT_EQ(ggml_type_name(16), "iq2_xxs");
  EXPECT_EQ(ggml_type_name(29), "iq1_m");
  EXPECT_EQ(ggml_type_name(42), "unknown(42)");
  EXPECT_EQ(ggml_type_name(4), "unknown(4)");  // q4_2, long removed
  for (uint32_t unsupported : {9u, 16u, 17u, 18u, 19u, 20u, 21u, 22u, 23u, 25u, 27u, 28u, 29u}) {
    const std::string msg = error_of([&] { dtype_from_ggml(unsupported); });
    EXPECT_NE(msg.find(std::string(ggml_type_name(unsupported))), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::to_string(unsupported)), std::string::npos) << msg;
  }
  EXPECT_NE(error_of([] { dtype_from_ggml(1000); }).find("unknown ggml tensor type 1000"),
            std::string::npos);
  EXPECT_EQ(value_type_name(ValueType::F64), "f64");
  EXPECT_EQ(value_type_name(ValueType::STRING), "string");
}

}  // namespace
}  // namespace llmk::gguf
