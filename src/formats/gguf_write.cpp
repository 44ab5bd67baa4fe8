#include "formats/gguf_write.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "core/text.h"
#include "formats/mapped_file.h"

namespace llmk::gguf {

namespace {

constexpr uint32_t kVersion = 3;

template <typename T>
void put(std::vector<uint8_t>& out, T v) {
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));
}

void put_string(std::vector<uint8_t>& out, std::string_view s) {
  put<uint64_t>(out, s.size());
  out.insert(out.end(), s.begin(), s.end());
}

// One integer (or bool) element of type t.
void put_int(std::vector<uint8_t>& out, ValueType t, int64_t v) {
  switch (t) {
    case ValueType::U8:
    case ValueType::BOOL:
      return put(out, static_cast<uint8_t>(v));
    case ValueType::I8:
      return put(out, static_cast<int8_t>(v));
    case ValueType::U16:
      return put(out, static_cast<uint16_t>(v));
    case ValueType::I16:
      return put(out, static_cast<int16_t>(v));
    case ValueType::U32:
      return put(out, static_cast<uint32_t>(v));
    case ValueType::I32:
      return put(out, static_cast<int32_t>(v));
    case ValueType::U64:
      return put(out, static_cast<uint64_t>(v));
    case ValueType::I64:
      return put(out, v);
    default:
      LLMK_FAIL("gguf: {} is not an integer type", value_type_name(t));
  }
}

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

}  // namespace

void append_value(std::vector<uint8_t>& out, const Value& v) {
  switch (v.type()) {
    case ValueType::F32:
      return put(out, static_cast<float>(v.as_float()));
    case ValueType::F64:
      return put(out, v.as_float());
    case ValueType::BOOL:
      return put(out, static_cast<uint8_t>(v.as_bool() ? 1 : 0));
    case ValueType::STRING:
      return put_string(out, v.as_string());
    case ValueType::U64:  // the full u64 range: to_string holds it exactly
      return put(out, static_cast<uint64_t>(std::stoull(v.to_string())));
    case ValueType::ARRAY:
      break;
    default:
      return put_int(out, v.type(), v.as_int());
  }
  const Value::Array& a = v.as_array();
  put(out, static_cast<uint32_t>(a.elem));
  put<uint64_t>(out, a.size());
  for (const std::string& s : a.strings) put_string(out, s);
  for (const Value& n : a.nested) append_value(out, n);
  for (const double f : a.floats) {
    if (a.elem == ValueType::F32) {
      put(out, static_cast<float>(f));
    } else {
      put(out, f);
    }
  }
  for (const int64_t i : a.ints) put_int(out, a.elem, i);
}

uint32_t ggml_type_of(DType t) {
  // The ids of ggml's enum ggml_type that llmk reads (gguf.cpp's table, inverted).
  switch (t) {
    case DType::F32:
      return 0;
    case DType::F16:
      return 1;
    case DType::Q4_0:
      return 2;
    case DType::Q4_1:
      return 3;
    case DType::Q5_0:
      return 6;
    case DType::Q5_1:
      return 7;
    case DType::Q8_0:
      return 8;
    case DType::Q2_K:
      return 10;
    case DType::Q3_K:
      return 11;
    case DType::Q4_K:
      return 12;
    case DType::Q5_K:
      return 13;
    case DType::Q6_K:
      return 14;
    case DType::Q8_K:
      return 15;
    case DType::I8:
      return 24;
    case DType::I32:
      return 26;
    case DType::BF16:
      return 30;
    default:
      LLMK_FAIL("GGUF has no tensor type for dtype {}", dtype_name(t));
  }
}

Writer::~Writer() {
  if (file_ != nullptr) {
    std::fclose(file_);
    std::remove(partial_.c_str());
  }
}

void Writer::set(const std::string& key, Value v) {
  LLMK_CHECK(file_ == nullptr, "gguf writer: metadata '{}' set after open()", printable(key));
  if (key == "general.alignment") {
    const int64_t a = v.is_integer() ? v.as_int() : -1;
    LLMK_CHECK(a > 0 && (a & (a - 1)) == 0,
               "gguf writer: general.alignment {} is not a power of two", v.to_string());
    LLMK_CHECK(tensors_.empty(), "gguf writer: general.alignment set after the tensors");
    alignment_ = static_cast<uint64_t>(a);
  }
  for (auto& [k, value] : metadata_) {
    if (k == key) {
      value = std::move(v);
      return;
    }
  }
  metadata_.emplace_back(key, std::move(v));
}

const Value* Writer::find(std::string_view key) const {
  for (const auto& [k, value] : metadata_) {
    if (k == key) return &value;
  }
  return nullptr;
}

