// safetensors files and Hugging Face folders: synthetic round trips, every kind of bad input
// (each a llmk::Error naming the file and the problem), truncations and byte flips, and files
// written by the `safetensors` / `transformers` Python packages
// (tests/fixtures/safetensors/make_safetensors.py).
#include "formats/safetensors.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>

#include "core/error.h"
#include "core/half.h"
#include "gguf_test_util.h"
#include "safetensors_writer.h"

namespace llmk::safetensors {
namespace {

using gguf::testkit::error_of;
using gguf::testkit::TempDir;
using namespace testkit;  // NOLINT: the writer helpers

// Element i of a CPU tensor of a plain dtype, as a double (exact for every dtype here).
double element(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::F32:
      return t.data<float>()[i];
    case DType::F16:
      return fp16_to_float(t.data<uint16_t>()[i]);
    case DType::BF16:
      return bf16_to_float(t.data<uint16_t>()[i]);
    case DType::I8:
      return t.data<int8_t>()[i];
    case DType::I32:
      return t.data<int32_t>()[i];
    default:
      ADD_FAILURE() << "unexpected dtype " << dtype_name(t.dtype());
      return 0;
  }
}

bool contains(const std::string& msg, std::string_view phrase) {
  return msg.find(phrase) != std::string::npos;
}

// Expects `fn` to throw llmk::Error whose message starts with `path` and carries every phrase.
template <typename Fn>
std::string expect_error(Fn&& fn, const std::string& path,
                         std::initializer_list<std::string_view> phrases) {
  const std::string msg = error_of(fn);
  EXPECT_EQ(msg.rfind(path + ": ", 0), 0u) << "message does not start with the path: " << msg;
  for (std::string_view p : phrases) {
    EXPECT_TRUE(contains(msg, p)) << "message lacks '" << p << "': " << msg;
  }
  return msg;
}

// One file rewritten in place through a kept-open descriptor: much cheaper than creating a
// file per mutant when a test opens hundreds of them.
class ScratchFile {
 public:
  explicit ScratchFile(std::string path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) throw std::runtime_error("cannot create " + path_);
  }
  ~ScratchFile() { close(fd_); }
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;

  const std::string& path() const { return path_; }
  void set(const uint8_t* data, size_t n) {
    if (ftruncate(fd_, static_cast<off_t>(n)) != 0 ||
        pwrite(fd_, data, n, 0) != static_cast<ssize_t>(n)) {
      throw std::runtime_error("cannot write " + path_);
    }
  }

 private:
  std::string path_;
  int fd_ = -1;
};

class Safetensors : public ::testing::Test {
 protected:
  std::string write(const std::vector<uint8_t>& bytes) {
    return dir_.write("t" + std::to_string(n_++) + ".safetensors", bytes);
  }
  // Writes the file and expects File::open to fail naming the file and every phrase.
  std::string fails(const std::vector<uint8_t>& bytes,
                    std::initializer_list<std::string_view> phrases) {
    const std::string path = write(bytes);
    return expect_error([&] { File::open(path); }, path, phrases);
  }
  // A file whose header is `header` followed by `data_bytes` zero bytes of data.
  std::string fails_header(std::string_view header, std::initializer_list<std::string_view> phrases,
                           size_t data_bytes = 16) {
    return fails(assemble(header, std::vector<uint8_t>(data_bytes)), phrases);
  }

  TempDir dir_;
  int n_ = 0;
};

// ---- round trips ----------------------------------------------------------------------------

