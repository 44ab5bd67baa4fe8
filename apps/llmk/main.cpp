// llmk: run, inspect and tokenize Llama-family models.
#include <fmt/format.h>

#include <cstdio>
#include <exception>
#include <iostream>
#include <string>
#include <system_error>

#include "apps/llmk/commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{
      "llmk: a lean engine for Llama-family language models (GGUF), CPU and CUDA.\n"
      "Run 'llmk <command> --help' for a command's options.",
      "llmk"};
  app.set_version_flag("--version", std::string("llmk ") + LLMK_VERSION);
  app.require_subcommand(1);
  // Usage errors get the same one-line form as every other error.
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return std::string("llmk: error: ") + e.what() + " (see --help)\n";
  });
  const llmk::cli::Command run = llmk::cli::add_run(
      *app.add_subcommand("run", "Generate text from a prompt, streamed to stdout"));
  const llmk::cli::Command inspect = llmk::cli::add_inspect(*app.add_subcommand(
      "inspect",
      "Show a GGUF file's metadata and tensors, or a Hugging Face folder's config and tensors"));
  const llmk::cli::Command chat = llmk::cli::add_chat(
      *app.add_subcommand("chat", "Talk with the model, one message per line on stdin"));
  const llmk::cli::Command bench = llmk::cli::add_bench(
      *app.add_subcommand("bench", "Time prefill and decode on random token ids (no tokenizer)"));
  const llmk::cli::Command logits = llmk::cli::add_logits(*app.add_subcommand(
      "logits", "Write the logits of a token sequence to a file (for comparisons)"));
  const llmk::cli::Command teacher_topk = llmk::cli::add_teacher_topk(*app.add_subcommand(
      "teacher-topk",
      "Write a teacher model's top-k logits over a dataset of token sequences (safetensors), "
      "for offline distillation"));
  const llmk::cli::Command quantize = llmk::cli::add_quantize(*app.add_subcommand(
      "quantize", "Write a bf16/f16/f32 model (GGUF or Hugging Face folder) as a quantised GGUF"));
  const llmk::cli::Command serve = llmk::cli::add_serve(app);
  const llmk::cli::Command tokenize = llmk::cli::add_tokenize(
      *app.add_subcommand("tokenize", "Show the token ids and pieces of a text"));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; every usage error exits 1, as every other error does.
    const int code = app.exit(e);
    if (!std::cout.flush()) {
      fmt::print(stderr, "llmk: error: stdout: cannot write the help\n");
      return 1;
    }
    return code == 0 ? 0 : 1;
  }
  try {
    int code = 0;
    if (app.got_subcommand("run")) code = run();
    if (app.got_subcommand("inspect")) code = inspect();
    if (app.got_subcommand("tokenize")) code = tokenize();
    if (app.got_subcommand("bench")) code = bench();
    if (app.got_subcommand("chat")) code = chat();
    if (app.got_subcommand("logits")) code = logits();
    if (app.got_subcommand("teacher-topk")) code = teacher_topk();
    if (app.got_subcommand("serve")) code = serve();
    if (app.got_subcommand("quantize")) code = quantize();
    llmk::cli::check_stdout();
    return code;
  } catch (const llmk::Error& e) {
    std::fflush(stdout);
    fmt::print(stderr, "llmk: error: {}\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fflush(stdout);
    fmt::print(stderr, "llmk: error: out of memory\n");
    return 1;
  } catch (const std::system_error& e) {
    // fmt::print throws this when stdout cannot take the text.
    if (std::fflush(stdout) != 0 || std::ferror(stdout) != 0) {
      fmt::print(stderr, "llmk: error: stdout: cannot write: {}\n", e.code().message());
      return 1;
    }
    fmt::print(stderr, "llmk: internal error: {}\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    fmt::print(stderr, "llmk: internal error: {}\n", e.what());
    return 2;
  }
  return 0;
}