void Writer::add_tensor(const std::string& name, const Shape& shape, DType dtype) {
  LLMK_CHECK(file_ == nullptr, "gguf writer: tensor '{}' added after open()", printable(name));
  LLMK_CHECK(!name.empty(), "gguf writer: empty tensor name");
  for (const Info& t : tensors_) {
    LLMK_CHECK(t.name != name, "gguf writer: duplicate tensor '{}'", printable(name));
  }
  LLMK_CHECK(!shape.empty() && shape.size() <= 4, "gguf writer: tensor '{}' has {} dimensions",
             printable(name), shape.size());
  for (const int64_t d : shape) {
    LLMK_CHECK(d > 0, "gguf writer: tensor '{}' has shape {}", printable(name), shape_str(shape));
  }
  ggml_type_of(dtype);  // throws for dtypes GGUF cannot hold
  LLMK_CHECK(shape.back() % block_size(dtype) == 0,
             "gguf writer: tensor '{}' has rows of {}, not whole {} blocks", printable(name),
             shape.back(), dtype_name(dtype));
  Info t{name, shape, dtype, data_bytes_,
         static_cast<uint64_t>(bytes_for(dtype, shape_numel(shape)))};
  data_bytes_ = align_up(data_bytes_ + t.nbytes, alignment_);
  tensors_.push_back(std::move(t));
}

std::vector<uint8_t> Writer::header() const {
  std::vector<uint8_t> out(4);
  std::memcpy(out.data(), "GGUF", 4);
  put(out, kVersion);
  put<uint64_t>(out, tensors_.size());
  put<uint64_t>(out, metadata_.size());
  for (const auto& [key, value] : metadata_) {
    put_string(out, key);
    put(out, static_cast<uint32_t>(value.type()));
    append_value(out, value);
  }
  for (const Info& t : tensors_) {
    put_string(out, t.name);
    put(out, static_cast<uint32_t>(t.shape.size()));
    for (auto d = t.shape.rbegin(); d != t.shape.rend(); ++d) put(out, static_cast<uint64_t>(*d));
    put(out, ggml_type_of(t.dtype));
    put(out, t.offset);
  }
  out.resize(align_up(out.size(), alignment_), 0);
  return out;
}

uint64_t Writer::file_bytes() const { return header().size() + data_bytes_; }

void Writer::write_bytes(const void* data, uint64_t n) {
  if (n == 0) return;
  errno = 0;
  if (std::fwrite(data, 1, n, file_) != n) {
    LLMK_FAIL("{}: cannot write: {}", partial_,
              formats::errno_message(errno != 0 ? errno : ENOSPC));
  }
}

void Writer::open(const std::string& path) {
  LLMK_CHECK(file_ == nullptr, "gguf writer: open() called twice");
  path_ = path;
  partial_ = path + ".partial";
  file_ = std::fopen(partial_.c_str(), "wb");
  LLMK_CHECK(file_ != nullptr, "{}: cannot write: {}", partial_, formats::errno_message(errno));
  const std::vector<uint8_t> head = header();
  write_bytes(head.data(), head.size());
  next_ = 0;
  written_ = position_ = 0;
}

void Writer::write(const void* data, uint64_t nbytes) {
  LLMK_CHECK(file_ != nullptr, "gguf writer: write() before open()");
  LLMK_CHECK(next_ < tensors_.size(), "{}: more tensor data than the {} tensors declared", path_,
             tensors_.size());
  const Info& t = tensors_[next_];
  LLMK_CHECK(nbytes <= t.nbytes - written_, "{}: tensor '{}' given {} bytes more than its {}",
             path_, printable(t.name), written_ + nbytes - t.nbytes, t.nbytes);
  write_bytes(data, nbytes);
  written_ += nbytes;
  if (written_ < t.nbytes) return;
  position_ = t.offset + t.nbytes;
  static constexpr uint8_t kZeros[256] = {};
  for (uint64_t pad = align_up(position_, alignment_) - position_; pad > 0;) {
    const uint64_t n = std::min<uint64_t>(pad, sizeof kZeros);
    write_bytes(kZeros, n);
    pad -= n;
    position_ += n;
  }
  ++next_;
  written_ = 0;
}

void Writer::finish() {
  LLMK_CHECK(file_ != nullptr, "gguf writer: finish() before open()");
  LLMK_CHECK(next_ == tensors_.size(), "{}: {} of {} tensors written", path_, next_,
             tensors_.size());
  std::FILE* f = file_;
  file_ = nullptr;
  const bool flushed = std::fflush(f) == 0;
  const int flush_errno = errno;
  if (std::fclose(f) != 0 || !flushed) {
    const int err = flushed ? errno : flush_errno;
    std::remove(partial_.c_str());
    LLMK_FAIL("{}: cannot write: {}", partial_, formats::errno_message(err));
  }
  if (std::rename(partial_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    std::remove(partial_.c_str());
    LLMK_FAIL("{}: cannot rename {} to it: {}", path_, partial_, formats::errno_message(err));
  }
}

}  // namespace llmk::gguf
