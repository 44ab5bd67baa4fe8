#include "model/model.h"

#include <algorithm>
#include <filesystem>

#include "core/error.h"
#ifdef LLMK_HAS_CUDA
#include "core/cuda/device.h"
#endif
#include "formats/hf_config.h"
#include "formats/hf_quant.h"
#include "formats/safetensors.h"
#include "model/decoder.h"
#include "ops/ops.h"
#include "tokenizer/tokenizer.h"

namespace llmk {

void Model::allocate_staging(int64_t tokens) {
  staging_ = Tensor::empty({3 * part_stride(tokens)}, DType::I32, device_);
  staging_capacity_ = tokens;
  moved_buffers();
}

template <class PosOf, class RowOf>
void Model::upload(int64_t t, const int32_t* tokens, PosOf position_of, RowOf row_of) {
  for (int64_t i = 0; tokens != nullptr && i < t; ++i) {
    LLMK_CHECK(tokens[i] >= 0 && tokens[i] < config_.vocab_size,
               "forward: token id {} is outside the vocabulary of {}", tokens[i],
               config_.vocab_size);
  }
  reserve(t, false);
  const int64_t stride = part_stride(t), n = 2 * stride + t, first = tokens ? 0 : stride;
  host_staging_.assign(static_cast<size_t>(n), 0);
  for (int64_t i = 0; i < t; ++i) {
    const int64_t pos = position_of(i);
    if (tokens) host_staging_[static_cast<size_t>(i)] = tokens[i];
    host_staging_[static_cast<size_t>(stride + i)] = static_cast<int32_t>(pos);
    host_staging_[static_cast<size_t>(2 * stride + i)] = row_of(i, pos);
  }
  Tensor dst = staging_.slice(0, first, n);
  ops::transfer(dst, Tensor::borrow(host_staging_.data() + first, {n - first}, DType::I32));
}

void Model::stage_sequence(int64_t t, const int32_t* tokens, int64_t pos, int64_t seq) {
  LLMK_CHECK(t > 0, "forward: no tokens");
  LLMK_CHECK(seq >= 0 && seq < sequences_, "forward: sequence {} of {}", seq, sequences_);
  LLMK_CHECK(pos >= 0 && pos + t <= context_,
             "forward: {} tokens at position {} do not fit the context of {} tokens", t, pos,
             context_);
  upload(
      t, tokens, [&](int64_t i) { return pos + i; },
      [&](int64_t, int64_t p) { return cache_row(seq, p); });
  staged_ = {.tokens = t, .seq = seq, .one_per_sequence = false, .pos = pos};
  on_staged();
}

void Model::stage(std::span<const int32_t> tokens, int64_t pos, int64_t seq) {
  stage_sequence(static_cast<int64_t>(tokens.size()), tokens.data(), pos, seq);
}

void Model::stage_device_token(const Tensor& id, int64_t pos, int64_t seq) {
  LLMK_CHECK(id.numel() == 1 && id.dtype() == DType::I32 && id.device() == device_,
             "forward: the staged id must be one I32 on the model's device, not {}", id.str());
  stage_sequence(1, nullptr, pos, seq);
  Tensor slot = staged_ids();
  ops::transfer(slot, id);
}

void Model::stage_step(std::span<const int32_t> tokens, std::span<const int64_t> pos) {
  const auto b = static_cast<int64_t>(tokens.size());
  LLMK_CHECK(b > 0 && b <= sequences_ && pos.size() == tokens.size(),
             "forward: {} tokens and {} positions for a step of at most {} sequences", b,
             pos.size(), sequences_);
  for (int64_t i = 0; i < b; ++i) {
    const int64_t p = pos[static_cast<size_t>(i)];
    LLMK_CHECK(p >= 0 && p < context_,
               "forward: position {} of sequence {} is outside the "
               "context of {} tokens",
               p, i, context_);
  }
  upload(
      b, tokens.data(), [&](int64_t i) { return pos[static_cast<size_t>(i)]; },
      [&](int64_t i, int64_t p) { return cache_row(i, p); });
  staged_ = {.tokens = b, .seq = 0, .one_per_sequence = true};
  on_staged();
}

void Model::stage_runs(std::span<const Run> runs, const Padding& pad) {
  const int64_t ps = kv_page_size(), pages = kv_pages();
  LLMK_CHECK(ps > 0, "forward: this model has no paged KV pool");
  LLMK_CHECK(!runs.empty(), "forward: no runs");
  int64_t t = 0, longest_table = 1, max_run = 0;
  std::vector<int64_t> run_of, pos_of;  // per token (run -1: a padding run)
  std::vector<int32_t> ids, cu{0}, logit_rows;
  for (size_t r = 0; r < runs.size(); ++r) {
    const Run& run = runs[r];
    const auto n = static_cast<int64_t>(run.tokens.size());
    LLMK_CHECK(n > 0 && run.pos >= 0 && run.pos + n <= static_cast<int64_t>(run.pages.size()) * ps,
               "forward: run {}: {} tokens at position {} do not fit its {} pages of {}", r, n,
               run.pos, run.pages.size(), ps);
    for (const int32_t p : run.pages) {
      LLMK_CHECK(p >= 0 && p < pages, "forward: run {}: page {} outside the pool of {}", r, p,
                 pages);
    }
    for (int64_t i = 0; i < n; ++i) {
      run_of.push_back(static_cast<int64_t>(r));
      pos_of.push_back(run.pos + i);
    }
    ids.insert(ids.end(), run.tokens.begin(), run.tokens.end());
    t += n;
    cu.push_back(static_cast<int32_t>(t));
    if (run.logits) logit_rows.push_back(static_cast<int32_t>(t - 1));
    longest_table = std::max<int64_t>(longest_table, static_cast<int64_t>(run.pages.size()));
    max_run = std::max(max_run, n);
  }
  auto b = static_cast<int64_t>(runs.size());
  const int32_t scratch = kv_scratch_page();
  if (pad.rows > 0) {
    LLMK_CHECK(scratch >= 0, "forward: a padded step needs the pool's scratch page (LoadOptions)");
    LLMK_CHECK(max_run == 1 && static_cast<int64_t>(logit_rows.size()) == b && pad.rows >= b &&
                   pad.width >= longest_table,
               "forward: a padded step takes runs of one token with logits, at most {} of them "
               "with at most {} pages each ({} runs, the longest {} tokens, {} pages)",
               pad.rows, pad.width, b, max_run, longest_table);
    for (; b < pad.rows; ++b) {
      run_of.push_back(-1);
      pos_of.push_back(0);
      ids.push_back(0);
      cu.push_back(static_cast<int32_t>(++t));
      logit_rows.push_back(static_cast<int32_t>(t - 1));
    }
    longest_table = pad.width;
  }
  if (t > staging_capacity_) allocate_staging(t);
  upload(
      t, ids.data(), [&](int64_t i) { return pos_of[static_cast<size_t>(i)]; },
      [&](int64_t i, int64_t p) {
        const int64_t r = run_of[static_cast<size_t>(i)];
        const int32_t page =
            r < 0 ? scratch : runs[static_cast<size_t>(r)].pages[static_cast<size_t>(p / ps)];
        return static_cast<int32_t>(page * ps + p % ps);
      });
  std::vector<int32_t> table(static_cast<size_t>(b * longest_table), scratch < 0 ? 0 : scratch);
  for (size_t r = 0; r < runs.size(); ++r) {
    const auto& pg = runs[r].pages;
    std::copy(pg.begin(), pg.end(), table.begin() + static_cast<int64_t>(r) * longest_table);
  }
  // One upload: the table, the offsets and the logit rows (runs_layout).
  const auto n_rows = static_cast<int64_t>(logit_rows.size());
  const RunsLayout layout = runs_layout(b, longest_table, n_rows);
  const int64_t n_table = b * longest_table, cu_at = layout.cu_at, rows_at = layout.rows_at;
  const int64_t total = layout.total;
  reserve_runs_buffer(total);
  host_runs_.assign(static_cast<size_t>(total), 0);
  std::copy(table.begin(), table.end(), host_runs_.begin());
  std::copy(cu.begin(), cu.end(), host_runs_.begin() + cu_at);
  std::copy(logit_rows.begin(), logit_rows.end(), host_runs_.begin() + rows_at);
  Tensor dst = runs_buf_.slice(0, 0, total);
  ops::transfer(dst, Tensor::borrow(host_runs_.data(), {total}, DType::I32));
  runs_.table = runs_buf_.slice(0, 0, n_table).view({b, longest_table});
  runs_.cu = runs_buf_.slice(0, cu_at, cu_at + b + 1);
  runs_.logit_rows = runs_buf_.slice(0, rows_at, rows_at + n_rows);
  runs_.max_run = max_run;
  runs_.host_table = std::move(table);
  runs_.host_cu = std::move(cu);
  runs_.width = longest_table;
  runs_.pos.clear();
  for (const Run& run : runs) runs_.pos.push_back(run.pos);
  for (int64_t r = static_cast<int64_t>(runs.size()); r < b; ++r) runs_.pos.push_back(0);
  staged_ = {.tokens = t, .seq = 0, .one_per_sequence = false, .pos = 0, .runs = true};
  on_staged();
}

Model::RunsLayout Model::runs_layout(int64_t runs, int64_t width, int64_t logit_rows) {
  const auto up16 = [](int64_t n) { return (n + 15) / 16 * 16; };
  RunsLayout l;
  l.cu_at = up16(runs * width);
  l.rows_at = l.cu_at + up16(runs + 1);
  l.total = l.rows_at + logit_rows;
  return l;
}

void Model::reserve_runs_buffer(int64_t elements) {
  if (runs_buf_.defined() && runs_buf_.numel() >= elements) return;
  runs_buf_ = Tensor::empty({elements}, DType::I32, device_);
  moved_buffers();
}

void Model::reserve_runs(int64_t runs, int64_t tokens, int64_t width) {
  LLMK_CHECK(runs >= 1 && tokens >= runs && width >= 1,
             "reserve_runs: {} runs of {} tokens with {} pages each", runs, tokens, width);
  if (tokens > staging_capacity_) allocate_staging(tokens);
  reserve_runs_buffer(runs_layout(runs, width, runs).total);
  reserve(tokens, true);
}

std::unique_ptr<Model> load_model(const std::string& path, const LoadOptions& opts) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::unique_ptr<WeightSource> src;
  std::optional<gguf::File> file;
  ModelConfig config;
  std::optional<safetensors::Folder> folder;
  if (fs::is_directory(path, ec)) {
    const HfConfig hf = HfConfig::open(path);
    config = ModelConfig::from_hf(hf);
    folder = safetensors::Folder::open(path);
    src = hf_source(*folder, config.hf_layer_names, read_hf_quant(hf));
  } else {
    file = gguf::File::open(path);
    config = ModelConfig::from_gguf(*file);
    src = gguf_source(*file);
  }
  LLMK_CHECK(opts.context >= 0, "context {} must not be negative", opts.context);
  LLMK_CHECK(opts.sequences >= 1 && opts.sequences <= 1024, "{} sequences: expected 1 to 1024",
             opts.sequences);
  const int64_t context =
      opts.context > 0 ? opts.context : std::min<int64_t>(config.context_length, 4096);
  LLMK_CHECK(context <= config.context_length,
             "{}: a context of {} tokens exceeds the model's {} tokens", path, context,
             config.context_length);
  // ModelConfig has rejected every architecture but the Llama family.
  std::unique_ptr<Model> m = make_decoder(path, std::move(config), context, opts, *src);
  m->gguf_ = std::move(file);
  return m;
}

