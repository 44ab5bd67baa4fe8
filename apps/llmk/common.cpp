#include <fmt/format.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <thread>

#include "apps/llmk/commands.h"
#include "core/error.h"
#include "core/text.h"
#include "core/thread_pool.h"
#include "formats/gguf.h"
#include "formats/mapped_file.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/matmul.h"
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

namespace {
// `input` as a decimal integer in [min, max], rewritten in canonical form; else the message.
std::string check_integer(std::string& input, int64_t min, int64_t max) {
  int64_t v = 0;
  const char* end = input.data() + input.size();
  const auto [ptr, ec] = std::from_chars(input.data(), end, v);
  const std::string shown = printable(input, 40);
  if (ec == std::errc::result_out_of_range) {
    return fmt::format("'{}' is out of range ({} to {})", shown, min, max);
  }
  if (ec != std::errc() || ptr != end) return fmt::format("'{}' is not an integer", shown);
  if (v < min) return fmt::format("{} is less than {}", v, min);
  if (v > max) return fmt::format("{} is more than {}", v, max);
  input = std::to_string(v);
  return {};
}
}  // namespace

CLI::Validator in_range(int64_t min, int64_t max) {
  const bool unbounded =
      max == std::numeric_limits<int>::max() || max == std::numeric_limits<int64_t>::max();
  return {[min, max](std::string& input) { return check_integer(input, min, max); },
          unbounded ? fmt::format(">= {}", min) : fmt::format("{}..{}", min, max)};
}

int max_threads() {
  const unsigned hw = std::thread::hardware_concurrency();
  return hw > 0 ? static_cast<int>(std::min(hw, 4096u)) : 256;
}

void add_threads_option(CLI::App& cmd, int& threads) {
  threads = 0;
  cmd.add_option("-t,--threads", threads,
                 fmt::format("CPU threads, at most this machine's {} hardware threads (more only "
                             "take cores from each other); default: all",
                             max_threads()))
      ->check(in_range(0, max_threads()));
}

std::vector<int32_t> parse_token_ids(std::string_view text, const std::string& where) {
  const auto space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  std::vector<int32_t> ids;
  size_t i = 0;
  for (;;) {
    while (i < text.size() && space(text[i])) ++i;
    if (i == text.size()) return ids;
    size_t j = i;
    while (j < text.size() && !space(text[j])) ++j;
    const std::string_view word = text.substr(i, j - i);
    int32_t id = -1;
    const auto [end, ec] = std::from_chars(word.data(), word.data() + word.size(), id);
    LLMK_CHECK(ec == std::errc() && end == word.data() + word.size() && id >= 0,
               "{}: element {} ('{}') is not a token id (an integer from 0 to {})", where,
               ids.size() + 1, printable(word, 40), std::numeric_limits<int32_t>::max());
    ids.push_back(id);
    i = j;
  }
}

bool read_line(std::istream& in, std::string& line, size_t max_bytes, const std::string& what,
               int64_t line_number) {
  line.clear();
  std::istream::sentry ok(in, /*noskipws=*/true);
  if (!ok) return false;
  std::streambuf& buf = *in.rdbuf();
  for (;;) {
    const int c = buf.sbumpc();
    if (c == std::char_traits<char>::eof()) {
      in.setstate(std::ios::eofbit);
      return !line.empty();
    }
    if (c == '\n') return true;
    LLMK_CHECK(line.size() < max_bytes, "{} line {} is longer than {} bytes", what, line_number,
               max_bytes);
    line.push_back(static_cast<char>(c));
  }
}

void for_each_line(
    const std::string& path,
    const std::function<void(const std::string& line, const std::string& where)>& fn) {
  std::ifstream in(path, std::ios::binary);
  LLMK_CHECK(in.is_open(), "{}: cannot open", path);
  std::string line;
  for (int64_t n = 1; read_line(in, line, kMaxTextBytes, path, n); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    fn(line, fmt::format("{} line {}", path, n));
  }
}

std::optional<nlohmann::json> json_line(const std::string& line, const std::string& where) {
  const size_t first = line.find_first_not_of(" \t\r");
  if (first == std::string::npos || line[first] != '{') return std::nullopt;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    LLMK_FAIL("{}: not valid JSON ({})", where, e.what());
  }
  LLMK_CHECK(j.is_object(), "{}: a JSON line must be an object", where);
  return j;
}

void check_stdout() {
  errno = 0;
  if (std::fflush(stdout) == 0 && std::ferror(stdout) == 0) return;
  LLMK_FAIL("stdout: cannot write: {}",
            errno != 0 ? formats::errno_message(errno) : std::string("an earlier write failed"));
}

void write_file(const std::string& path, std::string_view bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  LLMK_CHECK(f != nullptr, "{}: cannot write: {}", path, formats::errno_message(errno));
  const size_t wrote = std::fwrite(bytes.data(), 1, bytes.size(), f);
  const int write_errno = errno;
  if (std::fclose(f) != 0 || wrote != bytes.size()) {
    LLMK_FAIL("{}: cannot write: {}", path,
              formats::errno_message(wrote != bytes.size() ? write_errno : errno));
  }
}

