#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>

#include "apps/llmk/commands.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "formats/gguf.h"
#include "model/model.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

#ifdef LLMK_HAS_CUDA
#include "core/cuda/device.h"
#endif

namespace llmk::cli {

std::string default_model_path() {
  const char* dir = std::getenv("LLMK_MODELS_DIR");
  return std::string(dir && *dir ? dir : "models") + "/SmolLM2-135M-Instruct.Q4_1.gguf";
}

CLI::Option* add_model_option(CLI::App& cmd, std::string& path, bool positional) {
  path = default_model_path();
  const std::string help =
      "GGUF model file or Hugging Face model folder (config.json, *.safetensors, "
      "tokenizer.json); default: " +
      path + ", fetched by scripts/fetch-models.sh";
  return positional ? cmd.add_option("model", path, help)
                    : cmd.add_option("-m,--model", path, help);
}

void add_threads_option(CLI::App& cmd, int& threads) {
  threads = 0;
  cmd.add_option("-t,--threads", threads, "CPU threads (default: all hardware threads)")
      ->check(CLI::NonNegativeNumber);
}

void add_sampler_options(CLI::App& cmd, SamplerOptions& s) {
  SamplerConfig& c = s.config;
  cmd.add_option("--temp", c.temperature, "Sampling temperature; 0 = greedy")->default_val(0.8);
  cmd.add_option("--top-k", c.top_k, "Keep the k most likely tokens; 0 = off")->default_val(40);
  cmd.add_option("--top-p", c.top_p, "Keep the most likely tokens up to this mass; 1 = off")
      ->default_val(0.95);
  cmd.add_option("--min-p", c.min_p, "Drop tokens below min-p x p(top token); 0 = off")
      ->default_val(0.05);
  cmd.add_option("--repeat-penalty", c.repeat_penalty,
                 "Penalise tokens of the last --repeat-last-n; 1 = off")
      ->default_val(1.0);
  cmd.add_option("--repeat-last-n", c.repeat_last_n, "Window of the repeat penalty")
      ->default_val(64);
  cmd.add_option("--seed", s.seed, "Random seed (default: random, printed with the stats)");
}

SamplerConfig SamplerOptions::resolve() const {
  SamplerConfig c = config;
  c.seed = seed >= 0 ? static_cast<uint64_t>(seed) : std::random_device{}();
  c.validate();
  return c;
}

Tokenizer load_tokenizer(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    LLMK_CHECK(fs::exists(fs::path(path) / "tokenizer.json", ec),
               "{}: no tokenizer.json in the folder (needed for text; `llmk bench` needs none)",
               path);
    return Tokenizer::from_hf_json(path);
  }
  return Tokenizer::from_gguf(gguf::File::open(path));
}

Tokenizer load_tokenizer(const Model& model, const std::string& path) {
  if (model.gguf()) return Tokenizer::from_gguf(*model.gguf());
  return load_tokenizer(path);
}

ChatTemplate chat_template_for(const Model& model, const Tokenizer& tok, const std::string& path) {
  if (!tok.chat_template().empty()) return ChatTemplate::from_jinja(tok.chat_template());
  LLMK_CHECK(!model.config().chat_family.empty(),
             "{}: the model has no chat template; run without --chat", path);
  return ChatTemplate::for_family(model.config().chat_family);
}

void add_device_option(CLI::App& cmd, std::string& device) {
  device = "auto";
  cmd.add_option("--device", device, "cpu, cuda, or auto: cuda where a GPU exists")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->default_val("auto");
}

Device resolve_device(const std::string& device) {
  if (device == "cpu") return Device::CPU;
#ifdef LLMK_HAS_CUDA
  if (device == "cuda") {
    LLMK_CHECK(cuda::available(), "--device cuda: no usable GPU ({})", cuda::unavailable_reason());
    return Device::CUDA;
  }
  return cuda::available() ? Device::CUDA : Device::CPU;
#else
  LLMK_CHECK(device != "cuda",
             "--device cuda: this llmk was built without CUDA (cmake --preset cuda)");
  return Device::CPU;
#endif
}

ProgressFn load_progress() {
  // Only on a terminal: a log or a pipe gets no progress noise, so that an error stays the one
  // line on stderr.
  if (isatty(STDERR_FILENO) == 0) return nullptr;
  return [last = -1](const LoadProgress& p) mutable {
    const int pct = p.bytes_total ? static_cast<int>(100 * p.bytes_done / p.bytes_total) : 100;
    if (pct == last) return;
    last = pct;
    fmt::print(stderr, "\r[llmk] loading weights: {:3d}% ({}/{} tensors, {:.0f} MiB){}", pct,
               p.done, p.total, p.bytes_done / 1048576.0, p.done == p.total ? "\n" : "");
    std::fflush(stderr);
  };
}

void prepare(const std::string& model_path, int threads) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(model_path, ec)) {
    if (model_path == default_model_path()) {
      LLMK_FAIL("the default model {} is not there: run scripts/fetch-models.sh, or pass -m FILE",
                model_path);
    }
    LLMK_FAIL("{}: no such file", model_path);
  }
  set_num_threads(threads);
}

}  // namespace llmk::cli
