// A loaded model: configuration, weights, KV cache and the forward pass.
//
// forward() = stage() + compute(). stage() copies the token ids and their positions into
// device buffers (it checks them on the host); compute() runs the network on whatever is
// staged, calling ops only, so on CUDA one compute(1, false) can be captured in a graph and
// replayed after each stage(). The device sets the layout (decoder.cpp, weights.cpp): matrices
// keep the file's type on the CPU and take the activations' on CUDA; activations and the KV
// cache are f32 on the CPU and bf16 on CUDA (or fp16 or f32: LoadOptions::dtype); the KV pool has
// one page per sequence on the CPU and 64-key pages on CUDA, where a prompt of more than 8 tokens
// runs the prefill kernel over contiguous keys: the projection's own from position 0, else its keys
// gathered from the pages. These branches read host state only (the device, the staged tokens and
// position), never device memory.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "formats/gguf.h"
#include "model/config.h"
#include "model/weights.h"

namespace llmk {

class Tokenizer;

// --dtype: "auto" (nullopt: f32 on the CPU, bf16 on CUDA), or bf16, f16 (fp16) or f32 (fp32)
// where the device computes in it (the CPU: f32 only). Throws llmk::Error for anything else.
std::optional<DType> parse_dtype(const std::string& name, Device device);
// The activations' dtype on `device` for LoadOptions::dtype `dtype`.
DType activation_dtype(Device device, std::optional<DType> dtype);
// "auto", "fp8" or "int8" as a KvType; the activations' own type (activation_dtype of `dtype`:
// "f32" on the CPU, "bf16" on CUDA by default) names Auto. Throws llmk::Error for anything else.
KvType parse_kv_type(const std::string& name, Device device,
                     std::optional<DType> dtype = std::nullopt);
const char* kv_type_name(KvType t);

struct LoadOptions {
  int64_t context = 0;    // KV cache length in tokens; 0 = min(model's context, 4096)
  int64_t sequences = 1;  // sequences decoded together, each with its own KV cache
  Device device = Device::CPU;
  ProgressFn progress = nullptr;  // called after each tensor is placed
  int64_t page_size = 0;  // KV pool page in tokens; 0: 64 on CUDA, the whole context on the CPU
  // The paged KV pool's size in bytes (whole pages of page_size tokens, for the many-sequence
  // engine, which hands pages out itself): 0 holds sequences x context; > 0 this many bytes;
  // kKvMemoryFree what the GPU has free after the weights, the activations of a 512-token step
  // and a margin, less a tenth (on the CPU: sequences x context). At least one context's worth.
  int64_t kv_memory = 0;
  static constexpr int64_t kKvMemoryFree = -1;
  // One pool page more than the above, kept out of kv_pages() (Model::kv_scratch_page): where the
  // padding rows of a padded step (Model::Padding) write their keys.
  bool scratch_page = false;
  // The KV cache's element type: Auto (the activations': f32 on the CPU, bf16 on CUDA), or 8-bit
  // with a float scale per row and head (kernels/kv_quant.h), about half the memory of bf16.
  KvType kv_type = KvType::Auto;
  // The activations' dtype on CUDA: bf16 (nullopt, the default), f16 or f32; the weights are
  // converted to it at load. The CPU computes in f32 (f32 or nullopt only).
  std::optional<DType> dtype;
  // CUDA with bf16 activations: keep the GGUF matrices (embeddings too) of the types the GPU
  // kernels read (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K) quantised on the GPU, about a
  // quarter to a half of their bf16 bytes; decode multiplies the file's exact weights
  // (kernels/cuda/gemm/qlinear.h). false: convert them to the activations' dtype at load (faster
  // prefill, which reads quantised weights through bands dequantised to bf16; docs/perf.md).
  bool quantized_weights = true;
  // CUDA: every forward under ops::BatchInvariance, so that a sequence's logits are the same bits
  // whatever runs beside it in a batch (and whatever batch runs first); slower.
  bool batch_invariant = false;
  // CUDA: keep the token embeddings of a model whose output layer is its own in pinned host
  // memory, which the GPU reads a row per token over the bus, instead of on the GPU (282 MiB of a
  // Q4_K_M Llama-3-8B, 1 GiB in bf16). Tied embeddings (the output layer reads them all every
  // step) stay on the GPU.
  bool host_embeddings = true;
};

class Model {
 public:
  virtual ~Model() = default;

  // Opens a GGUF file, or a Hugging Face folder (config.json + safetensors), and builds the
  // model for its architecture on opts.device. On CUDA the bytes needed (weights, KV cache,
  // activations) are checked against free GPU memory before anything is copied.
  static std::unique_ptr<Model> load(const std::string& path, const LoadOptions& opts = {});

