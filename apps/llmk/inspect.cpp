#include <fmt/format.h>

#include "apps/llmk/commands.h"
#include "formats/gguf.h"

namespace llmk::cli {

Command add_inspect(CLI::App& cmd) {
  struct Args {
    std::string model;
    bool no_tensors = false;
    int threads = 0;
  };
  auto a = std::make_shared<Args>();
  add_model_option(cmd, a->model, /*positional=*/true);
  cmd.add_flag("--no-tensors", a->no_tensors, "Show the metadata only");
  return [a] {
    prepare(a->model, 1);
    const gguf::File f = gguf::File::open(a->model);
    fmt::print("file: {}\nGGUF version {}, {} bytes, alignment {}\n\nmetadata ({} keys):\n",
               f.path(), f.version(), f.file_size(), f.alignment(), f.metadata().size());
    for (const auto& [key, value] : f.metadata()) {
      fmt::print("  {:<44} {:<8} {}\n", key, gguf::value_type_name(value.type()),
                 value.to_string());
    }
    if (a->no_tensors) return 0;
    uint64_t total = 0;
    fmt::print("\ntensors ({}):\n  {:<36} {:<6} {:<18} {:>12} {:>12}\n", f.tensors().size(), "name",
               "type", "shape", "offset", "bytes");
    for (const gguf::TensorInfo& t : f.tensors()) {
      fmt::print("  {:<36} {:<6} {:<18} {:>12} {:>12}\n", t.name, gguf::ggml_type_name(t.ggml_type),
                 shape_str(t.shape), t.offset, t.nbytes);
      total += t.nbytes;
    }
    fmt::print("  total {:.1f} MiB of tensor data\n", static_cast<double>(total) / (1 << 20));
    return 0;
  };
}

}  // namespace llmk::cli