ModelConfig load_config(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return ModelConfig::from_hf(HfConfig::open(path));
  return ModelConfig::from_gguf(gguf::File::open(path));
}

std::unique_ptr<Model> Model::load(const std::string& path, const LoadOptions& opts) {
  return load_model(path, opts);
}

Tokenizer load_tokenizer(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    LLMK_CHECK(fs::exists(fs::path(path) / "tokenizer.json", ec),
               "{}: no tokenizer.json in the folder (needed for text; `llmk bench` needs none)",
               path);
    return Tokenizer::from_hf_json(path);
  }
  return Tokenizer::from_gguf(gguf::File::open(path));
}

Tokenizer load_tokenizer(const Model& model, const std::string& path) {
  if (model.gguf()) return Tokenizer::from_gguf(*model.gguf());
  return load_tokenizer(path);
}

namespace {
std::optional<DType> float_type_named(const std::string& name) {
  if (name == "bf16") return DType::BF16;
  if (name == "f16" || name == "fp16") return DType::F16;
  if (name == "f32" || name == "fp32") return DType::F32;
  return std::nullopt;
}
}  // namespace

std::optional<DType> parse_dtype(const std::string& name, Device device) {
  if (name == "auto") return std::nullopt;
  const std::optional<DType> t = float_type_named(name);
  LLMK_CHECK(t.has_value(), "dtype '{}': expected auto, bf16, f16 or f32", name);
  LLMK_CHECK(
      device != Device::CPU || *t == DType::F32,
      "dtype '{}': the CPU computes in f32 (auto or f32); bf16 and f16 are for --device cuda",
      name);
  return t;
}