TEST_F(Safetensors, RoundTripOfEveryDtypeAndShape) {
  const std::vector<float> f32 = {1.5f, -2.25f, 3.0f, 0.0f, -0.0f, 1e-3f};
  const std::vector<uint16_t> f16 = {float_to_fp16(0.5f), float_to_fp16(-65504.0f),
                                     float_to_fp16(1.0f / 1024), float_to_fp16(7.0f),
                                     float_to_fp16(-3.5f)};
  std::vector<uint16_t> bf16;
  for (int i = 0; i < 8; ++i) bf16.push_back(float_to_bf16(static_cast<float>(i) * 0.75f - 2.0f));
  const std::vector<int8_t> i8 = {-128, -1, 0, 1, 127, 42, -7};
  const std::vector<int32_t> i32 = {-2147483647 - 1, 0, 2147483647};
  const std::vector<float> scalar = {6.5f};

  SafetensorsBuilder b;
  b.metadata("format", "pt")
      .metadata("note", "round trip")
      .values("w.f32", "F32", {2, 3}, f32)
      .values("scalar", "F32", {}, scalar)
      .values("h.f16", "F16", {5}, f16)
      .tensor("empty.rows", "F32", {0, 3}, {})
      .values("b.bf16", "BF16", {2, 2, 2}, bf16)
      .values("c.i8", "I8", {7}, i8)
      .tensor("empty.cols", "BF16", {4, 0}, {})
      .values("d.i32", "I32", {1, 3}, i32);
  const std::string path = write(b.build());

  Tensor keep;
  {
    const File f = File::open(path);
    EXPECT_EQ(f.path(), path);
    EXPECT_EQ(f.data_offset() % 8, 0u);
    EXPECT_EQ(f.data_offset(), 8 + b.header().size());
    EXPECT_EQ(f.names(), (std::vector<std::string>{"w.f32", "scalar", "h.f16", "empty.rows",
                                                   "b.bf16", "c.i8", "empty.cols", "d.i32"}));
    EXPECT_EQ(f.metadata().size(), 2u);
    EXPECT_EQ(f.metadata().at("format"), "pt");
    EXPECT_EQ(f.metadata().at("note"), "round trip");

    const TensorInfo* w = f.find("w.f32");
    ASSERT_NE(w, nullptr);
    EXPECT_EQ(w->name, "w.f32");
    EXPECT_EQ(w->shape, (Shape{2, 3}));
    EXPECT_EQ(w->dtype, DType::F32);
    EXPECT_EQ(w->offset, 0u);
    EXPECT_EQ(w->nbytes, 24u);
    const TensorInfo& s = f.tensor_info("scalar");
    EXPECT_EQ(s.shape, Shape{});
    EXPECT_EQ(s.offset, 24u);
    EXPECT_EQ(s.nbytes, 4u);
    EXPECT_EQ(f.tensor_info("h.f16").offset, 28u);
    EXPECT_EQ(f.tensor_info("empty.rows").nbytes, 0u);
    EXPECT_EQ(f.tensor_info("empty.rows").offset, 38u);
    EXPECT_EQ(f.tensor_info("b.bf16").dtype, DType::BF16);
    EXPECT_EQ(f.tensor_info("c.i8").dtype, DType::I8);
    EXPECT_EQ(f.tensor_info("d.i32").dtype, DType::I32);
    EXPECT_EQ(f.tensor_info("d.i32").offset, 38u + 16 + 7);
    EXPECT_EQ(f.find("missing"), nullptr);

    const Tensor tw = f.tensor("w.f32");
    EXPECT_EQ(tw.device(), Device::CPU);
    EXPECT_EQ(tw.str(), "f32[2, 3]");
    for (int i = 0; i < 6; ++i) EXPECT_EQ(tw.data<float>()[i], f32[static_cast<size_t>(i)]);
    EXPECT_EQ(f.tensor("scalar").ndim(), 0);
    EXPECT_EQ(f.tensor("scalar").data<float>()[0], 6.5f);
    const Tensor th = f.tensor("h.f16");
    EXPECT_EQ(element(th, 1), -65504.0);
    EXPECT_EQ(element(th, 2), 1.0 / 1024);
    const Tensor tb = f.tensor("b.bf16");
    EXPECT_EQ(tb.shape(), (Shape{2, 2, 2}));
    for (int i = 0; i < 8; ++i) EXPECT_EQ(element(tb, i), i * 0.75 - 2.0);
    const Tensor tc = f.tensor("c.i8");
    for (int i = 0; i < 7; ++i) EXPECT_EQ(element(tc, i), i8[static_cast<size_t>(i)]);
    const Tensor te = f.tensor("empty.rows");
    EXPECT_EQ(te.numel(), 0);
    EXPECT_EQ(te.shape(), (Shape{0, 3}));
    EXPECT_EQ(f.tensor("empty.cols").shape(), (Shape{4, 0}));
    keep = f.tensor("d.i32");
  }
  // The File is gone; the view still holds the mapping.
  EXPECT_EQ(keep.shape(), (Shape{1, 3}));
  EXPECT_EQ(keep.data<int32_t>()[0], -2147483647 - 1);
  EXPECT_EQ(keep.data<int32_t>()[2], 2147483647);
}

TEST_F(Safetensors, ViewsPointIntoTheMapping) {
  const std::vector<float> v = {1, 2, 3, 4};
  const std::string path = write(SafetensorsBuilder().values("a", "F32", {4}, v).build());
  const File f = File::open(path);
  const Tensor a = f.tensor("a");
  const Tensor b = f.tensor("a");
  EXPECT_EQ(a.data(), b.data());  // borrowed, not copied
}

