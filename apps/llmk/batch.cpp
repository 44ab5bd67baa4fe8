// llmk run --prompts FILE: every prompt of FILE through the many-sequence engine (engine/engine.h)
// at once, one JSON line per prompt on stdout, in input order.
//
// A line of FILE is a prompt: plain text, or a JSON object {"prompt": "...", and optionally "n",
// "seed", "max_tokens", "temperature", "top_p", "top_k", "min_p", "presence_penalty",
// "frequency_penalty", "stop" (a string or a list of strings)}; blank lines are skipped. Output:
// {"index", "prompt", "outputs": [{"text", "token_ids", "finish_reason"}]} with finish_reason
// "stop" (an end-of-generation token, left out of the text and ids, or a stop string, the text cut
// before it) or "length".
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "apps/llmk/commands.h"
#include "core/error.h"
#include "core/text.h"
#include "core/thread_pool.h"
#include "engine/engine.h"
#include "model/model.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace llmk::cli {

namespace {

struct Prompt {
  std::string text;
  RequestOptions opts;
  std::vector<std::string> stop;
};

struct Output {
  std::vector<int32_t> ids;
  std::string text;
  std::string finish;  // "" while running
};

// The fields a JSON line may set over the command line's settings.
void apply_fields(const nlohmann::json& j, Prompt& p, const std::string& where) {
  static const std::set<std::string> known = {
      "prompt", "n",     "seed",  "max_tokens",       "temperature",
      "top_p",  "top_k", "min_p", "presence_penalty", "frequency_penalty",
      "stop"};
  for (const auto& [key, value] : j.items()) {
    LLMK_CHECK(known.count(key) != 0, "{}: unknown field \"{}\" (known: {})", where,
               printable(key, 40), fmt::join(known, ", "));
  }
  const auto number = [&](const char* key, auto& out, double lo, double hi) {
    if (!j.contains(key)) return;
    const nlohmann::json& v = j[key];
    using T = std::remove_reference_t<decltype(out)>;
    const bool integral = std::is_integral_v<T>;
    LLMK_CHECK(integral ? v.is_number_integer() : v.is_number(), "{}: \"{}\" must be {}", where,
               key, integral ? "an integer" : "a number");
    const double d = v.get<double>();
    LLMK_CHECK(d >= lo && d <= hi, "{}: \"{}\" = {} is outside [{}, {}]", where, key, v.dump(), lo,
               hi);
    out = integral ? static_cast<T>(v.get<int64_t>()) : static_cast<T>(d);
  };
  LLMK_CHECK(j.contains("prompt") && j["prompt"].is_string(),
             "{}: a JSON line needs \"prompt\" (a string)", where);
  p.text = j["prompt"].get<std::string>();
  number("n", p.opts.n, 1, 1024);
  if (j.contains("seed")) {
    LLMK_CHECK(j["seed"].is_number_unsigned(), "{}: \"seed\" must be an integer >= 0", where);
    p.opts.sampler.seed = j["seed"].get<uint64_t>();
  }
  number("max_tokens", p.opts.max_tokens, 1, 1e9);
  number("temperature", p.opts.sampler.temperature, 0, 100);
  number("top_p", p.opts.sampler.top_p, 0, 1);
  number("top_k", p.opts.sampler.top_k, 0, 1e9);
  number("min_p", p.opts.sampler.min_p, 0, 1);
  number("presence_penalty", p.opts.sampler.presence_penalty, -2, 2);
  number("frequency_penalty", p.opts.sampler.frequency_penalty, -2, 2);
  if (j.contains("stop")) {
    const nlohmann::json& s = j["stop"];
    LLMK_CHECK(s.is_string() || s.is_array(), "{}: \"stop\" must be a string or a list of them",
               where);
    for (const auto& v : s.is_string() ? nlohmann::json::array({s}) : s) {
      LLMK_CHECK(v.is_string() && !v.get<std::string>().empty(),
                 "{}: \"stop\" holds {}, not a non-empty string", where, printable(v.dump(), 40));
      p.stop.push_back(v.get<std::string>());
    }
  }
}

std::vector<Prompt> read_prompts(const std::string& path, const Prompt& defaults) {
  std::vector<Prompt> out;
  for_each_line(path, [&](const std::string& line, const std::string& where) {
    Prompt p = defaults;
    if (const auto j = json_line(line, where)) {
      apply_fields(*j, p, where);
    } else {
      p.text = line;
    }
    out.push_back(std::move(p));
  });
  LLMK_CHECK(!out.empty(), "{}: no prompts", path);
  return out;
}

}  // namespace

void add_kv_dtype_option(CLI::App& cmd, std::string& kv_dtype) {
  cmd.add_option("--kv-dtype", kv_dtype,
                 "KV cache elements: auto (the activations': bf16 on CUDA unless --dtype says "
                 "otherwise, f32 on the CPU), fp8 (E4M3) or int8, "
                 "each 8-bit row with a float scale per head: about half the memory of bf16 "
                 "(on CUDA the decode kernel reads 8-bit caches at head dims 64 and 128; others "
                 "take the slower fallback kernel)")
      ->default_val("auto");
}

