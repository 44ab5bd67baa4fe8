// Hugging Face tokenizer.json: the input is the file (read by Tokenizer::from_hf_json from the
// scratch folder, where no tokenizer_config.json lies beside it). A tokenizer that loads must
// encode and decode a short text that touches special tokens, spaces and bytes outside ASCII.
#include <cstddef>
#include <cstdint>

#include "fuzz_util.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = llmk::fuzz::write_scratch("tokenizer.json", data, size);
  llmk::fuzz::expect_llmk_errors([&] {
    const llmk::Tokenizer tok = llmk::Tokenizer::from_hf_json(path);
    llmk::fuzz::exercise(tok);
  });
  return 0;
}