TEST_F(Safetensors, UnalignedDataIsCopiedToAlignedMemory) {
  const std::vector<float> v = {1.25f, -8.5f, 3.0f};
  SafetensorsBuilder b;
  b.align(1).tensor("pad", "I8", {1}, {9}).values("x", "F32", {3}, v);
  const std::vector<uint8_t> bytes = b.build();
  const File f = File::open(write(bytes));
  const Tensor x = f.tensor("x");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(x.data()) % alignof(float), 0u);
  EXPECT_EQ(x.data<float>()[0], 1.25f);
  EXPECT_EQ(x.data<float>()[1], -8.5f);
  EXPECT_EQ(x.data<float>()[2], 3.0f);
  EXPECT_EQ(f.tensor("pad").data<int8_t>()[0], 9);
}

TEST_F(Safetensors, EmptyHeaderObjectIsAFileWithoutTensors) {
  const File f = File::open(write(assemble("{}", {})));
  EXPECT_TRUE(f.names().empty());
  EXPECT_TRUE(f.metadata().empty());
}

TEST_F(Safetensors, GapsBetweenTensorsAndEmptyTensorsAnywhereAreAccepted) {
  const std::string header = R"({"a":{"dtype":"I8","shape":[2],"data_offsets":[4,6]},)"
                             R"("e":{"dtype":"F32","shape":[0],"data_offsets":[5,5]}})";
  const File f = File::open(write(assemble(header, {0, 0, 0, 0, 7, 8, 0})));
  EXPECT_EQ(element(f.tensor("a"), 1), 8);
  EXPECT_EQ(f.tensor("e").numel(), 0);
}

TEST_F(Safetensors, DtypeNames) {
  EXPECT_EQ(dtype_from_name("F32"), DType::F32);
  EXPECT_EQ(dtype_from_name("F16"), DType::F16);
  EXPECT_EQ(dtype_from_name("BF16"), DType::BF16);
  EXPECT_EQ(dtype_from_name("I8"), DType::I8);
  EXPECT_EQ(dtype_from_name("I32"), DType::I32);
  EXPECT_TRUE(contains(error_of([] { dtype_from_name("F64"); }), "unsupported dtype F64"));
  EXPECT_TRUE(contains(error_of([] { dtype_from_name("f32"); }), "unknown dtype 'f32'"));
}

TEST_F(Safetensors, MissingTensorLookupNamesFileAndTensor) {
  const std::string path =
      write(SafetensorsBuilder().values("a", "F32", {1}, std::vector<float>{1}).build());
  const File f = File::open(path);
  EXPECT_EQ(error_of([&] { f.tensor("nope"); }), path + ": missing tensor 'nope'");
  EXPECT_EQ(error_of([&] { f.tensor_info("nope"); }), path + ": missing tensor 'nope'");
}

// ---- bad files ------------------------------------------------------------------------------

TEST_F(Safetensors, MissingFileAndDirectory) {
  const std::string missing = dir_.path() + "/nope.safetensors";
  EXPECT_EQ(error_of([&] { File::open(missing); }),
            missing + ": cannot open: No such file or directory");
  expect_error([&] { File::open(dir_.path()); }, dir_.path(), {"not a regular file"});
}

TEST_F(Safetensors, TooSmall) {
  fails({}, {"too small", "0 bytes"});
  fails({1, 0, 0, 0, 0, 0, 0}, {"too small", "7 bytes"});
}

TEST_F(Safetensors, HeaderSizeLargerThanFile) {
  fails(assemble("{}", {}, 100), {"truncated file", "header size 100", "2 bytes after"});
  fails(assemble("", {}, 1), {"truncated file", "header size 1"});
}

TEST_F(Safetensors, AbsurdHeaderSize) {
  fails(assemble("{}", {}, uint64_t{1} << 40), {"absurd", "1099511627776"});
  fails(assemble("{}", {}, kMaxHeaderBytes + 1), {"absurd", "100000001"});
  const std::string lfs =
      "version https://git-lfs.github.com/spec/v1\noid sha256:0123\nsize 1234\n";
  fails(std::vector<uint8_t>(lfs.begin(), lfs.end()), {"absurd", "Git LFS pointer"});
}

