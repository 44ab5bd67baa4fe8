#include <fmt/format.h>

#include "apps/llmk/commands.h"
#include "core/text.h"
#include "formats/gguf.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace llmk::cli {

namespace {
// A token's bytes as a quoted, escaped string, so whitespace and control bytes are visible and a
// tokenizer file cannot send terminal escape sequences.
std::string quoted(const std::string& bytes) { return "'" + printable(bytes, 256) + "'"; }
}  // namespace

Command add_tokenize(CLI::App& cmd) {
  struct Args {
    std::string model, text;
    bool ids_only = false, no_special = false, bos = false;
  };
  auto a = std::make_shared<Args>();
  add_model_option(cmd, a->model);
  cmd.add_option("text", a->text, "The text to tokenize")->required();
  cmd.add_flag("--ids-only", a->ids_only, "Print the ids only, on one line");
  cmd.add_flag("--no-special", a->no_special,
               "Treat special-token text such as <|im_start|> as plain text");
  cmd.add_flag("--bos", a->bos, "Prepend the BOS token");
  return [a] {
    prepare(a->model, 1);
    const Tokenizer tok = load_tokenizer(a->model);
    const std::vector<int32_t> ids = tok.encode(a->text, a->bos, !a->no_special);
    if (a->ids_only) {
      fmt::print("{}\n", fmt::join(ids, " "));
      return 0;
    }
    for (int32_t id : ids) fmt::print("{:>7} {}\n", id, quoted(tok.token_bytes(id)));
    fmt::print("{} tokens\n", ids.size());
    return 0;
  };
}

}  // namespace llmk::cli
