#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "apps/llmk/commands.h"
#include "core/error.h"
#include "core/thread_pool.h"

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
      "GGUF model file (default: " + path + ", fetched by scripts/fetch-models.sh)";
  return positional ? cmd.add_option("model", path, help)
                    : cmd.add_option("-m,--model", path, help);
}

void add_threads_option(CLI::App& cmd, int& threads) {
  threads = 0;
  cmd.add_option("-t,--threads", threads, "CPU threads (default: all hardware threads)")
      ->check(CLI::NonNegativeNumber);
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