TEST_F(Safetensors, MalformedJsonNamesLineAndColumn) {
  fails_header(R"({"a": )", {"malformed JSON at line 1, column 7"});
  fails_header("{\n  \"w\": {\n    \"dtype\": F32\n  }\n}",
               {"malformed JSON at line 3, column 14"});
  fails_header("", {"malformed JSON at line 1, column 1", "unexpected end of input"});
  fails_header("{\"\xff\": 1}", {"malformed JSON", "UTF-8"});
  fails_header(R"({"a": 1e999})", {"malformed JSON", "1e999"});
}

TEST_F(Safetensors, HeaderNotAnObject) {
  fails_header("[1, 2]", {"the header is an array of 2 items, expected a JSON object"});
  fails_header("\"x\"", {"the header is a string (\"x\"), expected a JSON object"});
}

TEST_F(Safetensors, EntryFieldsMissingOrIllTyped) {
  fails_header(R"({"w": 3})", {"tensor 'w': entry is an integer (3), expected an object"});
  fails_header(R"({"w": {"shape": [1], "data_offsets": [0, 4]}})",
               {"tensor 'w': missing field 'dtype'"});
  fails_header(R"({"w": {"dtype": "F32", "data_offsets": [0, 4]}})",
               {"tensor 'w': missing field 'shape'"});
  fails_header(R"({"w": {"dtype": "F32", "shape": [1]}})",
               {"tensor 'w': missing field 'data_offsets'"});
  fails_header(R"({"w": {"dtype": 5, "shape": [1], "data_offsets": [0, 4]}})",
               {"tensor 'w': field 'dtype' is an integer (5), expected a string"});
  fails_header(R"({"w": {"dtype": "F32", "shape": "1", "data_offsets": [0, 4]}})",
               {"tensor 'w': field 'shape' is a string (\"1\"), expected an array"});
  fails_header(R"({"w": {"dtype": "F32", "shape": [2, 1.5], "data_offsets": [0, 4]}})",
               {"tensor 'w': dimension 1 of shape [2,1.5] is a float (1.5)"});
  fails_header(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0]}})",
               {"tensor 'w': field 'data_offsets' is an array of 1 items, expected [begin, end]"});
  fails_header(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": {"a": 1}}})",
               {"field 'data_offsets' is an object"});
  fails_header(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, "4"]}})",
               {"tensor 'w': data_offsets end is a string (\"4\")"});
  fails_header(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}})",
               {"tensor 'w': data_offsets begin is negative (-4)"});
  fails_header(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}})",
               {"tensor 'w': data_offsets [8, 4] end before they begin"});
  fails_header(R"({"": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})",
               {"empty tensor name"});
}

TEST_F(Safetensors, UnknownAndUnsupportedDtypes) {
  fails_header(R"({"w": {"dtype": "Q4_K", "shape": [1], "data_offsets": [0, 1]}})",
               {"unknown dtype 'Q4_K' for tensor 'w'"});
  for (const char* t : {"F64", "I64", "U8", "BOOL", "F8_E4M3", "F8_E5M2", "U16", "I16"}) {
    const std::string header =
        std::string(R"({"w": {"dtype": ")") + t + R"(", "shape": [1], "data_offsets": [0, 1]}})";
    const std::string expected = std::string("unsupported dtype ") + t + " for tensor 'w'";
    fails_header(header, {expected});
  }
}

TEST_F(Safetensors, NegativeAndHugeDimensions) {
  fails_header(R"({"w": {"dtype": "F32", "shape": [2, -3], "data_offsets": [0, 4]}})",
               {"tensor 'w': negative dimension 1 = -3 in shape [2,-3]"});
  fails_header(
      R"({"w": {"dtype": "F32", "shape": [18446744073709551615], "data_offsets": [0, 4]}})",
      {"tensor 'w': dimension 0", "too large"});
  fails_header(
      R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 4]}})",
      {"tensor 'w': shape [4294967296, 4294967296] has too many elements"});
  fails_header(R"({"w": {"dtype": "F32", "shape": [4611686018427387904], "data_offsets": [0, 4]}})",
               {"tensor 'w': shape [4611686018427387904] is too large"});
}

TEST_F(Safetensors, ByteRangeMustMatchShapeAndDtype) {
  fails_header(
      R"({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]}})",
      {"tensor 'w': data_offsets [0, 12] span 12 bytes, but shape [2, 2] of F32 needs 16"});
  fails_header(R"({"w": {"dtype": "BF16", "shape": [], "data_offsets": [0, 4]}})",
               {"span 4 bytes, but shape [] of BF16 needs 2"});
  fails_header(R"({"w": {"dtype": "I8", "shape": [0], "data_offsets": [0, 1]}})",
               {"span 1 bytes, but shape [0] of I8 needs 0"});
}

