// The `llmk` subcommands. Each registers its options on a CLI11 subcommand and returns the
// function that runs it.
#pragma once

#include <CLI/CLI.hpp>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <istream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
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
Command add_teacher_topk(CLI::App& app);
// llmk quantize (apps/llmk/quantize.cpp): a bf16/f16/f32 model written as a quantised GGUF.
Command add_quantize(CLI::App& app);
// llmk serve (apps/llmk/serve.cpp): registers its own subcommand on the top-level app.
Command add_serve(CLI::App& app);

// llmk run --prompts FILE (apps/llmk/batch.cpp): every prompt through the many-sequence engine.
struct BatchArgs {
  std::string model, prompts_file, device;
  int64_t ctx = 0, max_tokens = 128, max_running = 64, step_tokens = 512;
  int64_t kv_memory = 0;          // LoadOptions::kv_memory; 0: sized from the batch
  std::string kv_dtype = "auto";  // LoadOptions::kv_type (parse_kv_type)
  std::string dtype = "auto";     // LoadOptions::dtype (parse_dtype)
  bool batch_invariant = false;   // LoadOptions::batch_invariant
  bool quantized = true;          // LoadOptions::quantized_weights
  bool host_embeddings = true;    // LoadOptions::host_embeddings
  int n = 1;
  bool chat = false;   // each prompt as the user's message in the model's chat template
  std::string system;  // with chat: the system message
  SamplerConfig sampler;
  bool ignore_eos = false;
};
int run_batch(const BatchArgs& a);
// --kv-memory: "" -> 0, "free" -> LoadOptions::kKvMemoryFree, "G" (GiB, > 0) -> bytes.
int64_t parse_kv_memory(const std::string& text);
// --kv-dtype's option text: auto, bf16 (CUDA), f32 (CPU), fp8 or int8.
void add_kv_dtype_option(CLI::App& cmd, std::string& kv_dtype);

// The default model: $LLMK_MODELS_DIR (or ./models) /SmolLM2-135M-Instruct.Q4_1.gguf.
std::string default_model_path();
// Adds -m/--model with the default above; an empty or missing file gives a clear error later.
CLI::Option* add_model_option(CLI::App& cmd, std::string& path, bool positional = false);
// Checks for integer options: the value must be a decimal integer in range, else a short
// message ("--ctx: -5 is less than 0"). CLI11's own range checks print their bounds as doubles
// in full (DBL_MAX has 309 digits) and accept NaN. The value is rewritten in canonical form, so
// that CLI11 does not read "010" as octal.
CLI::Validator in_range(int64_t min, int64_t max);
// From `min` up to the largest value of the option's type T.
template <typename T>
CLI::Validator at_least(T min) {
  return in_range(min, std::numeric_limits<T>::max());
}

// The most --threads may ask for: this machine's hardware threads (256 where the system does not
// say). The pool's workers spin while they wait for work, so threads beyond the hardware's only
// take cores from each other.
int max_threads();
// Adds -t/--threads (default: all hardware threads; at most max_threads()).
void add_threads_option(CLI::App& cmd, int& threads);
// Checks the model path exists and applies the thread count and --cpu-int8
// (cpu::set_int8_activations).
void prepare(const std::string& model_path, int threads, bool cpu_int8 = false);
// Adds --cpu-int8 (cpu::set_int8_activations).
void add_cpu_int8_flag(CLI::App& cmd, bool& on);
// "cpu (avx2), 2 threads": the CPU kernels' instruction set (kernels/cpu/isa.h) and threads.
std::string cpu_summary();
// Adds --device cpu|cuda|auto (default auto: cuda where a GPU and a CUDA build exist).
void add_device_option(CLI::App& cmd, std::string& device);
// Adds --dtype auto|bf16|f16|f32 (LoadOptions::dtype through parse_dtype).
void add_dtype_option(CLI::App& cmd, std::string& dtype);
// Adds --quantized-weights / --dequantize (LoadOptions::quantized_weights, on by default).
void add_quantized_weights_flag(CLI::App& cmd, bool& on);
// --gpu-embeddings: LoadOptions::host_embeddings off.
void add_gpu_embeddings_flag(CLI::App& cmd, bool& host_embeddings);
// Adds --batch-invariant (LoadOptions::batch_invariant).
void add_batch_invariant_flag(CLI::App& cmd, bool& on);
// The sampler chain's options (--temp, --top-k, --top-p, --min-p, --repeat-penalty,
// --repeat-last-n, --seed), shared by run and chat.
struct SamplerOptions {
  SamplerConfig config;
  int64_t seed = -1;  // -1: random
  // The configuration with the seed drawn when none was given; validated.
  SamplerConfig resolve() const;
};
void add_sampler_options(CLI::App& cmd, SamplerOptions& s);
// The most bytes of text a prompt file or one chat message may hold: more than a context of a
// million tokens takes, and a bound on what `-f /dev/zero` or `chat < /dev/zero` can ask for.
inline constexpr size_t kMaxTextBytes = size_t{16} << 20;
// The whitespace-separated token ids of `text`, each a decimal integer from 0 to INT32_MAX;
// `where` names the text in errors ("<where>: element 3 ('x') is not a token id ...").
std::vector<int32_t> parse_token_ids(std::string_view text, const std::string& where);
// One line of `in` without its newline; false at the end of the input. A line longer than
// `max_bytes` throws "<what> line <n> is longer than <max_bytes> bytes".
bool read_line(std::istream& in, std::string& line, size_t max_bytes, const std::string& what,
               int64_t line_number);
// The non-blank lines of the file `path` (each at most kMaxTextBytes), in order: fn(line, where)
// with where = "<path> line <n>" for messages. Throws "<path>: cannot open" when it cannot.
void for_each_line(
    const std::string& path,
    const std::function<void(const std::string& line, const std::string& where)>& fn);
// A line that starts (after blanks) with '{' as a JSON object, else nullopt (plain text). Throws
// "<where>: not valid JSON (...)" or "<where>: a JSON line must be an object".
std::optional<nlohmann::json> json_line(const std::string& line, const std::string& where);
// Writes `bytes` to `path`, replacing it. Throws "<path>: cannot write: <reason>" when opening,
// writing or closing fails (a full disk, /dev/full, a folder).
void write_file(const std::string& path, std::string_view bytes);

// Flushes stdout; throws "stdout: cannot write: <reason>" when any output to it failed (a full
// disk, /dev/full, a closed stdout), so that such a run never reads as a success.
void check_stdout();

// Progress of weight loading: a line on stderr that updates itself, on a terminal only.
ProgressFn load_progress();

}  // namespace llmk::cli

namespace llmk {
class Model;
class Tokenizer;
struct ModelConfig;
class ChatTemplate;
namespace cli {
// The model's chat template, or its family's when the file has none.
ChatTemplate chat_template_for(const Model& model, const Tokenizer& tok, const std::string& path);
ChatTemplate chat_template_for(const ModelConfig& config, const Tokenizer& tok,
                               const std::string& path);
// A prompt's token ids: the text as it is, or (tmpl set) the text as the user's message, after
// `system` when it is not empty, in the chat template.
std::vector<int32_t> encode_prompt(const Tokenizer& tok, const std::string& text,
                                   const ChatTemplate* tmpl, const std::string& system);

// "attention calls: prefill N, decode N, ..." from ops::attention_stats().
std::string attention_stats_line();
}  // namespace cli
}  // namespace llmk
