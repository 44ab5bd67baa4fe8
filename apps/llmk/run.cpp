#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <optional>
#include <random>

#include "apps/llmk/commands.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/generator.h"
#include "formats/mapped_file.h"
#include "model/model.h"
#include "ops/ops.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace llmk::cli {

Command add_run(CLI::App& cmd) {
  struct Args {
    std::string model, prompt, prompt_file, system, device, prompts, kv_memory, kv_dtype, dtype;
    int n_predict = 128, n = 1;
    int64_t ctx = 0, max_running = 64, step_tokens = 512;
    int threads = 0;
    bool chat = false, echo = false, ignore_eos = false, stats = false, batch_invariant = false,
         quantized = true, cpu_int8 = false, host_embeddings = true;
    SamplerOptions s;
  };
  auto a = std::make_shared<Args>();
  add_model_option(cmd, a->model);
  cmd.add_option("-p,--prompt", a->prompt, "The prompt text");
  cmd.add_option("-f,--prompt-file", a->prompt_file,
                 fmt::format("Read the prompt from a file (at most {} MiB)", kMaxTextBytes >> 20));
  cmd.add_option("-n,--n-predict", a->n_predict, "Tokens to generate at most")
      ->default_val(128)
      ->check(at_least(0));
  add_sampler_options(cmd, a->s);
  cmd.add_flag("--chat", a->chat, "Wrap the prompt in the model's chat template");
  cmd.add_option("--system", a->system, "System message for --chat");
  cmd.add_option("-c,--ctx", a->ctx, "Context length in tokens (default: min(model's, 4096))")
      ->check(at_least<int64_t>(0));
  cmd.add_flag("--echo", a->echo, "Print the prompt before the generated text");
  cmd.add_flag("--ignore-eos", a->ignore_eos, "Keep generating past end-of-generation tokens");
  cmd.add_flag("--stats", a->stats,
               "Print which attention kernel each attention call chose (prefill, decode, "
               "chunked, cpu)");
  cmd.add_option("--prompts", a->prompts,
                 "Run every line of this file (text, or JSON with \"prompt\" and optional n, "
                 "seed, max_tokens, temperature, top_p, top_k, min_p, presence_penalty, "
                 "frequency_penalty, stop) as one batch; one JSON line per prompt on stdout, in "
                 "input order");
  cmd.add_option("--n", a->n,
                 "With --prompts: samples per plain-text prompt (-n is the tokens to generate)")
      ->default_val(1)
      ->check(in_range(1, 1024));
  cmd.add_option("--max-running", a->max_running, "With --prompts: sequences in flight at once")
      ->default_val(64)
      ->check(in_range(1, 4096));
  cmd.add_option("--step-tokens", a->step_tokens,
                 "With --prompts: tokens per forward step (decode tokens and prompt chunks)")
      ->default_val(512)
      ->check(in_range(1, 1 << 20));
  cmd.add_option("--kv-memory", a->kv_memory,
                 "With --prompts: GiB for the KV cache's pages, or 'free' for what the GPU has "
                 "free after the weights (default: what the batch's samples can take, at most "
                 "--max-running contexts)");
  add_kv_dtype_option(cmd, a->kv_dtype);
  add_threads_option(cmd, a->threads);
  add_cpu_int8_flag(cmd, a->cpu_int8);
  add_device_option(cmd, a->device);
  add_dtype_option(cmd, a->dtype);
  add_quantized_weights_flag(cmd, a->quantized);
  add_gpu_embeddings_flag(cmd, a->host_embeddings);
  add_batch_invariant_flag(cmd, a->batch_invariant);
  cmd.footer(
      "Examples:\n"
      "  llmk run -p \"The capital of France is\" --temp 0\n"
      "  llmk run --chat -p \"Write a haiku about rain\" --temp 0.7 --seed 1\n"
      "  llmk run -m model.gguf -f prompt.txt -n 256 --device cpu -t 2\n"
      "  llmk run --prompts prompts.jsonl --n 4 --temp 0.8 -n 64 > outputs.jsonl");

  return [a] {
    if (!a->prompts.empty()) {
      LLMK_CHECK(a->prompt.empty() && a->prompt_file.empty(),
                 "give --prompts or a prompt (-p, -f), not both");
      LLMK_CHECK(!a->echo && !a->stats, "--echo and --stats do not work with --prompts");
      LLMK_CHECK(a->system.empty() || a->chat,
                 "--system needs --chat (it goes into the chat template)");
      prepare(a->model, a->threads, a->cpu_int8);
      return run_batch({.model = a->model,
                        .prompts_file = a->prompts,
                        .device = a->device,
                        .ctx = a->ctx,
                        .max_tokens = a->n_predict,
                        .max_running = a->max_running,
                        .step_tokens = a->step_tokens,
                        .kv_memory = parse_kv_memory(a->kv_memory),
                        .kv_dtype = a->kv_dtype,
                        .dtype = a->dtype,
                        .batch_invariant = a->batch_invariant,
                        .quantized = a->quantized,
                        .host_embeddings = a->host_embeddings,
                        .n = a->n,
                        .chat = a->chat,
                        .system = a->system,
                        .sampler = a->s.resolve(),
                        .ignore_eos = a->ignore_eos});
    }
    LLMK_CHECK(a->n == 1, "--n needs --prompts");
    LLMK_CHECK(a->kv_memory.empty(), "--kv-memory needs --prompts");
    LLMK_CHECK(a->kv_dtype == "auto", "--kv-dtype needs --prompts");
    LLMK_CHECK(!a->batch_invariant,
               "--batch-invariant needs --prompts (one prompt alone is "
               "no batch)");
    LLMK_CHECK(a->prompt.empty() || a->prompt_file.empty(), "give -p or -f, not both");
    LLMK_CHECK(a->system.empty() || a->chat,
               "--system needs --chat (it goes into the chat template)");
    if (!a->prompt_file.empty()) a->prompt = formats::read_file(a->prompt_file, kMaxTextBytes);
    LLMK_CHECK(!a->prompt.empty(), "no prompt: give -p TEXT or -f FILE");
    const SamplerConfig sampler = a->s.resolve();
    prepare(a->model, a->threads, a->cpu_int8);

    const auto t0 = std::chrono::steady_clock::now();
    const Device device = resolve_device(a->device);
    auto model = Model::load(a->model, LoadOptions{.context = a->ctx,
                                                   .device = device,
                                                   .progress = load_progress(),
                                                   .dtype = parse_dtype(a->dtype, device),
                                                   .quantized_weights = a->quantized,
                                                   .host_embeddings = a->host_embeddings});
    const Tokenizer tok = load_tokenizer(*model, a->model);
    const double load_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    std::optional<ChatTemplate> tmpl;
    if (a->chat) tmpl = chat_template_for(*model, tok, a->model);
    const std::vector<int32_t> ids =
        encode_prompt(tok, a->prompt, tmpl ? &*tmpl : nullptr, a->system);
    if (a->echo) {
      fmt::print("{}", a->prompt);
      std::fflush(stdout);
    }

    ops::reset_attention_stats();
    GenerateOptions opts;
    opts.max_tokens = a->n_predict;
    opts.sampler = sampler;
    opts.stop_at_eog = !a->ignore_eos;
    Utf8Stream out;
    const GenerateStats st = generate(*model, tok, ids, opts, [&](int32_t, const std::string& b) {
      const std::string ready = out.push(b);
      std::fwrite(ready.data(), 1, ready.size(), stdout);
      // Stop when stdout takes no more (a full disk): main() reports it.
      return std::fflush(stdout) == 0 && std::ferror(stdout) == 0;
    });
    const std::string rest = out.flush();
    std::fwrite(rest.data(), 1, rest.size(), stdout);
    std::fputc('\n', stdout);
    check_stdout();
    fmt::print(stderr,
               "[llmk] load {:.2f} s | prompt {} tokens, {:.1f} tokens/s | generation {} tokens, "
               "{:.1f} tokens/s | stop: {} | seed {} | {}\n",
               load_s, st.prompt_tokens, st.prompt_tps(), st.generated_tokens, st.generate_tps(),
               st.stop_reason, sampler.seed,
               model->device() == Device::CPU ? cpu_summary() : std::string("cuda"));
    if (a->stats) fmt::print(stderr, "[llmk] {}\n", attention_stats_line());
    return 0;
  };
}

}  // namespace llmk::cli
