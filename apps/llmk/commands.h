// The `llmk` subcommands. Each registers its options on a CLI11 subcommand and returns the
// function that runs it.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "engine/sampler.h"
#include "model/weights.h"

namespace llmk::cli {

using Command = std::function<int()>;

Command add_run(CLI::App& app);
Command add_inspect(CLI::App& app);
Command add_tokenize(CLI::App& app);
Command add_bench(CLI::App& app);
Command add_logits(CLI::App& app);
Command add_chat(CLI::App& app);

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
// The sampler chain's options (--temp, --top-k, --top-p, --min-p, --repeat-penalty,
// --repeat-last-n, --seed), shared by run and chat.
struct SamplerOptions {
  SamplerConfig config;
  int64_t seed = -1;  // -1: random
  // The configuration with the seed drawn when none was given; validated.
  SamplerConfig resolve() const;
};
void add_sampler_options(CLI::App& cmd, SamplerOptions& s);
// Progress of weight loading: a line on stderr that updates itself, on a terminal only.
ProgressFn load_progress();

}  // namespace llmk::cli

namespace llmk {
class Model;
class Tokenizer;
class ChatTemplate;
namespace cli {
// The model's tokenizer (GGUF files only, so far); `path` names the model in errors.
// The tokenizer of a GGUF file or of a Hugging Face folder (its tokenizer.json).
Tokenizer load_tokenizer(const std::string& path);
// The same, reusing the model's open GGUF file when it has one.
Tokenizer load_tokenizer(const Model& model, const std::string& path);
// The model's chat template, or its family's when the file has none.
ChatTemplate chat_template_for(const Model& model, const Tokenizer& tok, const std::string& path);

// "attention calls: prefill N, decode N, ..." from ops::attention_stats().
std::string attention_stats_line();
}  // namespace cli
}  // namespace llmk
