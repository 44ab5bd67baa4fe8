// A small GGUF writer for tests: builds v2/v3 files with chosen metadata and tensors, and lets a
// test break any field (counts, magic, version, raw value bytes, dims, types, offsets) to check
// that the reader rejects it. Values are encoded by the library's writer (formats/gguf_write.h);
// the rest of the layout is written here, field by field, so that any field can be broken.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "formats/gguf.h"
#include "formats/gguf_write.h"

namespace llmk::gguf::testkit {

// ---- Value builders -------------------------------------------------------------------------

inline Value int_value(ValueType t, int64_t v) { return Value(t, v); }
inline Value u64_value(uint64_t v) { return Value(ValueType::U64, v); }
inline Value float_value(ValueType t, double v) { return Value(t, v); }
inline Value bool_value(bool v) { return Value(ValueType::BOOL, v); }
inline Value string_value(std::string s) { return Value(ValueType::STRING, std::move(s)); }

inline Value int_array(ValueType elem, std::vector<int64_t> v) {
  Value::Array a;
  a.elem = elem;
  a.ints = std::move(v);
  return Value(ValueType::ARRAY, std::move(a));
}
inline Value float_array(ValueType elem, std::vector<double> v) {
  Value::Array a;
  a.elem = elem;
  a.floats = std::move(v);
  return Value(ValueType::ARRAY, std::move(a));
}
inline Value string_array(std::vector<std::string> v) {
  Value::Array a;
  a.elem = ValueType::STRING;
  a.strings = std::move(v);
  return Value(ValueType::ARRAY, std::move(a));
}
inline Value nested_array(std::vector<Value> v) {
  Value::Array a;
  a.elem = ValueType::ARRAY;
  a.nested = std::move(v);
  return Value(ValueType::ARRAY, std::move(a));
}

// ---- bytes ----------------------------------------------------------------------------------

class Bytes {
 public:
  std::vector<uint8_t> buf;

  template <typename T>
  Bytes& put(T v) {
    const size_t at = buf.size();
    buf.resize(at + sizeof(T));
    std::memcpy(buf.data() + at, &v, sizeof(T));
    return *this;
  }
  Bytes& u8(uint8_t v) { return put(v); }
  Bytes& u32(uint32_t v) { return put(v); }
  Bytes& u64(uint64_t v) { return put(v); }
  Bytes& str(std::string_view s) {
    u64(s.size());
    buf.insert(buf.end(), s.begin(), s.end());
    return *this;
  }
  Bytes& raw(const std::vector<uint8_t>& b) {
    buf.insert(buf.end(), b.begin(), b.end());
    return *this;
  }

  // The value's payload (no type tag): the encoding of llmk's own writer (formats/gguf_write.h),
  // so that the files these tests build and the files `llmk quantize` writes agree.
  Bytes& value_payload(const Value& v) {
    append_value(buf, v);
    return *this;
  }
};

// ---- the file -------------------------------------------------------------------------------

struct TensorSpec {
  std::string name;
  std::vector<uint64_t> ne;  // GGUF order: ne[0] is the innermost (contiguous) dimension
  uint32_t ggml_type = 0;
  std::vector<uint8_t> data;       // written at the tensor's offset in the data section
  std::optional<uint64_t> offset;  // default: the next aligned spot after the previous tensor
};

struct Layout {
  std::vector<uint8_t> bytes;  // the whole file
  uint64_t data_offset = 0;    // start of the data section
  uint64_t tensor_infos_offset = 0;
  std::vector<uint64_t> tensor_offsets;  // relative to data_offset
};

class GgufBuilder {
 public:
  std::string magic = "GGUF";
  uint32_t version = 3;
  uint64_t alignment = 32;  // layout only; add "general.alignment" yourself to change the reader's
  std::optional<uint64_t> tensor_count_override, kv_count_override;
  bool pad_data_section = true;  // false: no padding after the tensor infos when there is no data
  bool header_only = false;      // stop at the start of the data section

  GgufBuilder& kv(std::string key, Value v) {
    kvs_.push_back({std::move(key), std::move(v), {}});
    return *this;
  }
  // An entry whose type tag and payload are the given raw bytes.
  GgufBuilder& raw_kv(std::string key, std::vector<uint8_t> type_and_payload) {
    kvs_.push_back({std::move(key), Value(), std::move(type_and_payload)});
    return *this;
  }
  GgufBuilder& tensor(TensorSpec t) {
    tensors_.push_back(std::move(t));
    return *this;
  }
  // A tensor filled with a byte pattern of exactly the size its type and shape need.
  GgufBuilder& tensor(std::string name, std::vector<uint64_t> ne, uint32_t ggml_type,
                      uint64_t nbytes, uint8_t seed = 1) {
    TensorSpec t{std::move(name), std::move(ne), ggml_type, {}, std::nullopt};
    t.data.resize(nbytes);
    for (size_t i = 0; i < nbytes; ++i) t.data[i] = static_cast<uint8_t>(seed + i * 7);
    return tensor(std::move(t));
  }

  Layout build() const {
    Layout out;
    Bytes b;
    b.buf.insert(b.buf.end(), magic.begin(), magic.end());
    b.u32(version);
    b.u64(tensor_count_override.value_or(tensors_.size()));
    b.u64(kv_count_override.value_or(kvs_.size()));
    for (const Kv& e : kvs_) {
      b.str(e.key);
      if (!e.raw.empty()) {
        b.raw(e.raw);
      } else {
        b.u32(static_cast<uint32_t>(e.value.type()));
        b.value_payload(e.value);
      }
    }
    out.tensor_infos_offset = b.buf.size();
    uint64_t next = 0, data_end = 0;
    for (const TensorSpec& t : tensors_) {
      const uint64_t off = t.offset.value_or(align_up(next));
      out.tensor_offsets.push_back(off);
      next = std::max(next, off + t.data.size());
      if (!t.data.empty()) data_end = std::max(data_end, off + t.data.size());
      b.str(t.name);
      b.u32(static_cast<uint32_t>(t.ne.size()));
      for (uint64_t d : t.ne) b.u64(d);
      b.u32(t.ggml_type);
      b.u64(off);
    }
    out.data_offset = align_up(b.buf.size());
    if (tensors_.empty() && !pad_data_section) out.data_offset = b.buf.size();
    std::vector<uint8_t> data(header_only ? 0 : data_end, 0);
    for (size_t i = 0; !header_only && i < tensors_.size(); ++i) {
      const auto& d = tensors_[i].data;
      if (d.empty()) continue;  // its offset may point anywhere
      std::copy(d.begin(), d.end(), data.begin() + static_cast<ptrdiff_t>(out.tensor_offsets[i]));
    }
    b.buf.resize(out.data_offset, 0);
    if (!header_only) b.raw(data);
    out.bytes = std::move(b.buf);
    return out;
  }

 private:
  struct Kv {
    std::string key;
    Value value;
    std::vector<uint8_t> raw;
  };
  uint64_t align_up(uint64_t x) const { return (x + alignment - 1) / alignment * alignment; }

  std::vector<Kv> kvs_;
  std::vector<TensorSpec> tensors_;
};

}  // namespace llmk::gguf::testkit
