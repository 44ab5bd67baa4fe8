#include "formats/gguf.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <system_error>

#include "core/error.h"
#include "core/text.h"
#include "formats/mapped_file.h"

namespace llmk::gguf {

namespace {

constexpr uint64_t kHeaderBytes = 24;  // magic, version, tensor_count, kv_count
constexpr uint64_t kDefaultAlignment = 32;
constexpr uint32_t kMaxDims = 4;  // GGML_MAX_DIMS
// Arrays of arrays are legal but real files never nest deeply; the limit keeps a corrupt file
// from recursing until the stack runs out.
constexpr int kMaxArrayDepth = 8;
constexpr uint32_t kNumValueTypes = 13;
// Counts are checked against the bytes left before use, but one file byte can still become
// tens of bytes in memory; reserving at most this many elements up front means a corrupt count
// costs nothing until its elements actually parse.
constexpr size_t kMaxReserve = size_t{1} << 16;

// Smallest encoding of one metadata entry: empty key (u64 length), value type, one byte.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;
// Smallest encoding of one tensor info: empty name, n_dims, one dim, type, offset.
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;

// ---- ggml types ---------------------------------------------------------------------------

struct GgmlType {
  std::string_view name;
  std::optional<DType> dtype;  // empty: known to ggml, not supported by llmk
};

// Indexed by ggml type id; an empty name marks ids ggml has retired.
constexpr std::array<GgmlType, 40> kGgmlTypes = {{
    {"f32", DType::F32},
    {"f16", DType::F16},
    {"q4_0", DType::Q4_0},
    {"q4_1", DType::Q4_1},
    {"", std::nullopt},  // 4: q4_2, removed
    {"", std::nullopt},  // 5: q4_3, removed
    {"q5_0", DType::Q5_0},
    {"q5_1", DType::Q5_1},
    {"q8_0", DType::Q8_0},
    {"q8_1", std::nullopt},
    {"q2_K", DType::Q2_K},
    {"q3_K", DType::Q3_K},
    {"q4_K", DType::Q4_K},
    {"q5_K", DType::Q5_K},
    {"q6_K", DType::Q6_K},
    {"q8_K", DType::Q8_K},
    {"iq2_xxs", std::nullopt},
    {"iq2_xs", std::nullopt},
    {"iq3_xxs", std::nullopt},
    {"iq1_s", std::nullopt},
    {"iq4_nl", std::nullopt},
    {"iq3_s", std::nullopt},
    {"iq2_s", std::nullopt},
    {"iq4_xs", std::nullopt},
    {"i8", DType::I8},
    {"i16", std::nullopt},
    {"i32", DType::I32},
    {"i64", std::nullopt},
    {"f64", std::nullopt},
    {"iq1_m", std::nullopt},
    {"bf16", DType::BF16},
    {"", std::nullopt},  // 31-33: q4_0_4_4, q4_0_4_8, q4_0_8_8, removed
    {"", std::nullopt},
    {"", std::nullopt},
    {"tq1_0", std::nullopt},
    {"tq2_0", std::nullopt},
    {"", std::nullopt},  // 36-38: iq4_nl_4_4, iq4_nl_4_8, iq4_nl_8_8,
                         // removed
    {"", std::nullopt},
    {"", std::nullopt},
    {"mxfp4", std::nullopt},
}};

const GgmlType* find_ggml_type(uint32_t id) {
  if (id >= kGgmlTypes.size() || kGgmlTypes[id].name.empty()) return nullptr;
  return &kGgmlTypes[id];
}

// ---- value types --------------------------------------------------------------------------

bool is_integer_type(ValueType t) {
  switch (t) {
    case ValueType::U8:
    case ValueType::I8:
    case ValueType::U16:
    case ValueType::I16:
    case ValueType::U32:
    case ValueType::I32:
    case ValueType::U64:
    case ValueType::I64:
      return true;
    default:
      return false;
  }
}

bool is_float_type(ValueType t) { return t == ValueType::F32 || t == ValueType::F64; }

// "an integer (u32)", "a string", "an array of f32": what a value is, for error messages.
std::string describe(ValueType t, const Value::Array* array = nullptr) {
  if (is_integer_type(t)) return fmt::format("an integer ({})", value_type_name(t));
  if (is_float_type(t)) return fmt::format("a float ({})", value_type_name(t));
  if (t == ValueType::BOOL) return "a bool";
  if (t == ValueType::STRING) return "a string";
  if (t == ValueType::ARRAY && array != nullptr) {
    return fmt::format("an array of {}", value_type_name(array->elem));
  }
  return fmt::format("an {}", value_type_name(t));
}

// Bytes one element of type t takes at least in the file.
uint64_t min_encoded_bytes(ValueType t) {
  switch (t) {
    case ValueType::U8:
    case ValueType::I8:
    case ValueType::BOOL:
      return 1;
    case ValueType::U16:
    case ValueType::I16:
      return 2;
    case ValueType::U32:
    case ValueType::I32:
    case ValueType::F32:
      return 4;
    case ValueType::U64:
    case ValueType::I64:
    case ValueType::F64:
    case ValueType::STRING:  // the u64 length
      return 8;
    case ValueType::ARRAY:  // element type and count
      return 12;
  }
  return 1;
}

std::string format_float(double v, ValueType t) {
  if (t == ValueType::F32) return fmt::format("{}", static_cast<float>(v));
  return fmt::format("{}", v);
}

// ---- the mapping --------------------------------------------------------------------------

using Mapping = formats::MappedFile;

std::shared_ptr<Mapping> map_gguf(const std::string& path) {
  std::shared_ptr<Mapping> m = formats::map_file(path);
  const uint64_t size = m->size;
  if (size < kHeaderBytes) {
    // Too small to hold a header; still say what the first bytes are when there are any.
    if (size >= 4 && std::memcmp(m->data, "GGUF", 4) != 0) {
      LLMK_FAIL("{}: not a GGUF file (bad magic) and only {} bytes long", path, size);
    }
    LLMK_FAIL("{}: file is too small to be GGUF: {} bytes, the header alone takes {}", path, size,
              kHeaderBytes);
  }
  return m;
}

// ---- the parser ---------------------------------------------------------------------------

// Reads little-endian fields from the mapping; every read is bounds-checked and a short read
// names the file, what was being read, where, and in which entry.
class Reader {
 public:
  Reader(const std::string& path, const uint8_t* data, uint64_t size)
      : path_(path), data_(data), size_(size) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }
  void set_context(std::string c) { context_ = std::move(c); }
  const std::string& context() const { return context_; }

