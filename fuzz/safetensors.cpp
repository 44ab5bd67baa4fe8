// safetensors reader: the input is a whole .safetensors file (u64 header size, JSON header,
// data). What opens must be usable: every tensor view lies inside the file (its first and last
// byte are read).
#include "formats/safetensors.h"

#include <cstddef>
#include <cstdint>

#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = llmk::fuzz::write_scratch("input.safetensors", data, size);
  llmk::fuzz::expect_llmk_errors([&] {
    const llmk::safetensors::File f = llmk::safetensors::File::open(path);
    for (const auto& [key, value] : f.metadata()) (void)value.size();
    llmk::fuzz::check_tensor_views(f);
  });
  return 0;
}
