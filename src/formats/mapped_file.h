// Opening model files: a whole regular file mapped read-only, or read into memory. Shared by the
// GGUF, safetensors and config.json readers; every failure names the path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace llmk::formats {

struct MappedFile {
  const uint8_t* data = nullptr;  // nullptr for an empty file
  size_t size = 0;
  MappedFile() = default;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();
};

// Maps `path`, which must be a regular file: a FIFO or a folder is rejected without blocking.
// Throws llmk::Error "<path>: cannot open: <reason>", "<path>: not a regular file", ...
std::shared_ptr<MappedFile> map_file(const std::string& path);

// The bytes of `path` (a regular file of at most max_bytes).
std::string read_file(const std::string& path, size_t max_bytes);

std::string errno_message(int err);

}  // namespace llmk::formats