  const ModelConfig& config() const { return config_; }
  // The GGUF file the model came from (tokenizer, metadata); nullopt for Hugging Face folders.
  const std::optional<gguf::File>& gguf() const { return gguf_; }
  const std::string& path() const { return path_; }
  int64_t context() const { return context_; }  // per sequence
  // The KV cache's element type (LoadOptions::kv_type resolved: f32, bf16, f8e4m3 or i8).
  virtual DType kv_dtype() const = 0;
  // The activations' element type (LoadOptions::dtype resolved: f32, bf16 or f16).
  virtual DType dtype() const = 0;
  int64_t sequences() const { return sequences_; }
  Device device() const { return device_; }

  // Runs tokens at positions pos..pos+T-1 (pos + T <= context()), appending their keys and
  // values to the cache. Returns logits [T, vocab] f32 when all_logits, else [1, vocab] for the
  // last token, on the model's device, in model-owned memory valid until the next call.
  Tensor forward(std::span<const int32_t> tokens, int64_t pos, bool all_logits) {
    stage(tokens, pos);
    return compute(static_cast<int64_t>(tokens.size()), all_logits);
  }
  // Stages T tokens of sequence `seq` at positions pos..pos+T-1 (a prefill, or one step).
  void stage(std::span<const int32_t> tokens, int64_t pos, int64_t seq = 0);
  // Stages one token for each of sequences 0..B-1 (B = tokens.size()), token b at position
  // pos[b] of sequence b: one batched decode step; compute(B, true) gives B rows of logits.
  void stage_step(std::span<const int32_t> tokens, std::span<const int64_t> pos);
  // The paged KV pool, for a caller that hands out its pages itself (engine/engine.h): kv_pages()
  // pages of kv_page_size() tokens. With stage_runs only: the model's own page bookkeeping
  // (stage, stage_step) must not be used on the same model.
  virtual int64_t kv_page_size() const { return 0; }
  virtual int64_t kv_pages() const { return 0; }
  // The pool page past kv_pages() that LoadOptions::scratch_page kept aside; -1 without one.
  virtual int32_t kv_scratch_page() const { return -1; }
  // Copies the first `rows` rows of pool page src into page dst, K and V of every layer (a
  // shared page's copy before a write).
  virtual void copy_kv_page(int32_t src, int32_t dst, int64_t rows) = 0;
  // One step of several sequences: each run is `tokens` at positions pos, pos + 1, ... of its
  // own sequence, whose keys live in the pool pages `pages` (key j in page pages[j / page size]),
  // those before pos already written. compute(T, false) (T: all runs' tokens) then gives the
  // logits of the last token of each run with `logits`, in run order: [runs with logits, vocab].
  struct Run {
    std::span<const int32_t> tokens;
    int64_t pos = 0;
    std::span<const int32_t> pages;
    bool logits = false;
  };
  // A step whose shapes do not depend on the runs (one captured graph replays it for any runs
  // of one token each, up to `rows` of them): the runs are padded to `rows` runs, each padding run
  // token 0 at position 0 in kv_scratch_page() (its logits computed and not meant to be read),
  // and the page table is `width` pages wide. rows = 0: no padding.
  struct Padding {
    int64_t rows = 0;
    int64_t width = 0;
  };
  void stage_runs(std::span<const Run> runs, const Padding& pad);
  void stage_runs(std::span<const Run> runs) { stage_runs(runs, Padding{}); }
  // Sizes what stage_runs and compute use for steps of up to `runs` runs, `tokens` tokens and page
  // tables `width` pages wide, so that such steps allocate nothing (a captured graph keeps the
  // addresses it saw).
  void reserve_runs(int64_t runs, int64_t tokens, int64_t width);
  // Changes whenever a buffer that compute() reads or writes is allocated anew (graphs captured
  // before then are stale).
  int64_t buffers_generation() const { return generation_; }
  // Stages one token of sequence `seq` at position `pos` whose id is on the device ([1] I32, on
  // the model's device): copied there in stream order, so it may be the output of work still
  // queued (the decoder's next step, enqueued before the host has read the id).
  void stage_device_token(const Tensor& id, int64_t pos, int64_t seq = 0);
  virtual Tensor compute(int64_t t, bool all_logits) = 0;
  // Makes sure activations for `t` tokens exist (compute() allocates nothing after this).
  virtual void reserve(int64_t t, bool all_logits) = 0;
  // Whether a captured decode step of `batch` sequences ran faster with its kernels releasing the
  // next one first (cuda::release_dependents_first), once the decoder has timed both
  // (engine/generator.cpp); nullopt before.
  std::optional<bool> release_first(int64_t batch) const {
    const auto it = release_first_.find(batch);
    return it == release_first_.end() ? std::nullopt : std::optional<bool>(it->second);
  }
  void set_release_first(int64_t batch, bool first) { release_first_[batch] = first; }

