// safetensors::Writer: tensors written in pieces, out of order, read back by safetensors::File
// (which rejects gaps, overlaps and data past the end), and its errors.
#include "formats/safetensors_write.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "formats/safetensors.h"
#include "gguf_test_util.h"

namespace llmk::safetensors {
namespace {

using gguf::testkit::error_of;
using gguf::testkit::TempDir;

template <class T>
std::string_view bytes(const std::vector<T>& v, size_t from = 0, size_t n = SIZE_MAX) {
  n = std::min(n, v.size() - from);
  return {reinterpret_cast<const char*>(v.data() + from), n * sizeof(T)};
}

TEST(SafetensorsWriter, PiecesOutOfOrderReadBack) {
  TempDir dir;
  const std::string path = dir.path() + "/w.safetensors";
  // Sizes that are not multiples of 8 bytes: the tensors sit back to back, no padding.
  const std::vector<int32_t> ids = {7, -1, 2147483647, 0, 5};  // 20 bytes
  const std::vector<float> vals = {1.5f, -2.0f, 3.25f, 0.0f, 9.0f, -0.5f};
  const std::vector<float> one = {42.0f};
  {
    Writer w(path, {{"ids", "I32", 4, {5}}, {"vals", "F32", 4, {2, 3}}, {"one", "F32", 4, {1, 1}}},
             {{"format", "test"}, {"k", "3"}});
    w.write(1, 12, bytes(vals, 3));  // the second row first
    w.write(2, 0, bytes(one));
    w.write(0, 8, bytes(ids, 2));
    w.write(1, 0, bytes(vals, 0, 3));
    w.write(0, 0, bytes(ids, 0, 2));
    w.close();
  }
  const File f = File::open(path);
  EXPECT_EQ(f.metadata().at("format"), "test");
  EXPECT_EQ(f.metadata().at("k"), "3");
  ASSERT_EQ(f.names(), (std::vector<std::string>{"ids", "vals", "one"}));
  EXPECT_EQ(f.data_offset() % 8, 0u);
  const Tensor ti = f.tensor("ids"), tv = f.tensor("vals"), t1 = f.tensor("one");
  EXPECT_EQ(ti.shape(), (Shape{5}));
  EXPECT_EQ(tv.shape(), (Shape{2, 3}));
  EXPECT_EQ(std::memcmp(ti.data(), ids.data(), 20), 0);
  EXPECT_EQ(std::memcmp(tv.data(), vals.data(), 24), 0);
  EXPECT_EQ(t1.data<float>()[0], 42.0f);
  EXPECT_EQ(f.file_size(), f.data_offset() + 20 + 24 + 4);
}

TEST(SafetensorsWriter, Errors) {
  TempDir dir;
  const std::string path = dir.path() + "/w.safetensors";
  Writer w(path, {{"a", "F32", 4, {2}}}, {});
  const std::vector<float> three = {1, 2, 3};
  EXPECT_NE(error_of([&] { w.write(0, 0, bytes(three)); }).find("outside tensor 0"),
            std::string::npos);
  EXPECT_NE(error_of([&] { w.write(0, 8, bytes(three, 0, 1)); }).find("outside"),
            std::string::npos);
  EXPECT_NE(error_of([&] { w.write(1, 0, bytes(three, 0, 1)); }).find("outside"),
            std::string::npos);
  w.close();
  EXPECT_NE(error_of([&] { w.write(0, 0, bytes(three, 0, 1)); }).find("write after close"),
            std::string::npos);
  const std::string folder = dir.path();
  EXPECT_NE(error_of([&] {
              Writer(folder, {{"a", "F32", 4, {1}}}, {});
            }).find(folder + ": cannot write:"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              Writer(path, {{"a", "F32", 4, {-1}}}, {});
            }).find("negative"),
            std::string::npos);
}

}  // namespace
}  // namespace llmk::safetensors
