// The header of a parsed GGUF file written out again (the real models the tests read come from
// test::model_path in test_paths.h).
#pragma once

#include <vector>

#include "formats/gguf.h"
#include "gguf_writer.h"

namespace llmk::gguf::testkit {

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