TEST_F(Safetensors, DataPastTheEnd) {
  fails_header(R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})",
               {"tensor 'w' data extends past the end of the file", "data section of 8 bytes"}, 8);
  fails_header(R"({"w": {"dtype": "I8", "shape": [1], "data_offsets": [16, 17]}})",
               {"tensor 'w' data extends past the end"}, 16);
  fails_header(
      R"({"w": {"dtype": "I8", "shape": [0], "data_offsets": [18446744073709551615, 18446744073709551615]}})",
      {"tensor 'w': data_offsets begin is 18446744073709551615, too large"});
}

TEST_F(Safetensors, OverlappingTensors) {
  fails_header(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
               R"( "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
               {"overlapping tensors: 'a' at data_offsets [0, 8] and 'b' at [4, 12]"});
  // Listed in the other order, and sharing exactly the same bytes.
  fails_header(R"({"b": {"dtype": "I8", "shape": [4], "data_offsets": [4, 8]},)"
               R"( "a": {"dtype": "I32", "shape": [1], "data_offsets": [4, 8]}})",
               {"overlapping tensors"});
}

TEST_F(Safetensors, DuplicateNamesAndKeys) {
  fails_header(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},)"
               R"( "w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
               {"duplicate tensor name 'w'"});
  fails_header(R"({"w": {"dtype": "F32", "dtype": "F16", "shape": [1], "data_offsets": [0, 4]}})",
               {"duplicate key 'w.dtype'"});
}

TEST_F(Safetensors, BadMetadata) {
  fails_header(R"({"__metadata__": [1]})",
               {"'__metadata__' is an array of 1 items, expected an object of strings"});
  fails_header(R"({"__metadata__": {"format": "pt", "n": 3}})",
               {"'__metadata__' key 'n' is an integer (3), expected a string"});
}

// Every strict prefix of a valid file is an error, never a crash or a file that opens.
TEST_F(Safetensors, TruncationAtEveryByte) {
  SafetensorsBuilder b;
  b.metadata("format", "pt")
      .values("a", "F32", {2, 2}, std::vector<float>{1, 2, 3, 4})
      .values("b", "BF16", {3}, std::vector<uint16_t>{1, 2, 3})
      .values("c", "I8", {1}, std::vector<int8_t>{5});
  const std::vector<uint8_t> full = b.build();
  ASSERT_NO_THROW(File::open(write(full)));
  ScratchFile scratch(dir_.path() + "/truncated.safetensors");
  const std::string& path = scratch.path();
  for (size_t n = 0; n < full.size(); ++n) {
    scratch.set(full.data(), n);
    try {
      File::open(path);
      ADD_FAILURE() << "a file truncated to " << n << " of " << full.size() << " bytes opened";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind(path + ": ", 0), 0u) << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "truncation to " << n << " bytes threw a non-llmk exception: " << e.what();
    }
  }
}

// Random byte flips in the header: each mutant opens (and then every view lies inside the
// file) or throws llmk::Error. Sanitizer builds catch any stray read.
TEST_F(Safetensors, ByteFlipsOpenOrThrowLlmkError) {
  SafetensorsBuilder b;
  b.metadata("k", "v")
      .values("a", "F32", {2, 3}, std::vector<float>{1, 2, 3, 4, 5, 6})
      .values("b", "I32", {2}, std::vector<int32_t>{7, 8})
      .tensor("e", "F16", {0}, {});
  const std::vector<uint8_t> full = b.build();
  const size_t header_end = 8 + b.header().size();
  std::mt19937 rng(42);
  ScratchFile scratch(dir_.path() + "/flip.safetensors");
  int opened = 0;
  for (int iter = 0; iter < 1500; ++iter) {
    std::vector<uint8_t> bytes = full;
    const int flips = 1 + iter % 3;
    for (int k = 0; k < flips; ++k) {
      const size_t at = rng() % header_end;
      bytes[at] = iter % 2 == 0 ? static_cast<uint8_t>(rng()) : bytes[at] ^ (1u << (rng() % 8));
    }
    scratch.set(bytes.data(), bytes.size());
    try {
      const File f = File::open(scratch.path());
      ++opened;
      for (const TensorInfo& t : f.tensors()) {
        ASSERT_LE(f.data_offset() + t.offset + t.nbytes, f.file_size());
        const Tensor x = f.tensor(t.name);
        uint64_t sum = 0;
        for (int64_t i = 0; i < x.nbytes(); ++i) sum += x.data<uint8_t>()[i];
        (void)sum;
      }
    } catch (const Error&) {
    } catch (const std::exception& e) {
      ADD_FAILURE() << "mutant " << iter << " threw a non-llmk exception: " << e.what();
    }
  }
  EXPECT_GT(opened, 0);  // some flips land in harmless places (names, padding)
}