  [[noreturn]] void fail(std::string_view msg) const {
    if (context_.empty()) LLMK_FAIL("{}: {}", path_, msg);
    LLMK_FAIL("{}: {}: {}", path_, context_, msg);
  }

  void need(uint64_t n, const char* what) const {
    if (n > remaining()) {
      fail(
          fmt::format("truncated file: {} at offset {} needs {} bytes but only {} remain "
                      "(file size {})",
                      what, pos_, n, remaining(), size_));
    }
  }

  template <typename T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  std::string read_string(const char* what) {
    const uint64_t len = read<uint64_t>(what);
    if (len > remaining()) {
      fail(
          fmt::format("truncated or corrupt file: {} at offset {} claims {} bytes but only {} "
                      "remain (file size {})",
                      what, pos_ - 8, len, remaining(), size_));
    }
    std::string s(reinterpret_cast<const char*>(data_ + pos_), static_cast<size_t>(len));
    pos_ += len;
    return s;
  }

 private:
  const std::string& path_;
  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
  std::string context_;
};

ValueType read_value_type(Reader& r, const char* what) {
  const uint64_t at = r.pos();
  const auto t = r.read<uint32_t>(what);
  if (t >= kNumValueTypes) r.fail(fmt::format("unknown value type {} at offset {}", t, at));
  return static_cast<ValueType>(t);
}

int64_t read_int_elem(Reader& r, ValueType t) {
  switch (t) {
    case ValueType::U8:
      return r.read<uint8_t>("u8 value");
    case ValueType::I8:
      return r.read<int8_t>("i8 value");
    case ValueType::U16:
      return r.read<uint16_t>("u16 value");
    case ValueType::I16:
      return r.read<int16_t>("i16 value");
    case ValueType::U32:
      return r.read<uint32_t>("u32 value");
    case ValueType::I32:
      return r.read<int32_t>("i32 value");
    case ValueType::I64:
      return r.read<int64_t>("i64 value");
    case ValueType::U64: {
      const uint64_t at = r.pos();
      const auto v = r.read<uint64_t>("u64 value");
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        r.fail(fmt::format("u64 array element {} at offset {} does not fit in int64", v, at));
      }
      return static_cast<int64_t>(v);
    }
    case ValueType::BOOL: {
      const uint64_t at = r.pos();
      const auto v = r.read<uint8_t>("bool value");
      if (v > 1) r.fail(fmt::format("invalid bool value {} at offset {}", v, at));
      return v;
    }
    default:
      r.fail(fmt::format("internal error: {} is not an integer type", value_type_name(t)));
  }
}

