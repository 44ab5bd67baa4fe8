// Writing a safetensors file whose tensors arrive in pieces: the header (names, dtypes, shapes,
// offsets, "__metadata__") is written first, so every shape must be known up front; then any
// byte range of any tensor may be written, in any order, with pwrite. Used to stream results
// too large to hold in memory (llmk teacher-topk). The layout is the reference writer's: the
// header padded with spaces to a multiple of 8 bytes, then the tensors back to back in the order
// given (no gaps, as readers require: list wider elements first to keep every tensor aligned).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace llmk::safetensors {

struct OutTensor {
  std::string name;
  std::string dtype;  // a safetensors dtype name: "F32", "I32", "I64", "BF16", ...
  size_t elem_size = 0;
  std::vector<int64_t> shape;
};

class Writer {
 public:
  // Creates (or replaces) `path` with the header and room for every tensor. Throws llmk::Error
  // "<path>: cannot write: <reason>" when the file cannot be created or sized.
  Writer(const std::string& path, std::vector<OutTensor> tensors,
         const std::map<std::string, std::string>& metadata);
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;
  ~Writer();  // closes without the checks of close(): call close() to know the file is whole

  // Writes `bytes` at byte `offset` of tensor `index` (its order in the constructor's list).
  // The range must lie within the tensor (checked).
  void write(size_t index, uint64_t offset, std::string_view bytes);
  // Closes the file; throws "<path>: cannot write: <reason>" when that fails (a full disk).
  void close();

 private:
  std::string path_;
  std::vector<OutTensor> tensors_;
  std::vector<uint64_t> begin_, size_;  // each tensor's bytes, from the start of the file
  int fd_ = -1;
};

}  // namespace llmk::safetensors