// ---- folders --------------------------------------------------------------------------------

class SafetensorsFolder : public Safetensors {
 protected:
  void SetUp() override {
    root_ = dir_.path() + "/model";
    std::filesystem::create_directory(root_);
  }
  std::string put(const std::string& name, const std::vector<uint8_t>& bytes) {
    return dir_.write("model/" + name, bytes);
  }
  std::string put_text(const std::string& name, const std::string& text) {
    return put(name, std::vector<uint8_t>(text.begin(), text.end()));
  }
  static std::vector<uint8_t> shard(
      std::initializer_list<std::pair<std::string, std::vector<float>>> tensors) {
    SafetensorsBuilder b;
    for (const auto& [name, v] : tensors) {
      b.values(name, "F32", {static_cast<int64_t>(v.size())}, v);
    }
    return b.build();
  }
  // Two shards, and the index naming them.
  std::string two_shards() {
    put("model-00001-of-00002.safetensors", shard({{"embed", {1, 2}}, {"layer.0", {3}}}));
    put("model-00002-of-00002.safetensors", shard({{"layer.1", {4, 5, 6}}, {"norm", {7}}}));
    return put_text("model.safetensors.index.json", R"({
  "metadata": {"total_size": 28},
  "weight_map": {
    "embed": "model-00001-of-00002.safetensors",
    "layer.0": "model-00001-of-00002.safetensors",
    "layer.1": "model-00002-of-00002.safetensors",
    "norm": "model-00002-of-00002.safetensors"
  }
})");
  }
  std::string index_with(const std::string& weight_map) {
    return put_text("model.safetensors.index.json", "{\"weight_map\": " + weight_map + "}");
  }

  std::string root_;
};

