// llmk bench: prefill and decode speed on random token ids, with no tokenizer involved.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <random>

#include "apps/llmk/commands.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/engine.h"
#include "engine/generator.h"
#include "kernels/cpu/isa.h"
#include "model/model.h"
#include "ops/ops.h"

#ifdef LLMK_HAS_CUDA
#include "core/cuda/allocator.h"
#include "core/cuda/device.h"
#endif

namespace llmk::cli {

namespace {
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}
double median(std::vector<double> v);

// --concurrency C: C requests of random prompts through the many-sequence engine at once, each
// generating --gen-tokens tokens greedily (end of sequence ignored), --reps times; output
// tokens/s over the whole run and the median step latency.
int bench_concurrency(const std::string& path, const std::string& device, int concurrency,
                      int prompt_tokens, int gen_tokens, int reps, uint64_t seed, bool graphs,
                      const std::string& kv_dtype, const std::string& dtype, bool invariant,
                      bool quantized, bool host_embeddings, int64_t kv_memory,
                      const std::string& json) {
  const int64_t ctx = int64_t{prompt_tokens} + gen_tokens + 1;
  const Device dev = resolve_device(device);
  const std::optional<DType> act = parse_dtype(dtype, dev);
  auto model =
      Engine::load(path, ctx, concurrency, 16, dev, kv_memory, parse_kv_type(kv_dtype, dev, act),
                   act, invariant, quantized, host_embeddings);
  const ModelConfig& c = model->config();
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(c.vocab_size - 1));
  RequestOptions o;
  o.sampler.temperature = 0;
  o.max_tokens = gen_tokens;
  std::vector<double> run_s, step_ms;
  int64_t tokens = 0, graph_steps = 0, steps = 0;
  for (int rep = 0; rep <= reps; ++rep) {  // rep 0 warms up
    Engine engine(*model, {.max_running = concurrency,
                           .max_step_tokens = std::max<int64_t>(512, concurrency),
                           .cuda_graphs = graphs});
    int64_t generated = 0;
    for (int r = 0; r < concurrency; ++r) {
      std::vector<int32_t> prompt(static_cast<size_t>(prompt_tokens));
      for (int32_t& id : prompt) id = pick(rng);
      engine.add_request(std::move(prompt), o, [&](const TokenEvent&) {
        ++generated;
        return true;
      });
    }
    const auto t0 = Clock::now();
    while (!engine.idle()) {
      const auto t1 = Clock::now();
      engine.step();
      if (rep > 0) step_ms.push_back(ms_since(t1));
    }
    if (rep > 0) {
      run_s.push_back(ms_since(t0) / 1000);
      tokens = generated;
      graph_steps += engine.graph_steps();
    }
  }
  const double s = median(run_s), step = median(step_ms);
  steps = static_cast<int64_t>(step_ms.size());
  const double tps = static_cast<double>(tokens) / s;
  if (!json.empty()) {
    const nlohmann::json out = {{"model", path},
                                {"config", c.summary()},
                                {"device", model->device() == Device::CPU ? "cpu" : "cuda"},
                                {"concurrency", concurrency},
                                {"dtype", dtype_name(model->dtype())},
                                {"kv_dtype", dtype_name(model->kv_dtype())},
                                {"kv_pages", model->kv_pages()},
                                {"prompt_tokens", prompt_tokens},
                                {"gen_tokens", gen_tokens},
                                {"reps", reps},
                                {"output_tokens", tokens},
                                {"seconds_median", s},
                                {"output_tokens_per_s", tps},
                                {"step_ms_median", step},
                                {"steps", steps},
                                {"graph_steps", graph_steps},
                                {"threads", cpu_pool().num_threads()},
                                {"cpu_isa", cpu::isa_name(cpu::isa())}};
    write_file(json, out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
  }
  fmt::print("model: {}\n", c.summary());
  fmt::print("activations: {}; kv cache: {}, {} pages of {} tokens\n", dtype_name(model->dtype()),
             dtype_name(model->kv_dtype()), model->kv_pages(), model->kv_page_size());
  if (model->device() == Device::CPU) {
    fmt::print("{}\n", cpu_summary());
  } else {
    fmt::print("cuda, {} of {} steps replayed from CUDA graphs\n", graph_steps, steps);
  }
  fmt::print(
      "concurrency {}: {} requests of {} + {} tokens: {} output tokens in {:.2f} s = {:.1f} "
      "tokens/s (median of {} runs, prompts included); step median {:.2f} ms\n",
      concurrency, concurrency, prompt_tokens, gen_tokens, tokens, s, tps, reps, step);
  return 0;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
}  // namespace

Command add_bench(CLI::App& cmd) {
  struct Args {
    std::string model, device, json, kv_dtype, kv_memory, dtype;
    int prompt_tokens = 512, gen_tokens = 128, batch = 1, reps = 3, threads = 0, concurrency = 0;
    bool no_graph = false, batch_invariant = false, quantized = true, cpu_int8 = false,
         host_embeddings = true;
    bool no_lookahead = false;
    uint64_t seed = 1;
  };
  auto a = std::make_shared<Args>();
  add_model_option(cmd, a->model);
  cmd.add_option("--prompt-tokens", a->prompt_tokens, "Tokens in the prompt (prefill)")
      ->default_val(512)
      ->check(at_least(1));
  cmd.add_option("--gen-tokens", a->gen_tokens,
                 "Tokens to generate after the prompt: the first comes from the prefill, each "
                 "other from one timed decode step (1: prefill only)")
      ->default_val(128)
      ->check(at_least(1));
  cmd.add_option("--batch", a->batch,
                 "Sequences decoded together (each its own prompt and KV cache); decode "
                 "tokens/s counts all of them")
      ->default_val(1)
      ->check(in_range(1, 1024));
  cmd.add_option("--concurrency", a->concurrency,
                 "Run this many requests at once through the many-sequence engine and report "
                 "output tokens/s and the median step latency")
      ->check(in_range(1, 4096));
  cmd.add_option("--reps", a->reps, "Timed repetitions (after one warm-up); medians reported")
      ->default_val(3)
      ->check(at_least(1));
  cmd.add_option("--json", a->json, "Also write the results to this JSON file");
  cmd.add_option("--seed", a->seed, "Seed of the random token ids")
      ->default_val(1)
      ->check(at_least<int64_t>(0));
  cmd.add_flag("--no-graph", a->no_graph,
               "On CUDA, launch each decode step without a graph (with --concurrency: every "
               "engine step eager)");
  cmd.add_flag("--no-lookahead", a->no_lookahead,
               "On CUDA, read each step's token back before enqueueing the next step (by "
               "default the next step is enqueued first, fed with the argmax on the device)");
  add_kv_dtype_option(cmd, a->kv_dtype);
  cmd.add_option("--kv-memory", a->kv_memory,
                 "With --concurrency: GiB for the KV cache's pages, or 'free' (default: "
                 "--concurrency contexts)");
  add_threads_option(cmd, a->threads);
  add_cpu_int8_flag(cmd, a->cpu_int8);
  add_device_option(cmd, a->device);
  add_dtype_option(cmd, a->dtype);
  add_quantized_weights_flag(cmd, a->quantized);
  add_gpu_embeddings_flag(cmd, a->host_embeddings);
  add_batch_invariant_flag(cmd, a->batch_invariant);
  return [a] {
    prepare(a->model, a->threads, a->cpu_int8);
    if (a->concurrency > 0) {
      LLMK_CHECK(a->batch == 1, "give --batch or --concurrency, not both");
    } else {
      LLMK_CHECK(a->kv_memory.empty(), "--kv-memory needs --concurrency");
      LLMK_CHECK(!a->batch_invariant, "--batch-invariant needs --concurrency");
    }
    if (a->concurrency > 0) {
      return bench_concurrency(a->model, a->device, a->concurrency, a->prompt_tokens, a->gen_tokens,
                               a->reps, a->seed, !a->no_graph, a->kv_dtype, a->dtype,
                               a->batch_invariant, a->quantized, a->host_embeddings,
                               parse_kv_memory(a->kv_memory), a->json);
    }
    const Device device = resolve_device(a->device);
    const std::optional<DType> dtype = parse_dtype(a->dtype, device);
    // int64: --prompt-tokens and --gen-tokens may each be up to INT_MAX; the model's context
    // check rejects a sum it cannot hold.
    const int64_t ctx = int64_t{a->prompt_tokens} + a->gen_tokens + 1;
    auto model =
        Model::load(a->model, LoadOptions{.context = ctx,
                                          .sequences = a->batch,
                                          .device = device,
                                          .progress = load_progress(),
                                          .kv_type = parse_kv_type(a->kv_dtype, device, dtype),
                                          .dtype = dtype,
                                          .quantized_weights = a->quantized,
                                          .host_embeddings = a->host_embeddings});
    const ModelConfig& c = model->config();
    // What the weights and caches hold before any step runs: the rest of the peak is the steps'.
    [[maybe_unused]] size_t loaded_bytes = 0;
#ifdef LLMK_HAS_CUDA
    if (device == Device::CUDA) loaded_bytes = cuda::allocator().stats().bytes_reserved;
#endif
    std::mt19937_64 rng(a->seed);
    std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(c.vocab_size - 1));
    const auto batch = static_cast<size_t>(a->batch);
    std::vector<std::vector<int32_t>> prompts(batch);
    for (auto& prompt : prompts) {
      prompt.resize(static_cast<size_t>(a->prompt_tokens));
      for (int32_t& id : prompt) id = pick(rng);
    }

    SamplerConfig greedy;
    greedy.temperature = 0;
    std::vector<double> prefill_ms, step_ms;
    bool lookahead = false;
    ops::reset_attention_stats();
    for (int rep = 0; rep <= a->reps; ++rep) {  // rep 0 warms up (graph capture, algorithms)
      Decoder dec(*model, greedy, !a->no_graph, !a->no_lookahead);
      lookahead = dec.lookahead() && a->batch == 1;  // step_batch does not look ahead
      std::vector<int32_t> ids(batch);
      auto t0 = Clock::now();
      // Each prefill waits for the device: its next token is read back.
      for (size_t b = 0; b < batch; ++b)
        ids[b] = dec.prefill(prompts[b], 0, static_cast<int64_t>(b));
      const double p_ms = ms_since(t0);
      if (rep > 0) prefill_ms.push_back(p_ms);
      std::vector<int64_t> pos(batch);
      for (int i = 0; i < a->gen_tokens - 1; ++i) {
        std::fill(pos.begin(), pos.end(), int64_t{a->prompt_tokens} + i);
        auto t1 = Clock::now();
        if (batch == 1) {
          ids[0] = dec.step(ids[0], pos[0]);
        } else {
          ids = dec.step_batch(ids, pos);
        }
        if (rep > 0) step_ms.push_back(ms_since(t1));
      }
    }
    const double p_med = median(prefill_ms), s_med = median(step_ms);
    const double prompt_tps = a->batch * static_cast<double>(a->prompt_tokens) / (p_med / 1000);
    nlohmann::json out = {
        {"model", a->model},
        {"config", c.summary()},
        {"device", device == Device::CPU ? "cpu" : "cuda"},
        {"dtype", dtype_name(model->dtype())},
        {"prompt_tokens", a->prompt_tokens},
        {"gen_tokens", a->gen_tokens},
        {"reps", a->reps},
        {"prefill_ms_median", p_med},
        {"batch", a->batch},
        {"prefill_tokens_per_s", prompt_tps},
        {"decode_ms_per_step_median", step_ms.empty() ? nlohmann::json() : nlohmann::json(s_med)},
        {"decode_tokens_per_s",
         step_ms.empty() ? nlohmann::json() : nlohmann::json(a->batch * 1000 / s_med)},
        {"cuda_graph", device == Device::CUDA && !a->no_graph},
        {"lookahead", lookahead},
    };
    // The captured step's launch setting the decoder timed faster (engine/generator.cpp).
    if (const auto first = model->release_first(a->batch)) out["release_first"] = *first;
    const ops::AttentionStats att = ops::attention_stats();
    out["attention_calls"] = {{"prefill", att.prefill},
                              {"decode", att.decode},
                              {"chunked", att.chunked},
                              {"fallback", att.fallback},
                              {"cpu", att.cpu}};
    std::string where = cpu_summary();
    if (device == Device::CUDA) where = fmt::format("{} activations", dtype_name(model->dtype()));
#ifdef LLMK_HAS_CUDA
    if (device == Device::CUDA) {
      const auto st = cuda::allocator().stats();
      out["peak_gpu_memory_mib"] = st.peak_reserved / 1048576.0;
      out["peak_gpu_memory_in_use_mib"] = st.peak_in_use / 1048576.0;
      out["gpu_memory_after_load_mib"] = loaded_bytes / 1048576.0;
      out["gpu"] = cuda::device_info().name;
      where = fmt::format(
          "{}, {}, peak GPU memory {:.0f} MiB (after loading {:.0f}; peak in use {:.0f})",
          cuda::device_info().name, where, st.peak_reserved / 1048576.0, loaded_bytes / 1048576.0,
          st.peak_in_use / 1048576.0);
    }
#endif
    // The file first: a failed write leaves nothing on stdout that reads as a result.
    if (!a->json.empty()) {
      write_file(a->json, out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
    }
    fmt::print("model: {}\n{}\nprefill: {} x {} tokens in {:.2f} ms = {:.0f} tokens/s\n",
               c.summary(), where, a->batch, a->prompt_tokens, p_med, prompt_tps);
    if (step_ms.empty()) {
      fmt::print("decode:  none (--gen-tokens 1)\n");
    } else {
      fmt::print("decode:  batch {}: {:.3f} ms/step = {:.1f} tokens/s (median of {} steps)\n",
                 a->batch, s_med, a->batch * 1000 / s_med, step_ms.size());
    }
    fmt::print("{}\n", attention_stats_line());
    return 0;
  };
}

}  // namespace llmk::cli
