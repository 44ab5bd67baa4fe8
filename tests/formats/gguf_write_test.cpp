// The GGUF writer (formats/gguf_write.h): what it writes, gguf::File reads back as written, and
// its header is byte for byte the one the test builder (gguf_writer.h) lays out for the same
// parsed file; a run that does not reach finish() leaves no file.
#include "formats/gguf_write.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>

#include "core/error.h"
#include "formats/gguf_model_util.h"
#include "formats/gguf_test_util.h"
#include "formats/gguf_writer.h"

namespace llmk::gguf {
namespace {

namespace fs = std::filesystem;
namespace tk = testkit;

std::vector<uint8_t> file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

// Bytes 0, 1, 2, ... (mod 251) for a tensor of `n` bytes, offset by `seed`.
std::vector<uint8_t> pattern(uint64_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (uint64_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>((seed + i) % 251);
  return v;
}

void add_every_value_type(Writer& w) {
  w.set("u8", tk::int_value(ValueType::U8, 200));
  w.set("i8", tk::int_value(ValueType::I8, -100));
  w.set("u16", tk::int_value(ValueType::U16, 60000));
  w.set("i16", tk::int_value(ValueType::I16, -30000));
  w.set("u32", tk::int_value(ValueType::U32, 4000000000));
  w.set("i32", tk::int_value(ValueType::I32, -2000000000));
  w.set("u64", tk::u64_value(std::numeric_limits<uint64_t>::max()));
  w.set("i64", tk::int_value(ValueType::I64, std::numeric_limits<int64_t>::min()));
  w.set("f32", tk::float_value(ValueType::F32, 0.15625));
  w.set("f64", tk::float_value(ValueType::F64, 1e-300));
  w.set("bool", tk::bool_value(true));
  w.set("string", tk::string_value("h\xc3\xa9llo"));
  w.set("strings", tk::string_array({"a", "", "\xe2\x96\x81the"}));
  w.set("ints", tk::int_array(ValueType::I32, {1, -2, 3}));
  w.set("bools", tk::int_array(ValueType::BOOL, {1, 0}));
  w.set("floats", tk::float_array(ValueType::F32, {0.5, -2.25}));
  w.set("nested",
        tk::nested_array({tk::int_array(ValueType::U8, {1, 2}), tk::string_array({"x"})}));
}

TEST(GgufWrite, FileReadsBackAsWritten) {
  tk::TempDir dir;
  const std::string path = dir.path() + "/m.gguf";
  Writer w;
  add_every_value_type(w);
  const std::vector<std::tuple<std::string, Shape, DType>> tensors = {
      {"a.weight", {3, 64}, DType::Q8_0},
      {"b.weight", {7}, DType::F32},
      {"c.weight", {2, 256}, DType::Q4_K},
      {"d.weight", {5, 3}, DType::BF16},
      {"e.weight", {2, 3, 32}, DType::F16}};
  for (const auto& [name, shape, dtype] : tensors) w.add_tensor(name, shape, dtype);
  w.open(path);
  std::vector<std::vector<uint8_t>> data;
  for (size_t i = 0; i < tensors.size(); ++i) {
    data.push_back(pattern(w.tensor_bytes(i), static_cast<uint8_t>(i)));
    // In two pieces, as a chunked writer gives them.
    const uint64_t half = data[i].size() / 2;
    w.write(data[i].data(), half);
    w.write(data[i].data() + half, data[i].size() - half);
  }
  w.finish();
  ASSERT_TRUE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".partial"));
  EXPECT_EQ(fs::file_size(path), w.file_bytes());

