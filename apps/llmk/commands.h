// The `llmk` subcommands. Each registers its options on a CLI11 subcommand and returns the
// function that runs it.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>

#include "core/tensor.h"
#include "model/weights.h"

namespace llmk::cli {

using Command = std::function<int()>;

Command add_run(CLI::App& app);
Command add_inspect(CLI::App& app);
Command add_tokenize(CLI::App& app);
Command add_bench(CLI::App& app);
Command add_logits(CLI::App& app);

// The default model: $LLMK_MODELS_DIR (or ./models) /SmolLM2-135M-Instruct.Q4_1.gguf.
std::string default_model_path();
// Adds -m/--model with the default above; an empty or missing file gives a clear error later.
CLI::Option* add_model_option(CLI::App& cmd, std::string& path, bool positional = false);
// Adds -t/--threads (default: all hardware threads).
void add_threads_option(CLI::App& cmd, int& threads);
// Checks the model path exists and applies the thread count.
void prepare(const std::string& model_path, int threads);
// Adds --device cpu|cuda|auto (default auto: cuda where a GPU and a CUDA build exist).
void add_device_option(CLI::App& cmd, std::string& device);
Device resolve_device(const std::string& device);
// Progress of weight loading: a line on stderr that updates itself, on a terminal only.
ProgressFn load_progress();

}  // namespace llmk::cli