DType activation_dtype(Device device, std::optional<DType> dtype) {
  if (device == Device::CPU) return DType::F32;
  return dtype.value_or(DType::BF16);
}

KvType parse_kv_type(const std::string& name, Device device, std::optional<DType> dtype) {
  if (name == "auto") return KvType::Auto;
  if (name == "fp8") return KvType::FP8;
  if (name == "int8") return KvType::INT8;
  const DType act_type = activation_dtype(device, dtype);
  const std::string_view act = dtype_name(act_type);
  const std::optional<DType> t = float_type_named(name);
  LLMK_CHECK(t.has_value(), "kv dtype '{}': expected auto, {}, fp8 or int8", name, act);
  LLMK_CHECK(*t == act_type,
             "kv dtype '{}': the {} computes in {}; its cache is {} (or fp8, int8), not {}", name,
             device == Device::CPU ? "CPU" : "GPU", act, act, name);
  return KvType::Auto;
}

const char* kv_type_name(KvType t) {
  switch (t) {
    case KvType::FP8:
      return "fp8";
    case KvType::INT8:
      return "int8";
    default:
      return "auto";
  }
}

Device resolve_device(const std::string& name) {
  LLMK_CHECK(name == "auto" || name == "cpu" || name == "cuda",
             "device '{}': expected auto, cpu or cuda", name);
  if (name == "cpu") return Device::CPU;
#ifdef LLMK_HAS_CUDA
  if (name == "cuda") {
    LLMK_CHECK(cuda::available(), "device 'cuda': no usable GPU ({})", cuda::unavailable_reason());
    return Device::CUDA;
  }
  return cuda::available() ? Device::CUDA : Device::CPU;
#else
  LLMK_CHECK(name != "cuda",
             "device 'cuda': this llmk was built without CUDA (cmake --preset cuda)");
  return Device::CPU;
#endif
}

}  // namespace llmk