double read_float_elem(Reader& r, ValueType t) {
  if (t == ValueType::F32) return r.read<float>("f32 value");
  return r.read<double>("f64 value");
}

Value read_value(Reader& r, ValueType t, int depth);

Value::Array read_array(Reader& r, int depth) {
  if (depth > kMaxArrayDepth) {
    r.fail(fmt::format("arrays nested more than {} deep at offset {}", kMaxArrayDepth, r.pos()));
  }
  Value::Array a;
  a.elem = read_value_type(r, "array element type");
  const uint64_t at = r.pos();
  const auto count = r.read<uint64_t>("array length");
  const uint64_t min_bytes = min_encoded_bytes(a.elem);
  // Checked before reserving anything: a corrupt count must not become a giant allocation.
  if (count > r.remaining() / min_bytes) {
    r.fail(
        fmt::format("truncated or corrupt file: array of {} {} elements at offset {} cannot "
                    "fit in the {} bytes that remain",
                    count, value_type_name(a.elem), at, r.remaining()));
  }
  const auto n = static_cast<size_t>(count);
  const size_t reserve = std::min(n, kMaxReserve);
  if (a.elem == ValueType::STRING) {
    a.strings.reserve(reserve);
    for (size_t i = 0; i < n; ++i) a.strings.push_back(r.read_string("array string"));
  } else if (a.elem == ValueType::ARRAY) {
    a.nested.reserve(reserve);
    for (size_t i = 0; i < n; ++i) a.nested.push_back(read_value(r, ValueType::ARRAY, depth + 1));
  } else if (is_float_type(a.elem)) {
    a.floats.reserve(reserve);
    for (size_t i = 0; i < n; ++i) a.floats.push_back(read_float_elem(r, a.elem));
  } else {
    a.ints.reserve(reserve);
    for (size_t i = 0; i < n; ++i) a.ints.push_back(read_int_elem(r, a.elem));
  }
  return a;
}

Value read_value(Reader& r, ValueType t, int depth) {
  switch (t) {
    case ValueType::STRING:
      return Value(t, r.read_string("string value"));
    case ValueType::ARRAY:
      return Value(t, read_array(r, depth));
    case ValueType::F32:
    case ValueType::F64:
      return Value(t, read_float_elem(r, t));
    case ValueType::BOOL:
      return Value(t, read_int_elem(r, t) != 0);
    case ValueType::U64:
      return Value(t, r.read<uint64_t>("u64 value"));
    default:
      return Value(t, read_int_elem(r, t));
  }
}

