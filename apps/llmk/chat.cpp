// llmk chat: a multi-turn conversation on stdin/stdout. Each turn formats the whole
// conversation with the model's chat template and runs only the tokens the KV cache does not
// hold yet (the common prefix with the last turn is reused).
#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>

#include "apps/llmk/commands.h"
#include "core/error.h"
#include "engine/generator.h"
#include "model/model.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace llmk::cli {

Command add_chat(CLI::App& cmd) {
  struct Args {
    std::string model, system, device, dtype;
    bool quantized = true, cpu_int8 = false, host_embeddings = true;
    int n_predict = 512;
    int64_t ctx = 0;
    int threads = 0;
    SamplerOptions s;
  };
  auto a = std::make_shared<Args>();
  add_model_option(cmd, a->model);
  cmd.add_option("--system", a->system, "System message");
  cmd.add_option("-n,--n-predict", a->n_predict, "Tokens per reply at most")
      ->default_val(512)
      ->check(at_least(1));
  add_sampler_options(cmd, a->s);
  cmd.add_option("-c,--ctx", a->ctx, "Context length in tokens (default: min(model's, 4096))")
      ->check(at_least<int64_t>(0));
  add_threads_option(cmd, a->threads);
  add_cpu_int8_flag(cmd, a->cpu_int8);
  add_device_option(cmd, a->device);
  add_dtype_option(cmd, a->dtype);
  add_quantized_weights_flag(cmd, a->quantized);
  add_gpu_embeddings_flag(cmd, a->host_embeddings);
  cmd.footer(
      fmt::format("One message per line on stdin (at most {} MiB a line); each reply is streamed "
                  "to stdout,\nits speed to stderr.\n"
                  "/reset starts a new conversation; end of input (Ctrl-D) ends the chat.\n"
                  "Example: printf 'Hi!\\nWhat did I just say?\\n' | llmk chat --temp 0",
                  kMaxTextBytes >> 20));
  return [a] {
    const SamplerConfig sampler = a->s.resolve();
    prepare(a->model, a->threads, a->cpu_int8);
    const Device device = resolve_device(a->device);
    auto model = Model::load(a->model, LoadOptions{.context = a->ctx,
                                                   .device = device,
                                                   .progress = load_progress(),
                                                   .dtype = parse_dtype(a->dtype, device),
                                                   .quantized_weights = a->quantized,
                                                   .host_embeddings = a->host_embeddings});
    const Tokenizer tok = load_tokenizer(*model, a->model);
    const ChatTemplate tmpl = chat_template_for(*model, tok, a->model);
    const bool tty = isatty(STDIN_FILENO) != 0;

    std::vector<ChatMessage> msgs;
    if (!a->system.empty()) msgs.push_back({"system", a->system});
    const size_t first_turn = msgs.size();
    std::vector<int32_t> in_cache;  // the tokens whose keys and values the cache holds
    GenerateOptions opts;
    opts.max_tokens = a->n_predict;
    opts.sampler = sampler;
    std::string line;
    for (int64_t line_number = 1;; ++line_number) {
      if (tty) {
        fmt::print(stderr, "> ");
        std::fflush(stderr);
      }
      if (!read_line(std::cin, line, kMaxTextBytes, "stdin", line_number)) break;
      if (line.empty()) continue;
      if (line == "/reset") {
        msgs.resize(first_turn);
        in_cache.clear();
        continue;
      }
      msgs.push_back({"user", line});
      const std::vector<int32_t> prompt =
          tok.encode(tmpl.apply(msgs, /*add_generation_prompt=*/true), tok.add_bos(), true);
      LLMK_CHECK(static_cast<int64_t>(prompt.size()) < model->context(),
                 "the conversation has {} tokens but the context holds {}: /reset, or raise "
                 "--ctx (at most {})",
                 prompt.size(), model->context(), model->config().context_length);
      size_t cached = 0;
      while (cached < in_cache.size() && cached + 1 < prompt.size() &&
             in_cache[cached] == prompt[cached]) {
        ++cached;
      }
      Utf8Stream out;
      std::vector<int32_t> reply;
      const GenerateStats st = generate(
          *model, tok, prompt, opts,
          [&](int32_t id, const std::string& bytes) {
            reply.push_back(id);
            const std::string ready = out.push(bytes);
            std::fwrite(ready.data(), 1, ready.size(), stdout);
            // Stop when stdout takes no more (a full disk): main() reports it.
            return std::fflush(stdout) == 0 && std::ferror(stdout) == 0;
          },
          static_cast<int64_t>(cached));
      const std::string rest = out.flush();
      std::fwrite(rest.data(), 1, rest.size(), stdout);
      std::fputc('\n', stdout);
      check_stdout();
      fmt::print(stderr,
                 "[llmk] {} new prompt tokens ({} reused), {:.1f} tokens/s | reply {} "
                 "tokens, {:.1f} tokens/s | stop: {}\n",
                 st.prompt_tokens, cached, st.prompt_tps(), st.generated_tokens, st.generate_tps(),
                 st.stop_reason);
      in_cache = prompt;
      in_cache.insert(in_cache.end(), st.sampled.begin(), st.sampled.end() - 1);
      msgs.push_back({"assistant", tok.decode(reply)});
    }
    return 0;
  };
}

}  // namespace llmk::cli