TEST_F(SafetensorsFolder, SingleFile) {
  const std::string file = put("model.safetensors", shard({{"a", {1, 2}}, {"b", {3}}}));
  const Folder f = Folder::open(root_);
  EXPECT_EQ(f.path(), root_);
  EXPECT_EQ(f.index_path(), "");
  ASSERT_EQ(f.shards().size(), 1u);
  EXPECT_EQ(f.shards()[0].path(), file);
  EXPECT_EQ(f.names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(f.tensor("a").data<float>()[1], 2.0f);
  EXPECT_EQ(f.find("b")->shape, Shape{1});
  EXPECT_EQ(f.find("c"), nullptr);
  EXPECT_EQ(error_of([&] { f.tensor("c"); }), file + ": missing tensor 'c'");
  // The file itself opens as a folder too.
  EXPECT_EQ(Folder::open(file).names(), f.names());
}

TEST_F(SafetensorsFolder, Sharded) {
  const std::string index = two_shards();
  put("model.safetensors", shard({{"ignored", {0}}}));  // the index wins
  for (const std::string& path : {root_, index}) {
    const Folder f = Folder::open(path);
    EXPECT_EQ(f.index_path(), index);
    ASSERT_EQ(f.shards().size(), 2u);
    EXPECT_EQ(f.shards()[0].path(), root_ + "/model-00001-of-00002.safetensors");
    EXPECT_EQ(f.shards()[1].path(), root_ + "/model-00002-of-00002.safetensors");
    EXPECT_EQ(f.names(), (std::vector<std::string>{"embed", "layer.0", "layer.1", "norm"}));
    EXPECT_EQ(f.shard_of("norm").path(), f.shards()[1].path());
    EXPECT_EQ(f.shard_of("layer.0").path(), f.shards()[0].path());
    EXPECT_EQ(f.find("layer.1")->shape, Shape{3});
    EXPECT_EQ(f.tensor_info("embed").nbytes, 8u);
    EXPECT_EQ(f.tensor("layer.1").data<float>()[2], 6.0f);
    EXPECT_EQ(f.tensor("norm").data<float>()[0], 7.0f);
    EXPECT_EQ(f.find("ignored"), nullptr);
    EXPECT_EQ(error_of([&] { f.tensor("ignored"); }), index + ": missing tensor 'ignored'");
  }
}

TEST_F(SafetensorsFolder, TensorsOutsideTheIndexAreNotExposed) {
  put("a.safetensors", shard({{"x", {1}}, {"extra", {2}}}));
  index_with(R"({"x": "a.safetensors"})");
  const Folder f = Folder::open(root_);
  EXPECT_EQ(f.names(), std::vector<std::string>{"x"});
  EXPECT_EQ(f.find("extra"), nullptr);
}

TEST_F(SafetensorsFolder, NeitherFile) {
  put_text("config.json", "{}");
  expect_error([&] { Folder::open(root_); }, root_,
               {"neither model.safetensors.index.json nor model.safetensors"});
  const std::string missing = root_ + "/nothing";
  expect_error([&] { Folder::open(missing); }, missing, {"cannot open"});
}

TEST_F(SafetensorsFolder, MissingShard) {
  const std::string index = two_shards();
  const std::string shard2 = root_ + "/model-00002-of-00002.safetensors";
  std::filesystem::remove(shard2);
  expect_error([&] { Folder::open(root_); }, shard2, {"shard file is missing", index});
}

TEST_F(SafetensorsFolder, TensorAbsentFromItsShard) {
  put("a.safetensors", shard({{"x", {1}}}));
  put("b.safetensors", shard({{"y", {1}}}));
  const std::string index = index_with(R"({"x": "a.safetensors", "y": "a.safetensors"})");
  expect_error([&] { Folder::open(root_); }, index,
               {"tensor 'y' is mapped to a.safetensors, but that shard has no such tensor"});
}

TEST_F(SafetensorsFolder, TensorListedTwiceOrInTwoShards) {
  put("a.safetensors", shard({{"x", {1}}}));
  put("b.safetensors", shard({{"x", {2}}, {"y", {3}}}));
  std::string index = index_with(R"({"x": "a.safetensors", "x": "b.safetensors"})");
  expect_error([&] { Folder::open(root_); }, index, {"tensor 'x' is listed twice in weight_map"});
  index = index_with(R"({"x": "a.safetensors", "y": "b.safetensors"})");
  expect_error([&] { Folder::open(root_); }, index,
               {"tensor 'x' is in two shards, a.safetensors and b.safetensors"});
}

TEST_F(SafetensorsFolder, BadIndex) {
  put("a.safetensors", shard({{"x", {1}}}));
  std::string index = put_text("model.safetensors.index.json", "{\n  \"weight_map\": {,\n}");
  expect_error([&] { Folder::open(root_); }, index, {"malformed JSON at line 2, column 18"});
  index = put_text("model.safetensors.index.json", "[]");
  expect_error([&] { Folder::open(root_); }, index, {"the index is an array"});
  index = put_text("model.safetensors.index.json", R"({"metadata": {}})");
  expect_error([&] { Folder::open(root_); }, index, {"missing 'weight_map'"});
  index = index_with("[\"a.safetensors\"]");
  expect_error([&] { Folder::open(root_); }, index, {"'weight_map' is an array"});
  index = index_with("{}");
  expect_error([&] { Folder::open(root_); }, index, {"'weight_map' is empty"});
  index = index_with(R"({"x": 1})");
  expect_error([&] { Folder::open(root_); }, index,
               {"weight_map entry 'x' is an integer (1), expected a shard file name"});
  for (const char* bad : {"../a.safetensors", "/etc/passwd", "", ".."}) {
    index = index_with(std::string(R"({"x": ")") + bad + "\"}");
    expect_error([&] { Folder::open(root_); }, index, {"weight_map entry 'x' names shard"});
  }
  // Control characters would reach messages through the shard's path (found by
  // fuzz/safetensors_index.cpp; tests/fixtures/bad/fuzz/safetensors_index-shard-newline).
  for (const char* bad : {R"(a\nb.safetensors)", R"(a\u001b[2J.safetensors)"}) {
    index = index_with(std::string(R"({"x": ")") + bad + "\"}");
    const std::string msg =
        expect_error([&] { Folder::open(root_); }, index, {"weight_map entry 'x' names shard"});
    EXPECT_EQ(msg.find_first_of("\n\x1b"), std::string::npos) << msg;
  }
}

TEST_F(SafetensorsFolder, CorruptShardNamesTheShard) {
  put("a.safetensors", shard({{"x", {1}}}));
  const std::string bad = put("b.safetensors", {1, 2, 3});
  index_with(R"({"x": "a.safetensors", "y": "b.safetensors"})");
  expect_error([&] { Folder::open(root_); }, bad, {"too small"});
}

// ---- files written by the safetensors and transformers Python packages ---------------------

const std::string kFixtures = std::string(LLMK_SOURCE_DIR) + "/tests/fixtures/safetensors";

nlohmann::json expected_json() {
  std::ifstream in(kFixtures + "/expected.json");
  EXPECT_TRUE(in.good()) << "missing " << kFixtures
                         << "/expected.json; run tests/fixtures/safetensors/make_safetensors.py";
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str());
}