// a * b or nullopt on overflow of int64.
std::optional<int64_t> checked_mul(int64_t a, int64_t b) {
  int64_t out;
  if (__builtin_mul_overflow(a, b, &out)) return std::nullopt;
  return out;
}

}  // namespace

// ---- Value --------------------------------------------------------------------------------

std::string_view value_type_name(ValueType t) {
  static constexpr std::array<std::string_view, kNumValueTypes> kNames = {
      "u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
      "bool", "string", "array", "u64", "i64", "f64"};
  const auto i = static_cast<uint32_t>(t);
  return i < kNames.size() ? kNames[i] : std::string_view("unknown");
}

size_t Value::Array::size() const {
  if (elem == ValueType::STRING) return strings.size();
  if (elem == ValueType::ARRAY) return nested.size();
  if (is_float_type(elem)) return floats.size();
  return ints.size();
}

bool Value::is_integer() const { return is_integer_type(type_); }
bool Value::is_float() const { return is_float_type(type_); }

namespace {
[[noreturn]] void value_type_error(ValueType actual, const Value::Array* array,
                                   std::string_view expected) {
  LLMK_FAIL("metadata value is {}, expected {}", describe(actual, array), expected);
}
}  // namespace

namespace {
// The variant member a value of type `t` holds; a Value built with contents that do not match
// its type is reported rather than left to std::bad_variant_access.
template <typename T, typename V>
const T& held(const V& v, ValueType t) {
  const T* p = std::get_if<T>(&v);
  LLMK_CHECK(p != nullptr, "malformed metadata value: its contents do not match its type {}",
             value_type_name(t));
  return *p;
}
}  // namespace

int64_t Value::as_int() const {
  if (!is_integer()) value_type_error(type_, std::get_if<Array>(&v_), "an integer");
  if (const auto* u = std::get_if<uint64_t>(&v_)) {
    LLMK_CHECK(*u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
               "metadata value {} (u64) does not fit in int64", *u);
    return static_cast<int64_t>(*u);
  }
  return held<int64_t>(v_, type_);
}

double Value::as_float() const {
  if (is_float()) return held<double>(v_, type_);
  if (const auto* u = std::get_if<uint64_t>(&v_); u != nullptr && is_integer()) {
    return static_cast<double>(*u);
  }
  if (is_integer()) return static_cast<double>(held<int64_t>(v_, type_));
  value_type_error(type_, std::get_if<Array>(&v_), "a float");
}

bool Value::as_bool() const {
  if (type_ != ValueType::BOOL) value_type_error(type_, std::get_if<Array>(&v_), "a bool");
  return held<bool>(v_, type_);
}

const std::string& Value::as_string() const {
  if (type_ != ValueType::STRING) value_type_error(type_, std::get_if<Array>(&v_), "a string");
  return held<std::string>(v_, type_);
}

const Value::Array& Value::as_array() const {
  if (type_ != ValueType::ARRAY) value_type_error(type_, nullptr, "an array");
  return held<Array>(v_, type_);
}

std::string Value::to_string(size_t max_array_items) const {
  switch (type_) {
    case ValueType::STRING:  // from the file: escaped and cut, as the strings of an array
      return printable(as_string());
    case ValueType::BOOL:
      return as_bool() ? "true" : "false";
    case ValueType::F32:
    case ValueType::F64:
      return format_float(as_float(), type_);
    case ValueType::ARRAY:
      break;
    default:
      if (const auto* u = std::get_if<uint64_t>(&v_)) return fmt::format("{}", *u);
      return fmt::format("{}", held<int64_t>(v_, type_));
  }
  // "[1, 2, 3, ...] (49152 x i32)": the first items and the count.
  const Array& a = as_array();
  const size_t n = a.size();
  const size_t shown = std::min(n, max_array_items);
  std::string out = "[";
  for (size_t i = 0; i < shown; ++i) {
    if (i > 0) out += ", ";
    if (a.elem == ValueType::STRING) {
      out += '"' + printable(a.strings[i]) + '"';
    } else if (a.elem == ValueType::ARRAY) {
      out += a.nested[i].to_string(max_array_items);
    } else if (is_float_type(a.elem)) {
      out += format_float(a.floats[i], a.elem);
    } else if (a.elem == ValueType::BOOL) {
      out += a.ints[i] != 0 ? "true" : "false";
    } else {
      out += fmt::format("{}", a.ints[i]);
    }
  }
  if (shown < n) out += shown > 0 ? ", ..." : "...";
  out += fmt::format("] ({} x {})", n, value_type_name(a.elem));
  return out;
}

