// config.json of a Hugging Face model folder: the input is the file's text, read the way
// load_model reads it (HfConfig, then ModelConfig::from_hf, which validates).
#include "formats/hf_config.h"

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz_util.h"
#include "model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  llmk::fuzz::expect_llmk_errors([&] {
    const llmk::ModelConfig c =
        llmk::ModelConfig::from_hf(llmk::HfConfig::parse(text, "config.json"));
    (void)c.summary();
  });
  return 0;
}
