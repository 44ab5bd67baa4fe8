// A Hugging Face model folder: the input is model.safetensors.index.json, beside the two shards
// of tests/fixtures/safetensors/tiny-llama (copied once into the scratch folder). What opens
// must be usable: every listed tensor has its shard and a view inside it.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

#include "formats/safetensors.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  namespace fs = std::filesystem;
  const fs::path src = llmk::fuzz::source_path("tests/fixtures/safetensors/tiny-llama");
  for (const char* shard :
       {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}) {
    fs::copy_file(src / shard, llmk::fuzz::ScratchDir::get() / shard,
                  fs::copy_options::overwrite_existing);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string dir = llmk::fuzz::ScratchDir::get().string();
  llmk::fuzz::write_scratch("model.safetensors.index.json", data, size);
  llmk::fuzz::expect_llmk_errors([&] {
    const llmk::safetensors::Folder f = llmk::safetensors::Folder::open(dir);
    for (const std::string& name : f.names()) {
      const llmk::safetensors::TensorInfo& t = f.tensor_info(name);
      (void)f.shard_of(name);
      const llmk::Tensor view = f.tensor(name);
      llmk::fuzz::check(static_cast<uint64_t>(view.nbytes()) == t.nbytes, "tensor view size");
    }
  });
  return 0;
}
