// Where a model's weights come from, and how they are placed on the device.
//
// The model asks for tensors by their GGUF names ("blk.3.attn_q.weight"); a WeightSource finds
// them in a GGUF file, or in a Hugging Face folder under transformers' names
// ("model.layers.3.self_attn.q_proj.weight"). A WeightLoader checks each tensor's shape and
// places it: on the CPU matrices stay in the file's dtype (borrowed from the mapping) and
// vectors become f32; on CUDA vectors become f32 and matrices the activations' dtype (bf16), except
// that with bf16 activations the matrices (embeddings too) of a block type the GPU kernels read
// (kernels/quant_layout.h: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K) stay quantised,
// repacked into that file's GPU layout (keep_quantized, on by default).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "core/tensor.h"
#include "formats/gguf.h"
#include "formats/hf_quant.h"
#include "formats/safetensors.h"

namespace llmk {

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  virtual const std::string& path() const = 0;
  // The name the file uses for a GGUF-named tensor, for messages.
  virtual std::string file_name(const std::string& gguf_name) const = 0;
  // A borrowed CPU view of the tensor, or an undefined Tensor when the file lacks it.
  virtual Tensor find(const std::string& gguf_name) const = 0;
  // The file holding the tensor (a shard of a folder), for messages; path() when absent.
  virtual std::string file_of(const std::string& gguf_name) const {
    (void)gguf_name;
    return path();
  }
  // Where the sizes the model expects come from, for messages ("<folder>/config.json"); "" when
  // the weights' own file says (GGUF).
  virtual std::string config_name() const = 0;
  // The tensor of the highest layer index the file holds ("blk.31.ffn_up.weight", or its
  // transformers name), or "" when no tensor belongs to a layer; `layers` gets that index + 1.
  virtual std::string last_layer_tensor(int64_t& layers) const = 0;
};

// Throws when the file holds tensors of more layers than the config's `n_layers`: a block
// count that is too small must not run a truncated model.
void check_layer_count(const WeightSource& src, int64_t n_layers);

std::unique_ptr<WeightSource> gguf_source(const gguf::File& f);
// `layer_names`: the family's renamings within a layer (ModelConfig::hf_layer_names); `quant`:
// the folder's quantization_config (read_hf_quant), under which a linear layer packed as
// "<layer>.qweight" (AWQ, GPTQ) reads as its f16 "<layer>.weight".
std::unique_ptr<WeightSource> hf_source(
    const safetensors::Folder& f, std::vector<std::pair<std::string, std::string>> layer_names = {},
    HfQuant quant = {});

struct LoadProgress {
  int64_t done = 0, total = 0;  // tensors
  uint64_t bytes_done = 0, bytes_total = 0;
};
using ProgressFn = std::function<void(const LoadProgress&)>;

class WeightLoader {
 public:
  // act: the activation dtype on CUDA (bf16, f16 or f32), which its matrices and biases take.
  // keep_quantized: on CUDA with bf16 activations, keep the kept block types quantised (above).
  WeightLoader(const WeightSource& src, Device device, ProgressFn progress = nullptr,
               DType act = DType::BF16, bool keep_quantized = true);

  // A weight matrix [rows, cols] (also embeddings): CPU keeps the stored dtype, CUDA the
  // activations' (bf16 by default) or, for a kept block type, the block type (GPU layout).
  Tensor matrix(const std::string& name, const Shape& shape);
  // As matrix(), but on CUDA kept in pinned host memory that the GPU reads over the bus
  // (cuda::host_mapped_tensor), outside the planned device bytes: token embeddings, of which a
  // step reads one row per token.
  Tensor host_matrix(const std::string& name, const Shape& shape);
  // Norm weights: f32 on either device.
  Tensor vector(const std::string& name, const Shape& shape);
  // Like vector() but an absent tensor gives an undefined Tensor.
  Tensor optional_vector(const std::string& name, const Shape& shape);
  bool has(const std::string& name) const;

  // Several matrices (or bias vectors) stacked along their rows into one tensor, so that one
  // linear computes all their outputs. Shapes must share their columns. Possible when the parts
  // can end in one dtype: always on CUDA (the activations') and for biases (CPU f32, CUDA the
  // activations', the dtype cuBLASLt's bias epilogue takes with outputs of that dtype); on the CPU
  // when the parts' stored dtypes are equal. Biases that are all absent give an undefined Tensor.
  bool can_stack(const std::vector<std::string>& names) const;
  Tensor stacked(const std::vector<std::string>& names, const std::vector<Shape>& shapes,
                 bool is_bias = false);

  // Planning: in a first pass (planning() true) nothing is copied and undefined tensors come
  // back; the loader only adds up the bytes the device will need. finish_plan() ends it; on CUDA
  // it allocates them as one block that the tensors placed after it share (each its own
  // allocation would be rounded up to the allocator's 2 MiB: about 130 MiB over the 227 tensors
  // of a Llama-3-8B).
  bool planning() const { return planning_; }
  uint64_t planned_bytes() const { return planned_bytes_; }
  void finish_plan();

 private:
  enum class Kind { Matrix, Vector };
  Tensor place(const std::string& name, const Shape& shape, Kind kind, bool required,
               bool host_mapped = false);
  // The dtype a stored tensor of dtype `stored` takes when placed as `kind`.
  DType placed_dtype(DType stored, Kind kind) const;
  // Converts `t` to `want` (dequantising as needed, or repacking a block type for the GPU) and
  // copies it into `dst` on the device.
  void put(Tensor& dst, const Tensor& t, DType want);
  // The same conversion into `host` (a CPU tensor of dtype want): the blocks repacked into the
  // GPU layout (gpu_layout), dequantised, or copied.
  static void convert(Tensor& host, const Tensor& t, DType want, bool gpu_layout);
  void count(const Tensor& placed);
  // Where a placed tensor's bytes go: the planned block on CUDA, else a tensor of its own.
  Tensor fresh(const Shape& shape, DType dtype);
  static uint64_t planned_size(DType dtype, int64_t numel);

  const WeightSource& src_;
  Device device_;
  DType act_;  // the CUDA matrices' and biases' dtype
  bool keep_quantized_;
  ProgressFn progress_;
  bool planning_ = true;
  uint64_t planned_bytes_ = 0;  // each tensor's bytes rounded up to 512 (fresh())
  uint64_t planned_raw_ = 0;    // and not
  int64_t plan_count_ = 0;
  LoadProgress prog_;
  Tensor block_;  // the planned bytes (CUDA)
  std::shared_ptr<void> block_owner_;
  uint64_t block_used_ = 0;
};

}  // namespace llmk
