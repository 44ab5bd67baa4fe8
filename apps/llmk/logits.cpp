// llmk logits: the logits of a fixed token sequence, for comparisons with other engines.
// The first --prefill tokens run as one batched pass; every later token runs as a decode step
// (graph-replayed on CUDA), exactly as generation would run it. Writes float32 [n_ids, vocab]
// row-major to --out: row i holds the logits after token i.
#include <fmt/format.h>

#include "apps/llmk/commands.h"
#include "core/error.h"
#include "core/text.h"
#include "engine/generator.h"
#include "formats/mapped_file.h"
#include "model/model.h"
#include "ops/ops.h"

namespace llmk::cli {

Command add_logits(CLI::App& cmd) {
  struct Args {
    std::string model, device, ids_file, out, dtype;
    int prefill = 0, threads = 0;
    bool quantized = true, cpu_int8 = false, host_embeddings = true;
  };
  auto a = std::make_shared<Args>();
  add_model_option(cmd, a->model);
  cmd.add_option("--ids", a->ids_file, "File of whitespace-separated token ids")->required();
  cmd.add_option("--prefill", a->prefill,
                 "How many of the ids run as one prefill pass (default: all); the rest run one "
                 "decode step each")
      ->check(at_least(0));
  cmd.add_option("--out", a->out,
                 "Output file: float32 logits [n_ids, vocab], row i predicting id i+1")
      ->required();
  add_threads_option(cmd, a->threads);
  add_cpu_int8_flag(cmd, a->cpu_int8);
  add_device_option(cmd, a->device);
  add_dtype_option(cmd, a->dtype);
  add_quantized_weights_flag(cmd, a->quantized);
  add_gpu_embeddings_flag(cmd, a->host_embeddings);
  return [a] {
    prepare(a->model, a->threads, a->cpu_int8);
    const std::vector<int32_t> ids =
        parse_token_ids(formats::read_file(a->ids_file, kMaxTextBytes), a->ids_file);
    LLMK_CHECK(!ids.empty(), "{}: no token ids", a->ids_file);
    const auto n = static_cast<int64_t>(ids.size());
    LLMK_CHECK(a->prefill <= n, "--prefill {} is more than the {} ids of {}", a->prefill, n,
               a->ids_file);
    const int64_t prefill = a->prefill > 0 ? a->prefill : n;
    const Device device = resolve_device(a->device);
    auto model = Model::load(a->model, LoadOptions{.context = n,
                                                   .device = device,
                                                   .progress = load_progress(),
                                                   .dtype = parse_dtype(a->dtype, device),
                                                   .quantized_weights = a->quantized,
                                                   .host_embeddings = a->host_embeddings});
    const int64_t vocab = model->config().vocab_size;
    for (size_t i = 0; i < ids.size(); ++i) {
      LLMK_CHECK(ids[i] < vocab, "{}: element {} ({}) is outside the model's vocabulary of {}",
                 a->ids_file, i + 1, ids[i], vocab);
    }
    Tensor host = Tensor::empty({n, vocab}, DType::F32);
    Tensor all = model->forward({ids.data(), static_cast<size_t>(prefill)}, 0, true);
    Tensor first = host.slice(0, 0, prefill);
    ops::transfer(first, all);
    SamplerConfig greedy;
    greedy.temperature = 0;
    Decoder dec(*model, greedy, /*cuda_graph=*/true);
    for (int64_t i = prefill; i < n; ++i) {
      dec.step(ids[static_cast<size_t>(i)], i);
      Tensor row = host.slice(0, i, i + 1);
      ops::transfer(row, dec.last_logits());
    }
    write_file(a->out, {static_cast<const char*>(host.data()), static_cast<size_t>(host.nbytes())});
    fmt::print(stderr, "[llmk] wrote logits [{}, {}] ({} prefill + {} decode steps) to {}\n", n,
               vocab, prefill, n - prefill, a->out);
    return 0;
  };
}

}  // namespace llmk::cli
