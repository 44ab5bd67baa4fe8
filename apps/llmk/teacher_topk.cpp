// llmk teacher-topk: a teacher model's top-k logits over a dataset of token sequences, written
// to safetensors for offline distillation (engine/teacher_topk.h has the file's layout;
// llmk.ops.load_teacher_topk reads it into torch, and fused_linear_distill_loss takes its rows as
// teacher_topk).
//
// The input has one sequence per line: whitespace-separated token ids, or a JSON object with
// "ids" (a list of token ids) or "text" (tokenized with the model's tokenizer, with BOS where the
// tokenizer adds one). Blank lines are skipped.
#include "engine/teacher_topk.h"

#include <fmt/format.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <optional>

#include "apps/llmk/commands.h"
#include "core/error.h"
#include "core/text.h"
#include "model/model.h"
#include "ops/ops.h"
#include "tokenizer/tokenizer.h"

namespace llmk::cli {

namespace {

struct Dataset {
  std::vector<std::vector<int32_t>> seqs;
  int64_t cut = 0;  // sequences cut to --max-tokens
};

Dataset read_dataset(const std::string& path, const std::string& model_path, int64_t max_tokens) {
  Dataset d;
  std::optional<Tokenizer> tok;
  for_each_line(path, [&](const std::string& line, const std::string& where) {
    std::vector<int32_t> ids;
    if (const auto j = json_line(line, where)) {
      const bool has_ids = j->contains("ids"), has_text = j->contains("text");
      LLMK_CHECK(has_ids != has_text, "{}: a JSON line needs exactly one of \"ids\" and \"text\"",
                 where);
      if (has_text) {
        LLMK_CHECK((*j)["text"].is_string(), "{}: \"text\" must be a string", where);
        if (!tok) tok.emplace(load_tokenizer(model_path));
        ids = tok->encode((*j)["text"].get<std::string>(), tok->add_bos(), false);
      } else {
        LLMK_CHECK((*j)["ids"].is_array(), "{}: \"ids\" must be a list of token ids", where);
        for (const auto& v : (*j)["ids"]) {
          LLMK_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0 &&
                         v.get<int64_t>() <= std::numeric_limits<int32_t>::max(),
                     "{}: \"ids\" holds {}, not a token id", where, printable(v.dump(), 40));
          ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
        }
      }
    } else {
      ids = parse_token_ids(line, where);
    }
    LLMK_CHECK(!ids.empty(), "{}: no tokens", where);
    if (max_tokens > 0 && static_cast<int64_t>(ids.size()) > max_tokens) {
      ids.resize(static_cast<size_t>(max_tokens));
      ++d.cut;
    }
    d.seqs.push_back(std::move(ids));
  });
  LLMK_CHECK(!d.seqs.empty(), "{}: no sequences", path);
  return d;
}

}  // namespace

Command add_teacher_topk(CLI::App& cmd) {
  struct Args {
    std::string model, device, input, out;
    int k = 32, threads = 0;
    int64_t chunk = 512, max_tokens = 0;
  };
  auto a = std::make_shared<Args>();
  cmd.footer(
      "Input: one sequence per line: token ids separated by spaces, or JSON {\"ids\": [...]} or\n"
      "{\"text\": \"...\"}. Output (safetensors): offsets I64 [S+1], ids I32 [P, k], values F32\n"
      "[P, k] (raw logits, descending), lse F32 [P] (log-sum-exp of each whole row), tokens I32\n"
      "[P]; row i of a sequence predicts its token i+1. In Python: llmk.ops.load_teacher_topk.");
  add_model_option(cmd, a->model);
  cmd.add_option("--input", a->input, "Dataset: one sequence per line (see below)")->required();
  cmd.add_option("--out", a->out, "Output .safetensors file (replaced)")->required();
  cmd.add_option("-k", a->k, "Logits kept per position")
      ->default_val(32)
      ->check(in_range(1, ops::kMaxTopk));
  cmd.add_option("--max-tokens", a->max_tokens,
                 "Cut longer sequences to this many tokens (default: a longer sequence than the "
                 "context is an error)")
      ->check(at_least<int64_t>(0));
  cmd.add_option("--chunk", a->chunk,
                 "Positions per forward pass (bounds the [chunk, vocab] float32 logits buffer)")
      ->default_val(512)
      ->check(in_range(1, 1 << 20));
  add_threads_option(cmd, a->threads);
  add_device_option(cmd, a->device);
  return [a] {
    prepare(a->model, a->threads);
    const Dataset d = read_dataset(a->input, a->model, a->max_tokens);
    int64_t longest = 0, total = 0;
    for (const auto& s : d.seqs) {
      longest = std::max<int64_t>(longest, static_cast<int64_t>(s.size()));
      total += static_cast<int64_t>(s.size());
    }
    auto model = Model::load(a->model, LoadOptions{.context = longest,
                                                   .device = resolve_device(a->device),
                                                   .progress = load_progress()});
    TeacherTopkOptions o;
    o.k = a->k;
    o.chunk = a->chunk;
    if (isatty(STDERR_FILENO) != 0) {
      o.progress = [&, n = static_cast<int64_t>(d.seqs.size())](int64_t s, int64_t p) {
        fmt::print(stderr, "\r[llmk] teacher-topk: {}/{} sequences, {}/{} positions{}", s, n, p,
                   total, s == n ? "\n" : "");
        std::fflush(stderr);
      };
    }
    const TeacherTopkStats st = export_teacher_topk(*model, d.seqs, a->out, o);
    fmt::print(stderr,
               "[llmk] wrote the top {} logits of {} positions ({} sequences{}) to {} in {:.1f} s "
               "({:.0f} positions/s)\n",
               a->k, st.positions, st.sequences,
               d.cut ? fmt::format(", {} cut to {} tokens", d.cut, a->max_tokens) : "", a->out,
               st.seconds, st.seconds > 0 ? st.positions / st.seconds : 0.0);
    return 0;
  };
}

}  // namespace llmk::cli
