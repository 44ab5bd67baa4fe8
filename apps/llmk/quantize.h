// llmk quantize (apps/llmk/quantize.cpp): the tensors and metadata of an input model, as the
// GGUF file to be written names them. A GGUF input gives its own; a Hugging Face folder is
// converted (apps/llmk/quantize_hf.cpp) the way llama.cpp's convert_hf_to_gguf.py lays it out.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "formats/gguf.h"

namespace llmk::cli::quantize {

// How a tensor's values change on the way from a Hugging Face checkpoint to GGUF.
enum class Edit {
  None,
  // Llama's Q and K: within each head, row s * (D/2) + j moves to 2j + s (rotate-half rows
  // interleaved into the adjacent pairs that GGUF files of Llama and llmk's GGUF loader expect).
  InterleaveRopeHalves,
  AddOne,  // Gemma's RMSNorm weights: GGUF stores 1 + w
};

struct SourceTensor {
  std::string name;    // GGUF name ("blk.3.attn_q.weight")
  std::string origin;  // the name in the input, for messages
  Tensor data;         // CPU, f32 / f16 / bf16 (checked later), [rows, cols] or [n]
  Edit edit = Edit::None;
  int64_t heads = 0;  // InterleaveRopeHalves: the heads stacked in the rows
};

struct Source {
  std::vector<std::pair<std::string, gguf::Value>> metadata;  // in the order to write
  std::vector<SourceTensor> tensors;                          // in the order to write
  std::vector<std::string> skipped;  // input tensors left out, with the reason
};

// A Hugging Face folder (config.json, *.safetensors, tokenizer.json) as a GGUF model that llmk's
// GGUF loader (and llama.cpp) runs like the folder: architecture and hyper-parameters, the
// tokenizer.ggml.* arrays and chat template, GGUF tensor names, Llama's Q/K rows interleaved,
// Gemma's norms plus one, Llama 3's rope factors as rope_freqs.weight. Throws llmk::Error for a
// model whose settings a GGUF file cannot carry (naming the setting).
Source read_hf_folder(const std::string& path);

}  // namespace llmk::cli::quantize
