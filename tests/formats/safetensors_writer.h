// A small safetensors writer for tests: builds files from tensors given as values or raw bytes,
// and assembles files from a raw header text so that a test can break any field.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace llmk::safetensors::testkit {

// The u64 little-endian header size (the text's length unless overridden), the header text,
// then the data section.
inline std::vector<uint8_t> assemble(std::string_view header, const std::vector<uint8_t>& data,
                                     std::optional<uint64_t> header_size = std::nullopt) {
  const uint64_t n = header_size.value_or(header.size());
  std::vector<uint8_t> out(8 + header.size() + data.size());
  std::memcpy(out.data(), &n, 8);
  std::copy(header.begin(), header.end(), out.begin() + 8);
  std::copy(data.begin(), data.end(), out.begin() + 8 + static_cast<ptrdiff_t>(header.size()));
  return out;
}

template <typename T>
std::vector<uint8_t> bytes_of(const std::vector<T>& v) {
  std::vector<uint8_t> out(v.size() * sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), v.data(), out.size());
  return out;
}

class SafetensorsBuilder {
 public:
  // Tensors are laid out back to back in the order they are added.
  SafetensorsBuilder& tensor(std::string name, std::string dtype, Shape shape,
                             std::vector<uint8_t> data) {
    tensors_.push_back({std::move(name), std::move(dtype), std::move(shape), std::move(data)});
    return *this;
  }
  template <typename T>
  SafetensorsBuilder& values(std::string name, std::string dtype, Shape shape,
                             const std::vector<T>& v) {
    return tensor(std::move(name), std::move(dtype), std::move(shape), bytes_of(v));
  }
  SafetensorsBuilder& metadata(std::string key, std::string value) {
    metadata_.emplace_back(std::move(key), std::move(value));
    return *this;
  }
  // The header is padded with spaces so that the data section starts at a multiple of
  // `align` bytes from the start of the file (8 as the reference writer does; 1 for none).
  SafetensorsBuilder& align(size_t a) {
    align_ = a;
    return *this;
  }

  std::string header() const {
    nlohmann::ordered_json h = nlohmann::ordered_json::object();
    if (!metadata_.empty()) {
      nlohmann::ordered_json m = nlohmann::ordered_json::object();
      for (const auto& [k, v] : metadata_) m[k] = v;
      h["__metadata__"] = m;
    }
    uint64_t at = 0;
    for (const Entry& t : tensors_) {
      h[t.name] = {
          {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {at, at + t.data.size()}}};
      at += t.data.size();
    }
    std::string text = h.dump();
    while ((8 + text.size()) % align_ != 0) text += ' ';
    return text;
  }

  std::vector<uint8_t> data() const {
    std::vector<uint8_t> out;
    for (const Entry& t : tensors_) out.insert(out.end(), t.data.begin(), t.data.end());
    return out;
  }

  std::vector<uint8_t> build() const { return assemble(header(), data()); }

 private:
  struct Entry {
    std::string name;
    std::string dtype;
    Shape shape;
    std::vector<uint8_t> data;
  };
  std::vector<Entry> tensors_;
  std::vector<std::pair<std::string, std::string>> metadata_;
  size_t align_ = 8;
};

}  // namespace llmk::safetensors::testkit