void add_sampler_options(CLI::App& cmd, SamplerOptions& s) {
  SamplerConfig& c = s.config;
  cmd.add_option("--temp", c.temperature, "Sampling temperature; 0 = greedy")->default_val(0.8);
  cmd.add_option("--top-k", c.top_k, "Keep the k most likely tokens; 0 = off")
      ->default_val(40)
      ->check(at_least(0));
  cmd.add_option("--top-p", c.top_p, "Keep the most likely tokens up to this mass; 1 = off")
      ->default_val(0.95);
  cmd.add_option("--min-p", c.min_p, "Drop tokens below min-p x p(top token); 0 = off")
      ->default_val(0.05);
  cmd.add_option("--repeat-penalty", c.repeat_penalty,
                 "Penalise tokens of the last --repeat-last-n; 1 = off")
      ->default_val(1.0);
  cmd.add_option("--repeat-last-n", c.repeat_last_n, "Window of the repeat penalty")
      ->default_val(64)
      ->check(at_least(0));
  cmd.add_option("--seed", s.seed, "Random seed; -1 (the default): random, printed with the stats")
      ->check(at_least<int64_t>(-1));
}

SamplerConfig SamplerOptions::resolve() const {
  SamplerConfig c = config;
  c.seed = seed >= 0 ? static_cast<uint64_t>(seed) : std::random_device{}();
  c.validate();
  return c;
}

ChatTemplate chat_template_for(const ModelConfig& config, const Tokenizer& tok,
                               const std::string& path) {
  if (!tok.chat_template().empty()) return ChatTemplate::from_jinja(tok.chat_template());
  LLMK_CHECK(!config.chat_family.empty(), "{}: the model has no chat template; run without --chat",
             path);
  return ChatTemplate::for_family(config.chat_family);
}

ChatTemplate chat_template_for(const Model& model, const Tokenizer& tok, const std::string& path) {
  return chat_template_for(model.config(), tok, path);
}

std::vector<int32_t> encode_prompt(const Tokenizer& tok, const std::string& text,
                                   const ChatTemplate* tmpl, const std::string& system) {
  if (tmpl == nullptr) return tok.encode(text, tok.add_bos(), /*parse_special=*/false);
  std::vector<ChatMessage> msgs;
  if (!system.empty()) msgs.push_back({"system", system});
  msgs.push_back({"user", text});
  // Special tokens are parsed only in text from the chat template: a user's raw prompt that
  // happens to contain "<|im_end|>" is text when no template wraps it.
  return tok.encode(tmpl->apply(msgs, /*add_generation_prompt=*/true), tok.add_bos(),
                    /*parse_special=*/true);
}

void add_device_option(CLI::App& cmd, std::string& device) {
  device = "auto";
  cmd.add_option("--device", device, "cpu, cuda, or auto: cuda where a GPU exists")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->default_val("auto");
}

void add_dtype_option(CLI::App& cmd, std::string& dtype) {
  dtype = "auto";
  cmd.add_option("--dtype", dtype,
                 "activations (and weights, converted at load) on CUDA: auto (bf16), bf16, f16 or "
                 "f32; the CPU computes in f32. f16 and f32 run slower kernels (f32 attention and "
                 "every f16/f32 decode step take the fallback attention kernel)")
      ->default_val("auto");
}

void add_quantized_weights_flag(CLI::App& cmd, bool& on) {
  cmd.add_flag(
      "--quantized-weights,!--dequantize", on,
      "On CUDA, keep a GGUF's Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K matrices quantised "
      "on the GPU (the default: a quarter to a half of bf16's memory, faster decode), or "
      "with --dequantize convert them to bf16 at load (faster prefill of long prompts; "
      "docs/perf.md)");
}

void add_gpu_embeddings_flag(CLI::App& cmd, bool& host_embeddings) {
  cmd.add_flag("!--gpu-embeddings", host_embeddings,
               "On CUDA, keep the token embeddings in GPU memory. By default a model whose output "
               "layer is its own keeps them in pinned host memory, which the GPU reads a row a "
               "token (a Q4_K_M Llama-3-8B: 282 MiB less GPU memory, decode speed unchanged; "
               "docs/perf.md); tied embeddings always stay on the GPU");
}

void add_batch_invariant_flag(CLI::App& cmd, bool& on) {
  cmd.add_flag("--batch-invariant", on,
               "On CUDA, compute each sequence the same way whatever runs beside it, so that its "
               "tokens and logprobs do not depend on the batch (one GEMM algorithm for every "
               "batch size, one attention block per sequence and KV head); slower");
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

void add_cpu_int8_flag(CLI::App& cmd, bool& on) {
  cmd.add_flag("--cpu-int8", on,
               "On the CPU, multiply a token's activations quantised to 8 bits (per 32, as Q8_0) "
               "by integer dot products against block-quantised weights, as llama.cpp does: "
               "faster decode, logits less exact than the f32 default's (docs/perf.md, \"CPU\")");
}

std::string cpu_summary() {
  return fmt::format("cpu ({}), {} threads", cpu::isa_name(cpu::isa()), cpu_pool().num_threads());
}

void prepare(const std::string& model_path, int threads, bool cpu_int8) {
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
  cpu::set_int8_activations(cpu_int8);
}

}  // namespace llmk::cli
