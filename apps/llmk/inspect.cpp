// llmk inspect: what a model file or folder holds, read without loading the weights. Everything
// that comes from the file (keys, values, tensor names) goes through llmk::printable: control
// characters escaped, so a file cannot send terminal escape sequences, and long values cut.
#include <fmt/format.h>

#include <filesystem>
#include <string_view>

#include "apps/llmk/commands.h"
#include "core/error.h"
#include "core/text.h"
#include "formats/gguf.h"
#include "formats/hf_config.h"
#include "formats/safetensors.h"
#include "model/config.h"

namespace llmk::cli {

namespace {

void print_gguf(const std::string& path, bool tensors) {
  const gguf::File f = gguf::File::open(path);
  fmt::print("file: {}\nGGUF version {}, {} bytes, alignment {}\n\nmetadata ({} keys):\n",
             printable(f.path()), f.version(), f.file_size(), f.alignment(), f.metadata().size());
  for (const auto& [key, value] : f.metadata()) {
    fmt::print("  {:<44} {:<8} {}\n", printable(key), gguf::value_type_name(value.type()),
               value.to_string());
  }
  if (!tensors) return;
  uint64_t total = 0;
  fmt::print("\ntensors ({}):\n  {:<36} {:<6} {:<18} {:>12} {:>12}\n", f.tensors().size(), "name",
             "type", "shape", "offset", "bytes");
  for (const gguf::TensorInfo& t : f.tensors()) {
    fmt::print("  {:<36} {:<6} {:<18} {:>12} {:>12}\n", printable(t.name),
               gguf::ggml_type_name(t.ggml_type), shape_str(t.shape), t.offset, t.nbytes);
    total += t.nbytes;
  }
  fmt::print("  total {:.1f} MiB of tensor data\n", static_cast<double>(total) / (1 << 20));
}

// A config.json value on one line: a string escaped, other values as ASCII JSON (control
// characters and non-ASCII as \uXXXX), cut after a few hundred bytes.
std::string json_value_text(const json_io::Json& v) {
  if (v.is_string()) return printable(v.get_ref<const std::string&>());
  const std::string json = v.dump(-1, ' ', /*ensure_ascii=*/true);
  const size_t max_bytes = 4 * kExcerptBytes;
  if (json.size() <= max_bytes) return json;
  return fmt::format("{}... ({} bytes)", std::string_view(json).substr(0, max_bytes), json.size());
}

void print_safetensors_tensors(const safetensors::Folder& folder) {
  uint64_t total = 0;
  fmt::print("\ntensors ({} in {} files):\n  {:<48} {:<5} {:<16} {:<34} {:>12}\n",
             folder.names().size(), folder.shards().size(), "name", "dtype", "shape", "file",
             "bytes");
  for (const std::string& name : folder.names()) {
    const safetensors::TensorInfo& t = folder.tensor_info(name);
    const std::string file = std::filesystem::path(folder.shard_of(name).path()).filename();
    fmt::print("  {:<48} {:<5} {:<16} {:<34} {:>12}\n", printable(name), dtype_name(t.dtype),
               shape_str(t.shape), printable(file), t.nbytes);
    total += t.nbytes;
  }
  fmt::print("  total {:.1f} MiB of tensor data\n", static_cast<double>(total) / (1 << 20));
}

// A Hugging Face folder: config.json's keys, llmk's reading of them, and the safetensors tensors.
void print_hf_folder(const std::string& path, bool tensors) {
  const HfConfig config = HfConfig::open(path);
  const safetensors::Folder folder = safetensors::Folder::open(path);
  std::string model;
  try {
    model = ModelConfig::from_hf(config).summary();
  } catch (const Error& e) {
    model = std::string("llmk cannot run it: ") + e.what();
  }
  fmt::print("folder: {}\n\n{} ({} keys):\n", printable(path), printable(config.path()),
             config.json().size());
  for (const auto& [key, value] : config.json().items()) {
    fmt::print("  {:<44} {}\n", printable(key), json_value_text(value));
  }
  fmt::print("\nmodel: {}\n", printable(model, kExcerptBytes * 4));
  if (tensors) print_safetensors_tensors(folder);
}

}  // namespace

Command add_inspect(CLI::App& cmd) {
  struct Args {
    std::string model;
    bool no_tensors = false;
  };
  auto a = std::make_shared<Args>();
  add_model_option(cmd, a->model, /*positional=*/true);
  cmd.add_flag("--no-tensors", a->no_tensors, "Show the metadata only");
  cmd.footer(
      "A GGUF file: its metadata and tensor table. A Hugging Face folder: config.json's keys,\n"
      "the model llmk reads from them, and the safetensors tensor table. Values from the file\n"
      "have control characters escaped; long ones are cut, ending in \"... (N bytes)\".");
  return [a] {
    prepare(a->model, 1);
    const std::filesystem::path path(a->model);
    if (std::filesystem::is_directory(path)) {
      print_hf_folder(a->model, !a->no_tensors);
    } else if (path.extension() == ".safetensors" || path.extension() == ".json") {
      LLMK_FAIL(
          "{}: inspect reads a GGUF file or a whole Hugging Face folder: give the folder ({})",
          a->model, path.has_parent_path() ? path.parent_path().string() : ".");
    } else {
      print_gguf(a->model, !a->no_tensors);
    }
    return 0;
  };
}

}  // namespace llmk::cli