// ---- ggml types ---------------------------------------------------------------------------

DType dtype_from_ggml(uint32_t ggml_type) {
  const GgmlType* t = find_ggml_type(ggml_type);
  LLMK_CHECK(t != nullptr, "unknown ggml tensor type {}", ggml_type);
  LLMK_CHECK(t->dtype.has_value(), "ggml tensor type {} ({}) is not supported by llmk", t->name,
             ggml_type);
  return *t->dtype;
}

std::string_view ggml_type_name(uint32_t ggml_type) {
  const GgmlType* t = find_ggml_type(ggml_type);
  if (t != nullptr) return t->name;
  // Interned so that the view stays valid; ids are u32 but only a corrupt file produces many.
  static std::mutex mu;
  static std::map<uint32_t, std::string> names;
  std::lock_guard<std::mutex> lock(mu);
  auto [it, inserted] = names.try_emplace(ggml_type);
  if (inserted) it->second = fmt::format("unknown({})", ggml_type);
  return it->second;
}

// ---- File ---------------------------------------------------------------------------------

namespace {

// Everything File::open learns; File::State (private to File) is this under another name.
struct Contents {
  std::string path;
  uint32_t version = 0;
  uint64_t file_size = 0;
  uint64_t alignment = kDefaultAlignment;
  uint64_t data_offset = 0;
  std::shared_ptr<Mapping> mapping;
  std::vector<std::pair<std::string, Value>> metadata;
  std::map<std::string, size_t, std::less<>> metadata_index;
  std::vector<TensorInfo> tensors;
  std::map<std::string, size_t, std::less<>> tensor_index;
};

}  // namespace

struct File::State : Contents {};