 protected:
  Model(std::string path, ModelConfig config, int64_t context, int64_t sequences, Device device)
      : path_(std::move(path)),
        config_(std::move(config)),
        context_(context),
        sequences_(sequences),
        device_(device) {}
  // What compute() reads for the staged tokens, on the model's device: their ids, positions
  // within their sequences, and the rows of the KV cache (sequence * context + position) they
  // write. One buffer for all three (each part starts at a multiple of 16 entries), so that a
  // step uploads them with one copy.
  Tensor staged_ids() const { return staging_.slice(0, 0, staged_.tokens); }
  Tensor staged_positions() const { return staged_part(1); }
  Tensor staged_rows() const { return staged_part(2); }
  // Sizes the staging buffer for up to `tokens` tokens a call.
  void allocate_staging(int64_t tokens);
  // A buffer compute() uses was allocated anew (buffers_generation()).
  void moved_buffers() { ++generation_; }
  // What is staged: `tokens` of sequence `seq`, or (one_per_sequence) one token of each of the
  // first `tokens` sequences.
  struct Staged {
    int64_t tokens = 0;
    int64_t seq = 0;
    bool one_per_sequence = false;
    int64_t pos = 0;    // position of the first token (single sequence)
    bool runs = false;  // stage_runs: the runs' page table, offsets and logit rows below
  } staged_;
  // For stage_runs, on the model's device: the page table [runs, longest table] I32, the runs'
  // query offsets [runs + 1] I32, the rows whose logits are wanted [n] I32; the longest run.
  // (All three are views of one buffer, uploaded with one copy.)
  struct StagedRuns {
    Tensor table, cu, logit_rows;
    int64_t max_run = 0;
    // The same on the host: the table [runs, width], the offsets [runs + 1], first positions.
    std::vector<int32_t> host_table, host_cu;
    std::vector<int64_t> pos;
    int64_t width = 0;
  } runs_;
  // The KV-cache row that holds position `pos` of sequence `seq`; stage() and stage_step() ask
  // it for every staged token (a paged cache allocates the page here). Default: a contiguous
  // region of context() rows per sequence.
  virtual int32_t cache_row(int64_t seq, int64_t pos) {
    return static_cast<int32_t>(seq * context_ + pos);
  }
  // Called at the end of stage() and stage_step(), once staged_ is set (uploads of per-step
  // cache metadata such as page tables).
  virtual void on_staged() {}

 private:
  friend std::unique_ptr<Model> load_model(const std::string&, const LoadOptions&);
  std::string path_;
  std::optional<gguf::File> gguf_;
  ModelConfig config_;
  int64_t context_;
  int64_t sequences_;
  Device device_;
  Tensor staging_;
  std::vector<int32_t> host_staging_;
  static int64_t part_stride(int64_t t) { return (t + 15) / 16 * 16; }
  Tensor staged_part(int i) const {
    const int64_t t = staged_.tokens, at = i * part_stride(t);
    return staging_.slice(0, at, at + t);
  }
  // Fills the staging buffer's parts for `t` tokens (ids: `tokens`, or none when null, the ids
  // being put there on the device; positions and rows: position_of(i), row_of(i, position))
  // and uploads them.
  template <class PosOf, class RowOf>
  void upload(int64_t t, const int32_t* tokens, PosOf position_of, RowOf row_of);
  int64_t staging_capacity_ = 0;
  int64_t generation_ = 0;
  Tensor runs_buf_;  // stage_runs' table | cu | logit rows (I32, runs_layout)
  // Where runs_buf_'s parts start for `runs` runs, tables `width` wide and `logit_rows` rows: the
  // table at 0, the offsets and the logit rows each at a multiple of 16; total elements.
  struct RunsLayout {
    int64_t cu_at, rows_at, total;
  };
  static RunsLayout runs_layout(int64_t runs, int64_t width, int64_t logit_rows);
  void reserve_runs_buffer(int64_t elements);  // grows runs_buf_ (moved_buffers)
  std::vector<int32_t> host_runs_;
  // stage()'s body; tokens null: the ids are put on the device by the caller.
  void stage_sequence(int64_t t, const int32_t* tokens, int64_t pos, int64_t seq);
  std::map<int64_t, bool> release_first_;
};

// The tokenizer of a GGUF file or of a Hugging Face folder (its tokenizer.json); `path` names
// the model in errors.
// The model's configuration alone (GGUF metadata or config.json), without its weights.
ModelConfig load_config(const std::string& path);

Tokenizer load_tokenizer(const std::string& path);
// The same, reusing the model's open GGUF file when it has one.
Tokenizer load_tokenizer(const Model& model, const std::string& path);

// "cpu", "cuda", or "auto" (cuda where a GPU and a CUDA build exist) as a Device; throws
// llmk::Error for another name, or cuda without a usable GPU or a CUDA build.
Device resolve_device(const std::string& name);

}  // namespace llmk