  const File f = File::open(path);
  EXPECT_EQ(f.version(), 3u);
  ASSERT_EQ(f.metadata().size(), 17u);
  EXPECT_EQ(f.get_int("u32"), 4000000000);
  EXPECT_EQ(f.get("u64").to_string(), "18446744073709551615");
  EXPECT_EQ(f.get_int("i64"), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(f.get_float("f32"), 0.15625);
  EXPECT_EQ(f.get_float("f64"), 1e-300);
  EXPECT_EQ(f.get_string("string"), "h\xc3\xa9llo");
  EXPECT_EQ(f.get("strings").as_array().strings,
            (std::vector<std::string>{"a", "", "\xe2\x96\x81the"}));
  EXPECT_EQ(f.get("ints").as_array().ints, (std::vector<int64_t>{1, -2, 3}));
  const Value::Array& nested = f.get("nested").as_array();
  ASSERT_EQ(nested.nested.size(), 2u);
  EXPECT_EQ(nested.nested[0].as_array().ints, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(nested.nested[1].as_array().strings, (std::vector<std::string>{"x"}));
  ASSERT_EQ(f.tensors().size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, shape, dtype] = tensors[i];
    const TensorInfo& t = f.tensors()[i];
    EXPECT_EQ(t.name, name);
    EXPECT_EQ(t.shape, shape);
    EXPECT_EQ(t.dtype, dtype);
    EXPECT_EQ(t.offset % 32, 0u);
    const Tensor view = f.tensor(name);
    const auto* p = static_cast<const uint8_t*>(view.data());
    EXPECT_TRUE(std::equal(data[i].begin(), data[i].end(), p)) << name;
  }
  // The header: exactly what the test builder writes for the parsed file.
  const std::vector<uint8_t> bytes = file_bytes(path);
  const tk::Layout rebuilt = tk::rewrite_header(f);
  ASSERT_LE(rebuilt.bytes.size(), bytes.size());
  EXPECT_TRUE(std::equal(rebuilt.bytes.begin(), rebuilt.bytes.end(), bytes.begin()));
  EXPECT_EQ(w.header(), rebuilt.bytes);
}

TEST(GgufWrite, AlignmentKeySetsTheLayoutAndSetKeepsTheKeysPlace) {
  tk::TempDir dir;
  const std::string path = dir.path() + "/m.gguf";
  Writer w;
  w.set("first", tk::string_value("old"));
  w.set("general.alignment", tk::int_value(ValueType::U32, 64));
  w.set("first", tk::string_value("new"));
  w.add_tensor("a", {5}, DType::F32);
  w.add_tensor("b", {3}, DType::F32);
  EXPECT_EQ(w.alignment(), 64u);
  w.open(path);
  const std::vector<uint8_t> d = pattern(20, 1);
  w.write(d.data(), 20);
  w.write(d.data(), 12);
  w.finish();
  const File f = File::open(path);
  EXPECT_EQ(f.alignment(), 64u);
  ASSERT_EQ(f.metadata().size(), 2u);
  EXPECT_EQ(f.metadata()[0].first, "first");
  EXPECT_EQ(f.metadata()[0].second.as_string(), "new");
  EXPECT_EQ(f.tensor_info("b").offset, 64u);
}

TEST(GgufWrite, UnfinishedRunLeavesNoFile) {
  tk::TempDir dir;
  const std::string path = dir.path() + "/m.gguf";
  {
    Writer w;
    w.add_tensor("a", {4, 32}, DType::Q8_0);
    w.open(path);
    EXPECT_TRUE(fs::exists(path + ".partial"));
    const std::vector<uint8_t> d = pattern(34, 0);
    w.write(d.data(), d.size());
    EXPECT_NE(tk::error_of([&] { w.finish(); }).find("0 of 1 tensors written"), std::string::npos)
        << "finish with a tensor short";
  }
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".partial"));
  {
    Writer w;
    w.add_tensor("a", {8}, DType::F32);
    w.open(path);
    const std::vector<uint8_t> d(64, 0);
    EXPECT_NE(tk::error_of([&] { w.write(d.data(), 33); }).find("32"), std::string::npos);
  }  // destroyed without finish()
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".partial"));
}

TEST(GgufWrite, RejectsWhatGgufCannotHold) {
  tk::TempDir dir;
  Writer w;
  w.add_tensor("a", {2, 32}, DType::Q4_0);
  EXPECT_NE(tk::error_of([&] { w.add_tensor("a", {4}, DType::F32); }).find("duplicate"),
            std::string::npos);
  EXPECT_NE(tk::error_of([&] {
              w.add_tensor("b", {2, 48}, DType::Q4_0);
            }).find("whole"),
            std::string::npos);
  EXPECT_NE(tk::error_of([&] { w.add_tensor("c", {4}, DType::F64); }).find("f64"),
            std::string::npos);
  EXPECT_NE(tk::error_of([&] {
              w.set("general.alignment", tk::int_value(ValueType::U32, 48));
            }).find("power of two"),
            std::string::npos);
  EXPECT_NE(tk::error_of([&] { w.open(dir.path() + "/no/such/dir/m.gguf"); }).find("cannot write"),
            std::string::npos);
}

}  // namespace
}  // namespace llmk::gguf