namespace {

void check_magic_and_version(Reader& r, const std::string& path, uint32_t* version) {
  std::array<uint8_t, 4> magic{};
  for (auto& b : magic) b = r.read<uint8_t>("magic");
  if (std::memcmp(magic.data(), "GGUF", 4) != 0) {
    const std::string shown =
        printable(std::string_view(reinterpret_cast<const char*>(magic.data()), magic.size()));
    std::string hint;
    if (std::memcmp(magic.data(), "vers", 4) == 0) hint = "; this looks like a Git LFS pointer";
    if (magic[0] == '<') hint = "; this looks like an HTML page, not a model";
    LLMK_FAIL("{}: not a GGUF file: bad magic '{}' (expected 'GGUF'){}", path, shown, hint);
  }
  const auto v = r.read<uint32_t>("version");
  if (v != 0 && (v & 0xffffu) == 0 && __builtin_bswap32(v) <= 3) {
    LLMK_FAIL(
        "{}: big-endian GGUF file (version field reads 0x{:08x}); only little-endian files "
        "are supported",
        path, v);
  }
  if (v == 1) {
    LLMK_FAIL("{}: GGUF version 1 is not supported (only versions 2 and 3); re-convert the model",
              path);
  }
  if (v < 2 || v > 3) {
    LLMK_FAIL("{}: unsupported GGUF version {} (only versions 2 and 3)", path, v);
  }
  *version = v;
}

void read_metadata(Reader& r, uint64_t kv_count, Contents& s) {
  s.metadata.reserve(std::min(static_cast<size_t>(kv_count), kMaxReserve));
  for (uint64_t i = 0; i < kv_count; ++i) {
    r.set_context(fmt::format("metadata entry {} of {}", i, kv_count));
    std::string key = r.read_string("key");
    r.set_context(fmt::format("metadata entry {} of {} ('{}')", i, kv_count, printable(key)));
    if (key.empty()) r.fail("empty metadata key");
    const ValueType t = read_value_type(r, "value type");
    Value v = read_value(r, t, 0);
    auto [it, inserted] = s.metadata_index.try_emplace(key, s.metadata.size());
    if (!inserted) {
      r.set_context("");
      r.fail(fmt::format("duplicate metadata key '{}' (entries {} and {})", printable(key),
                         it->second, i));
    }
    s.metadata.emplace_back(std::move(key), std::move(v));
  }
  r.set_context("");
}

uint64_t read_alignment(const Contents& s) {
  const auto it = s.metadata_index.find("general.alignment");
  if (it == s.metadata_index.end()) return kDefaultAlignment;
  const Value& v = s.metadata[it->second].second;
  LLMK_CHECK(v.is_integer(), "{}: metadata key 'general.alignment' is {}, expected an integer",
             s.path, describe(v.type(), v.is_array() ? &v.as_array() : nullptr));
  int64_t align = -1;
  try {
    align = v.as_int();
  } catch (const Error&) {  // a u64 above INT64_MAX: reported below
  }
  LLMK_CHECK(align > 0 && (align & (align - 1)) == 0,
             "{}: general.alignment is {}, must be a power of two", s.path, v.to_string());
  return static_cast<uint64_t>(align);
}

TensorInfo read_tensor_info(Reader& r, uint64_t i, uint64_t count) {
  TensorInfo t;
  r.set_context(fmt::format("tensor info {} of {}", i, count));
  t.name = r.read_string("tensor name");
  const std::string name = printable(t.name);
  r.set_context(fmt::format("tensor info {} of {} ('{}')", i, count, name));
  if (t.name.empty()) r.fail("empty tensor name");
  const auto n_dims = r.read<uint32_t>("n_dims");
  if (n_dims == 0 || n_dims > kMaxDims) {
    r.fail(fmt::format("tensor '{}' has {} dimensions (must be 1 to {})", name, n_dims, kMaxDims));
  }
  std::vector<int64_t> ne(n_dims);
  int64_t numel = 1;
  for (uint32_t d = 0; d < n_dims; ++d) {
    const auto v = r.read<uint64_t>("dimension");
    if (v == 0 || v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      r.fail(fmt::format("tensor '{}' has invalid dimension {} = {}", name, d, v));
    }
    ne[d] = static_cast<int64_t>(v);
    const auto prod = checked_mul(numel, ne[d]);
    if (!prod) r.fail(fmt::format("tensor '{}' has too many elements (overflow)", name));
    numel = *prod;
  }
  t.shape.assign(ne.rbegin(), ne.rend());
  t.ggml_type = r.read<uint32_t>("tensor type");
  const GgmlType* gt = find_ggml_type(t.ggml_type);
  if (gt == nullptr) {
    r.fail(fmt::format("tensor '{}' has unknown ggml type {}", name, t.ggml_type));
  }
  if (!gt->dtype) {
    r.fail(fmt::format("tensor '{}' has type {} (ggml type {}), which llmk does not support", name,
                       gt->name, t.ggml_type));
  }
  t.dtype = *gt->dtype;
  t.offset = r.read<uint64_t>("tensor data offset");
  const DTypeInfo& info = dtype_info(t.dtype);
  if (ne[0] % info.block_size != 0) {
    r.fail(
        fmt::format("tensor '{}' of type {} has rows of {} elements, not a multiple of its "
                    "block size {}",
                    name, gt->name, ne[0], info.block_size));
  }
  if (!checked_mul(numel / info.block_size, info.block_bytes)) {
    r.fail(fmt::format("tensor '{}' is too large (byte size overflows)", name));
  }
  t.nbytes = static_cast<uint64_t>(bytes_for(t.dtype, numel));
  return t;
}

// Offsets aligned, data inside the file, no two tensors sharing bytes.
void check_tensor_data(const Contents& s) {
  const uint64_t data_bytes = s.file_size - s.data_offset;
  for (const TensorInfo& t : s.tensors) {
    LLMK_CHECK(t.offset % s.alignment == 0,
               "{}: tensor '{}' data offset {} is not a multiple of the alignment {}", s.path,
               printable(t.name), t.offset, s.alignment);
    LLMK_CHECK(t.offset <= data_bytes && t.nbytes <= data_bytes - t.offset,
               "{}: tensor '{}' data extends past the end of the file (truncated download?): "
               "offset {} + {} bytes in the data section starting at {}, file size {}",
               s.path, printable(t.name), t.offset, t.nbytes, s.data_offset, s.file_size);
  }
  std::vector<const TensorInfo*> by_offset;
  by_offset.reserve(s.tensors.size());
  for (const TensorInfo& t : s.tensors) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const TensorInfo& a = *by_offset[i - 1];
    const TensorInfo& b = *by_offset[i];
    LLMK_CHECK(a.offset + a.nbytes <= b.offset,
               "{}: tensor data overlaps: '{}' at offset {} ({} bytes) and '{}' at offset {}",
               s.path, printable(a.name), a.offset, a.nbytes, printable(b.name), b.offset);
  }
}

