// The tokenizer of a GGUF file (tokenizer.ggml.* keys): the input is a whole .gguf file. A
// tokenizer that loads must encode and decode a short text that touches special tokens, spaces
// and bytes outside ASCII.
#include <cstddef>
#include <cstdint>

#include "formats/gguf.h"
#include "fuzz_util.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = llmk::fuzz::write_scratch("tokenizer.gguf", data, size);
  llmk::fuzz::expect_llmk_errors([&] {
    const llmk::Tokenizer tok = llmk::Tokenizer::from_gguf(llmk::gguf::File::open(path));
    llmk::fuzz::exercise(tok);
  });
  return 0;
}
