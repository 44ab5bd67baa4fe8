// GGUF reader: the input is a whole .gguf file. What opens must be usable: every metadata value
// prints, every tensor view lies inside the file (its first and last byte are read), and the
// model config reads or fails with llmk::Error.
#include "formats/gguf.h"

#include <cstddef>
#include <cstdint>

#include "fuzz_util.h"
#include "model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = llmk::fuzz::write_scratch("input.gguf", data, size);
  llmk::fuzz::expect_llmk_errors([&] {
    const llmk::gguf::File f = llmk::gguf::File::open(path);
    for (const auto& [key, value] : f.metadata()) (void)value.to_string();
    llmk::fuzz::check_tensor_views(f);
    (void)llmk::ModelConfig::from_gguf(f);
  });
  return 0;
}