void parse(const std::string& path, Contents* s) {
  s->path = path;
  s->mapping = map_gguf(path);
  s->file_size = s->mapping->size;
  Reader r(s->path, s->mapping->data, s->file_size);

  check_magic_and_version(r, path, &s->version);
  const auto tensor_count = r.read<uint64_t>("tensor count");
  const auto kv_count = r.read<uint64_t>("metadata count");
  // Every entry takes some bytes; counts that cannot fit are corrupt, and are caught here
  // before they size any allocation.
  const uint64_t rest = r.remaining();
  if (kv_count > rest / kMinKvBytes ||
      tensor_count > (rest - kv_count * kMinKvBytes) / kMinTensorInfoBytes) {
    LLMK_FAIL(
        "{}: truncated or corrupt header: {} tensors and {} metadata entries cannot fit in "
        "the {} bytes that follow the header",
        path, tensor_count, kv_count, rest);
  }

  read_metadata(r, kv_count, *s);
  s->alignment = read_alignment(*s);

  if (tensor_count > r.remaining() / kMinTensorInfoBytes) {
    LLMK_FAIL(
        "{}: truncated or corrupt file: {} tensor infos cannot fit in the {} bytes after "
        "the metadata (offset {})",
        path, tensor_count, r.remaining(), r.pos());
  }
  s->tensors.reserve(std::min(static_cast<size_t>(tensor_count), kMaxReserve));
  for (uint64_t i = 0; i < tensor_count; ++i) {
    TensorInfo t = read_tensor_info(r, i, tensor_count);
    auto [it, inserted] = s->tensor_index.try_emplace(t.name, s->tensors.size());
    if (!inserted) {
      LLMK_FAIL("{}: duplicate tensor name '{}' (tensor infos {} and {})", path, printable(t.name),
                it->second, i);
    }
    s->tensors.push_back(std::move(t));
  }
  r.set_context("");

  // The data section starts at the next multiple of the alignment.
  const uint64_t end_of_infos = r.pos();
  const uint64_t pad = (s->alignment - end_of_infos % s->alignment) % s->alignment;
  if (pad > s->file_size - end_of_infos) {
    // Only a file with tensors needs its data section; an empty one may end unpadded.
    LLMK_CHECK(s->tensors.empty(),
               "{}: truncated file: the tensor data section should start at offset {} but the "
               "file is only {} bytes",
               path, end_of_infos + pad, s->file_size);
    s->data_offset = s->file_size;
  } else {
    s->data_offset = end_of_infos + pad;
  }
  check_tensor_data(*s);
}

}  // namespace

