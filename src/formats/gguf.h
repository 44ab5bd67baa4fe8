// GGUF v2/v3 reader over a read-only mmap of the file.
//
// Layout (little-endian): magic "GGUF", u32 version, u64 tensor_count, u64 kv_count, then
// kv_count metadata entries (string key, u32 value type, value), then tensor_count tensor
// infos (string name, u32 n_dims, u64 ne[n_dims], u32 ggml type, u64 offset), then padding to
// `general.alignment` (default 32), then the tensor data section. Offsets are relative to the
// start of the data section. Every count, length and offset is validated against the file size
// before use; a bad file gives llmk::Error naming the path and what is wrong.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"

namespace llmk::gguf {

enum class ValueType : uint32_t {
  U8 = 0,
  I8 = 1,
  U16 = 2,
  I16 = 3,
  U32 = 4,
  I32 = 5,
  F32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  U64 = 10,
  I64 = 11,
  F64 = 12,
};
std::string_view value_type_name(ValueType t);

// One metadata value. Arrays keep their elements in the vector that fits the element type
// (strings, integers, floats, or nested values for arrays of arrays).
class Value {
 public:
  struct Array {
    ValueType elem = ValueType::U8;
    std::vector<std::string> strings;  // elem == STRING
    std::vector<int64_t> ints;   // integer and BOOL elems (u64 values above INT64_MAX are rejected)
    std::vector<double> floats;  // F32 / F64 elems
    std::vector<Value> nested;   // elem == ARRAY
    size_t size() const;
  };

  Value() = default;
  Value(ValueType type, std::variant<int64_t, uint64_t, double, bool, std::string, Array> v)
      : type_(type), v_(std::move(v)) {}

  ValueType type() const { return type_; }
  bool is_array() const { return type_ == ValueType::ARRAY; }
  bool is_integer() const;  // any of the integer types
  bool is_float() const;    // F32 or F64

  // Typed access; a mismatch throws llmk::Error naming the expected and actual type.
  int64_t as_int() const;   // integer types (u64 above INT64_MAX throws)
  double as_float() const;  // F32/F64, and integer types converted
  bool as_bool() const;
  const std::string& as_string() const;
  const Array& as_array() const;

  // For `llmk inspect`: strings (alone or in an array) through llmk::printable, arrays as their
  // first items and a count.
  std::string to_string(size_t max_array_items = 8) const;

 private:
  ValueType type_ = ValueType::U8;
  std::variant<int64_t, uint64_t, double, bool, std::string, Array> v_;
};

struct TensorInfo {
  std::string name;
  Shape shape;  // row-major, outermost first: GGUF's ne[] reversed ({rows, cols} for a matrix)
  DType dtype = DType::F32;
  uint32_t ggml_type = 0;
  uint64_t offset = 0;  // from the start of the data section
  uint64_t nbytes = 0;
};

// Maps a ggml type id to llmk's DType; throws for ids llmk does not support, naming the id.
DType dtype_from_ggml(uint32_t ggml_type);
std::string_view ggml_type_name(uint32_t ggml_type);  // "q4_K", or "unknown(42)"

class File {
 public:
  // Opens and validates the whole header and tensor table. Throws llmk::Error naming the
  // path and the problem: unreadable, too small, wrong magic, unsupported version, truncated
  // metadata, unknown value or tensor type, tensor data past the end of the file, overlapping
  // or misaligned tensor data, a duplicate key or tensor name.
  static File open(const std::string& path);

  const std::string& path() const;
  uint32_t version() const;
  uint64_t file_size() const;
  uint64_t alignment() const;

  const std::vector<std::pair<std::string, Value>>& metadata() const;  // in file order
  const Value* find(std::string_view key) const;                       // nullptr if absent
  const Value& get(std::string_view key) const;  // throws "<path>: missing metadata key '<key>'"
  int64_t get_int(std::string_view key) const;
  int64_t get_int(std::string_view key, int64_t fallback) const;
  double get_float(std::string_view key) const;
  double get_float(std::string_view key, double fallback) const;
  std::string get_string(std::string_view key) const;
  std::string get_string(std::string_view key, std::string_view fallback) const;
  bool get_bool(std::string_view key) const;
  bool get_bool(std::string_view key, bool fallback) const;

  const std::vector<TensorInfo>& tensors() const;
  const TensorInfo* find_tensor(std::string_view name) const;  // nullptr if absent
  const TensorInfo& tensor_info(
      std::string_view name) const;  // throws "<path>: missing tensor '<name>'"
  // A borrowed CPU view of the tensor's bytes in the mapping; it keeps the mapping alive.
  Tensor tensor(std::string_view name) const;

 private:
  struct State;
  std::shared_ptr<const State> s_;
};

}  // namespace llmk::gguf
