// Writing GGUF v3 files (`llmk quantize`), in the layout gguf.h reads: the header, the metadata
// and the tensor table, padding to the alignment, then each tensor's bytes at the next multiple
// of the alignment, in the order the tensors were declared. Every size is known before the first
// byte is written, so the tensors are streamed one after another and never held together.
//
// The file is written as "<path>.partial" and renamed to <path> by finish(): a run that fails or
// is interrupted leaves no truncated model under the name a user would load.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "formats/gguf.h"

namespace llmk::gguf {

// Appends the payload of `v` (without its type tag) as GGUF encodes it: integers and floats in
// their own width, strings as u64 length + bytes, arrays as element type, u64 count, elements.
void append_value(std::vector<uint8_t>& out, const Value& v);

// The ggml type id of a DType that GGUF stores (f32, f16, bf16, i8, i32 and the block types);
// throws llmk::Error for the others.
uint32_t ggml_type_of(DType t);

class Writer {
 public:
  Writer() = default;
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;
  ~Writer();  // removes the partial file when finish() was not reached

  // Sets a metadata key: a new key goes last, an existing one keeps its place. Setting
  // "general.alignment" (an integer, a power of two) also sets the layout's alignment.
  void set(const std::string& key, Value v);
  const Value* find(std::string_view key) const;
  // Declares the next tensor: shape row-major ({rows, cols}), rows whole blocks of `dtype`.
  void add_tensor(const std::string& name, const Shape& shape, DType dtype);

  uint64_t alignment() const { return alignment_; }
  // The bytes before the data section: header, metadata, tensor table and padding.
  std::vector<uint8_t> header() const;
  // Bytes of tensor `i` as declared, and of the whole file.
  uint64_t tensor_bytes(size_t i) const { return tensors_.at(i).nbytes; }
  uint64_t file_bytes() const;

  // Creates "<path>.partial" and writes the header. Throws "<path>: cannot write: <reason>".
  void open(const std::string& path);
  // The next declared tensor's bytes, exactly tensor_bytes() of them (several calls may add up
  // to one tensor); its padding follows when it is complete.
  void write(const void* data, uint64_t nbytes);
  // Checks that every tensor was written, flushes, closes and renames the file to its path.
  void finish();

 private:
  struct Info {
    std::string name;
    Shape shape;
    DType dtype;
    uint64_t offset = 0, nbytes = 0;
  };
  void write_bytes(const void* data, uint64_t n);

  uint64_t alignment_ = 32;
  std::vector<std::pair<std::string, Value>> metadata_;
  std::vector<Info> tensors_;
  uint64_t data_bytes_ = 0;  // the data section, padded

  std::string path_, partial_;
  std::FILE* file_ = nullptr;
  size_t next_ = 0;        // the tensor being written
  uint64_t written_ = 0;   // of it
  uint64_t position_ = 0;  // in the data section
};

}  // namespace llmk::gguf