File File::open(const std::string& path) {
  auto s = std::make_shared<State>();
  parse(path, s.get());
  File f;
  f.s_ = std::move(s);
  return f;
}

const std::string& File::path() const { return s_->path; }
uint32_t File::version() const { return s_->version; }
uint64_t File::file_size() const { return s_->file_size; }
uint64_t File::alignment() const { return s_->alignment; }

const std::vector<std::pair<std::string, Value>>& File::metadata() const { return s_->metadata; }

const Value* File::find(std::string_view key) const {
  const auto it = s_->metadata_index.find(key);
  return it == s_->metadata_index.end() ? nullptr : &s_->metadata[it->second].second;
}

const Value& File::get(std::string_view key) const {
  const Value* v = find(key);
  LLMK_CHECK(v != nullptr, "{}: missing metadata key '{}'", s_->path, key);
  return *v;
}

namespace {
[[noreturn]] void key_type_error(const std::string& path, std::string_view key, const Value& v,
                                 std::string_view expected) {
  LLMK_FAIL("{}: metadata key '{}' is {}, expected {}", path, key,
            describe(v.type(), v.is_array() ? &v.as_array() : nullptr), expected);
}
}  // namespace

int64_t File::get_int(std::string_view key) const {
  const Value& v = get(key);
  if (!v.is_integer()) key_type_error(s_->path, key, v, "an integer");
  try {
    return v.as_int();
  } catch (const Error& e) {
    LLMK_FAIL("{}: metadata key '{}': {}", s_->path, key, e.what());
  }
}

int64_t File::get_int(std::string_view key, int64_t fallback) const {
  return find(key) != nullptr ? get_int(key) : fallback;
}

double File::get_float(std::string_view key) const {
  const Value& v = get(key);
  if (!v.is_float() && !v.is_integer()) key_type_error(s_->path, key, v, "a float");
  return v.as_float();
}

double File::get_float(std::string_view key, double fallback) const {
  return find(key) != nullptr ? get_float(key) : fallback;
}

std::string File::get_string(std::string_view key) const {
  const Value& v = get(key);
  if (v.type() != ValueType::STRING) key_type_error(s_->path, key, v, "a string");
  return v.as_string();
}

std::string File::get_string(std::string_view key, std::string_view fallback) const {
  return find(key) != nullptr ? get_string(key) : std::string(fallback);
}

bool File::get_bool(std::string_view key) const {
  const Value& v = get(key);
  if (v.type() != ValueType::BOOL) key_type_error(s_->path, key, v, "a bool");
  return v.as_bool();
}

bool File::get_bool(std::string_view key, bool fallback) const {
  return find(key) != nullptr ? get_bool(key) : fallback;
}

const std::vector<TensorInfo>& File::tensors() const { return s_->tensors; }

const TensorInfo* File::find_tensor(std::string_view name) const {
  const auto it = s_->tensor_index.find(name);
  return it == s_->tensor_index.end() ? nullptr : &s_->tensors[it->second];
}

const TensorInfo& File::tensor_info(std::string_view name) const {
  const TensorInfo* t = find_tensor(name);
  LLMK_CHECK(t != nullptr, "{}: missing tensor '{}'", s_->path, name);
  return *t;
}

Tensor File::tensor(std::string_view name) const {
  const TensorInfo& t = tensor_info(name);
  // The mapping is read-only: writing through the view faults. Callers copy to modify.
  auto* data = const_cast<uint8_t*>(s_->mapping->data + s_->data_offset + t.offset);
  return Tensor::borrow(data, t.shape, t.dtype, Device::CPU, s_->mapping);
}

}  // namespace llmk::gguf
