#include <cstdlib>
#include <filesystem>

#include "apps/llmk/commands.h"
#include "core/error.h"
#include "core/thread_pool.h"

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
