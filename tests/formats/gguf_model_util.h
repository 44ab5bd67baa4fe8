// The real model files the GGUF tests read, and the header of a parsed file written out again.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "formats/gguf.h"
#include "gguf_writer.h"

namespace llmk::gguf::testkit {

inline std::string smollm2_path() {
  return std::string(LLMK_SOURCE_DIR) + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}
inline std::string gemma3_path() {
  return std::string(LLMK_SOURCE_DIR) + "/models/gemma-3-270m-q4_k_m.gguf";
}
inline std::string missing_model_message(const std::string& path) {
  return "model file " + path + " is missing: run scripts/fetch-models.sh";
}

// The parsed header written again with the test writer: the header, metadata and tensor table
// up to the start of the data section. For a file the reader understood, these are the file's
// own first bytes.
inline Layout rewrite_header(const File& f) {
  GgufBuilder b;
  b.version = f.version();
  b.alignment = f.alignment();
  b.header_only = true;
  for (const auto& [key, value] : f.metadata()) b.kv(key, value);
  for (const TensorInfo& t : f.tensors()) {
    std::vector<uint64_t> ne(t.shape.rbegin(), t.shape.rend());
    b.tensor(TensorSpec{t.name, ne, t.ggml_type, {}, t.offset});
  }
  return b.build();
}

}  // namespace llmk::gguf::testkit