// The reader's view of each tensor matches what Python wrote: dtype, shape, sum, first and
// last values. Returns how many tensors were compared.
template <typename Source>
size_t check_against(const Source& src, const nlohmann::json& tensors) {
  size_t checked = 0;
  for (auto it = tensors.begin(); it != tensors.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& want = it.value();
    SCOPED_TRACE(name);
    const TensorInfo* info = src.find(name);
    if (info == nullptr) {
      ADD_FAILURE() << "missing tensor " << name;
      continue;
    }
    EXPECT_EQ(info->dtype, dtype_from_name(want["dtype"].get<std::string>()));
    EXPECT_EQ(info->shape, want["shape"].get<Shape>());
    const Tensor t = src.tensor(name);
    double sum = 0;
    for (int64_t i = 0; i < t.numel(); ++i) sum += element(t, i);
    const double want_sum = want["sum"].get<double>();
    EXPECT_NEAR(sum, want_sum, 1e-9 * (1 + std::abs(want_sum)));
    const auto first = want["first"].get<std::vector<double>>();
    if (first.size() != static_cast<size_t>(std::min<int64_t>(4, t.numel()))) {
      ADD_FAILURE() << "expected.json lists " << first.size() << " first values";
      continue;
    }
    for (size_t i = 0; i < first.size(); ++i) {
      EXPECT_EQ(element(t, static_cast<int64_t>(i)), first[i]) << "element " << i;
    }
    if (t.numel() > 0) {
      EXPECT_EQ(element(t, t.numel() - 1), want["last"].get<double>());
    }
    ++checked;
  }
  return checked;
}

TEST(SafetensorsFixture, SingleFileFromThePythonPackage) {
  const nlohmann::json want = expected_json()["single"];
  const File f = File::open(kFixtures + "/single.safetensors");
  // safetensors orders entries by alignment, then name; the reader keeps the file's order.
  EXPECT_EQ(f.names(), (std::vector<std::string>{"a.f32", "scalar.f32", "d.i32", "c.bf16",
                                                 "empty.bf16", "b.f16", "e.i8"}));
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("producer"), "tests/fixtures/safetensors/make_safetensors.py");
  EXPECT_EQ(f.metadata().size(), want["metadata"].size());
  EXPECT_EQ(check_against(f, want["tensors"]), 7u);
  EXPECT_EQ(f.tensor("scalar.f32").ndim(), 0);
  EXPECT_EQ(f.tensor("scalar.f32").data<float>()[0], -3.25f);
  EXPECT_EQ(f.tensor("empty.bf16").shape(), (Shape{0, 4}));
  // Not vacuous: the values are random, not zeros.
  EXPECT_NE(want["tensors"]["a.f32"]["sum"].get<double>(), 0.0);
}

TEST(SafetensorsFixture, ShardedFolderFromTransformers) {
  const nlohmann::json want = expected_json()["tiny_llama"];
  const std::string root = kFixtures + "/tiny-llama";
  const Folder f = Folder::open(root);
  EXPECT_EQ(f.index_path(), root + "/model.safetensors.index.json");
  ASSERT_EQ(f.shards().size(), 2u);
  EXPECT_EQ(f.shards()[0].path(), root + "/model-00001-of-00002.safetensors");
  EXPECT_EQ(f.shards()[1].path(), root + "/model-00002-of-00002.safetensors");
  // 2 layers x 9 tensors, embeddings, final norm, lm_head.
  EXPECT_EQ(f.names().size(), 21u);
  EXPECT_EQ(check_against(f, want["tensors"]), 21u);
  for (const auto& [name, t] : want["tensors"].items()) {
    EXPECT_EQ(f.shard_of(name).path(), root + "/" + t["shard"].get<std::string>()) << name;
  }
  EXPECT_EQ(f.find("model.embed_tokens.weight")->shape, (Shape{64, 16}));
  EXPECT_EQ(f.find("model.layers.1.self_attn.k_proj.weight")->shape, (Shape{8, 16}));
  EXPECT_EQ(f.find("model.layers.0.mlp.gate_proj.weight")->dtype, DType::BF16);
}

}  // namespace
}  // namespace llmk::safetensors