int64_t parse_kv_memory(const std::string& text) {
  if (text.empty()) return 0;
  if (text == "free") return LoadOptions::kKvMemoryFree;
  double gib = 0;
  size_t used = 0;
  try {
    gib = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  LLMK_CHECK(used == text.size() && std::isfinite(gib) && gib > 0 && gib <= 1 << 20,
             "--kv-memory: '{}' is not 'free' or a size in GiB above 0", text);
  return static_cast<int64_t>(gib * static_cast<double>(1ull << 30));
}

int run_batch(const BatchArgs& a) {
  const Device device = resolve_device(a.device);
  Prompt defaults;
  defaults.opts.sampler = a.sampler;
  defaults.opts.max_tokens = a.max_tokens;
  defaults.opts.n = a.n;
  const std::vector<Prompt> prompts = read_prompts(a.prompts_file, defaults);
  const Tokenizer tok = load_tokenizer(a.model);
  // The pool: what every sample of every prompt could take, at most max_running contexts.
  std::vector<std::vector<int32_t>> ids;
  int64_t need = 0;
  std::optional<ChatTemplate> tmpl;
  if (a.chat) tmpl = chat_template_for(load_config(a.model), tok, a.model);
  for (const Prompt& p : prompts) {
    ids.push_back(encode_prompt(tok, p.text, tmpl ? &*tmpl : nullptr, a.system));
    need += (static_cast<int64_t>(ids.back().size()) + p.opts.max_tokens) * p.opts.n;
  }
  const int64_t ctx = a.ctx > 0 ? a.ctx : 4096, page = 16;
  const int64_t sequences = std::clamp<int64_t>((need + ctx - 1) / ctx, 1, a.max_running);
  auto t0 = std::chrono::steady_clock::now();
  const std::optional<DType> dtype = parse_dtype(a.dtype, device);
  auto model = Engine::load(a.model, a.ctx, sequences, page, device, a.kv_memory,
                            parse_kv_type(a.kv_dtype, device, dtype), dtype, a.batch_invariant,
                            a.quantized, a.host_embeddings);
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  t0 = std::chrono::steady_clock::now();
  Engine engine(*model, {.max_running = a.max_running, .max_step_tokens = a.step_tokens});
  const std::vector<int32_t> eog =
      a.ignore_eos ? std::vector<int32_t>{} : tok.end_of_generation_ids();
  std::vector<std::vector<Output>> outs(prompts.size());
  size_t printed = 0;
  int64_t generated = 0;
  const auto print_ready = [&] {
    for (; printed < prompts.size(); ++printed) {
      const std::vector<Output>& o = outs[printed];
      if (o.empty() ||
          std::any_of(o.begin(), o.end(), [](const Output& x) { return x.finish.empty(); })) {
        return;
      }
      nlohmann::ordered_json j = {{"index", printed}, {"prompt", prompts[printed].text}};
      j["outputs"] = nlohmann::ordered_json::array();
      for (const Output& x : o) {
        j["outputs"].push_back(
            {{"text", x.text}, {"token_ids", x.ids}, {"finish_reason", x.finish}});
      }
      const std::string line =
          j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
      fmt::print("{}\n", line);
    }
  };
  for (size_t i = 0; i < prompts.size(); ++i) {
    RequestOptions o = prompts[i].opts;
    o.stop_ids = eog;
    outs[i].resize(static_cast<size_t>(o.n));
    const std::vector<std::string>& stops = prompts[i].stop;
    engine.add_request(ids[i], o, [&, i](const TokenEvent& e) {
      Output& x = outs[i][static_cast<size_t>(e.sample)];
      ++generated;
      if (e.finish == Finish::Stop) {  // an end-of-generation token: not part of the output
        x.finish = "stop";
        return true;
      }
      x.ids.push_back(e.token);
      x.text = tok.decode(x.ids);
      for (const std::string& s : stops) {
        const size_t at = x.text.find(s);
        if (at != std::string::npos) {
          x.text.resize(at);
          x.finish = "stop";
          return false;
        }
      }
      if (e.finish == Finish::Length) x.finish = "length";
      return true;
    });
  }
  while (!engine.idle()) {
    engine.step();
    print_ready();
  }
  check_stdout();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto st = engine.scheduler_stats();
  const auto kv = engine.kv_stats();
  fmt::print(stderr,
             "[llmk] load {:.2f} s | {} prompts, {} tokens generated in {:.2f} s ({:.1f} "
             "tokens/s, prompts included) | pool {} pages of {} tokens | prefix hits {} tokens | "
             "preemptions {} | {}\n",
             load_s, prompts.size(), generated, s, s > 0 ? generated / s : 0.0, kv.pages, page,
             kv.prefix_hit_tokens, st.preemptions,
             device == Device::CPU ? cpu_summary() : std::string("cuda"));
  return 0;
}

}  // namespace llmk::cli
