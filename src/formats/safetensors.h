// safetensors reader over a read-only mmap of the file, and a Hugging Face model folder (one
// model.safetensors, or shards listed by model.safetensors.index.json).
//
// Layout: u64 little-endian header size N, then N bytes of JSON, then the data section. The
// JSON is an object mapping each tensor name to {"dtype": "BF16", "shape": [rows, cols],
// "data_offsets": [begin, end]} (byte offsets relative to the start of the data section,
// end exclusive), plus an optional "__metadata__" object of string values. Every field, size
// and offset is validated before use; a bad file gives llmk::Error naming the path and the
// problem.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"

namespace llmk::safetensors {

// Header sizes above this are rejected as corrupt (the reference implementation's limit).
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct TensorInfo {
  std::string name;
  Shape shape;  // row-major, outermost first, as in the file; {} for a 0-d tensor
  DType dtype = DType::F32;
  uint64_t offset = 0;  // from the start of the data section
  uint64_t nbytes = 0;
};

// Maps a safetensors dtype name ("F32", "F16", "BF16", "I8", "I32") to llmk's DType. Throws
// llmk::Error for names llmk does not read, saying whether the name is a known safetensors
// dtype ("unsupported dtype F64") or not one at all ("unknown dtype 'X'").
DType dtype_from_name(std::string_view name);

class File {
 public:
  // Opens and validates the header. Throws llmk::Error naming the path and the problem:
  // unreadable, too small, header size past the end of the file or absurd, malformed JSON,
  // missing or ill-typed fields, unknown or unsupported dtype, negative dimensions, a byte
  // range that does not match the shape and dtype, data past the end of the file, overlapping
  // tensors, duplicate names.
  static File open(const std::string& path);

  const std::string& path() const;
  uint64_t file_size() const;
  uint64_t data_offset() const;  // 8 + N: where the data section starts in the file

  const std::vector<TensorInfo>& tensors() const;              // in header order
  std::vector<std::string> names() const;                      // in header order
  const TensorInfo* find(std::string_view name) const;         // nullptr if absent
  const TensorInfo& tensor_info(std::string_view name) const;  // throws naming path and tensor
  // A borrowed CPU view of the tensor's bytes in the mapping; it keeps the mapping alive after
  // the File is gone. The mapping is read-only: copy before writing. When the file places the
  // data at an address not aligned for the element type (legal in safetensors, never done by
  // the reference writer), an owning aligned copy is returned instead.
  Tensor tensor(std::string_view name) const;

  const std::map<std::string, std::string, std::less<>>& metadata() const;  // "__metadata__"

 private:
  struct State;
  std::shared_ptr<const State> s_;
};

// A Hugging Face model folder. With model.safetensors.index.json, its "weight_map" (tensor
// name -> shard file name) is authoritative: every listed tensor must be in its shard, no
// tensor may sit in two shards, and tensors a shard holds beyond the index are not exposed.
// Without the index, the folder's model.safetensors is the model.
class Folder {
 public:
  // `path` is the folder, or an index file, or a single .safetensors file. Throws llmk::Error
  // naming the folder (or index) and what is wrong: neither model.safetensors.index.json nor
  // model.safetensors present, a malformed index, a missing shard, a tensor absent from its
  // shard or listed twice, and any error of File::open on a shard.
  static Folder open(const std::string& path);

  const std::string& path() const;          // the folder
  const std::string& index_path() const;    // "" when the folder has a single file
  const std::vector<File>& shards() const;  // sorted by file name

  // Tensor names: by shard, then in header order within a shard.
  const std::vector<std::string>& names() const;
  const TensorInfo* find(std::string_view name) const;  // nullptr if absent
  const TensorInfo& tensor_info(std::string_view name) const;
  const File& shard_of(std::string_view name) const;  // throws for an unknown name
  Tensor tensor(std::string_view name) const;

 private:
  struct State;
  std::shared_ptr<const State> s_;
};

}  // namespace llmk::safetensors
