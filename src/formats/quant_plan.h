// Which type each tensor of a model takes under `llmk quantize --type`: the quantisation types
// and llama.cpp's Q4_K_M mix, decided from a tensor's GGUF name and shape alone.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "core/dtype.h"
#include "core/tensor.h"

namespace llmk::quant {

// F32, F16 and BF16 quantise nothing: every weight matrix is written in that float type (a
// Hugging Face folder converted to GGUF as it is).
enum class Scheme { Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, Q4_K_M, F32, F16, BF16 };

// "q8_0", ..., "q4_k_m" (case-insensitive); nullopt for other names.
std::optional<Scheme> parse_scheme(std::string_view name);
std::string_view scheme_name(Scheme s);
// "q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k, q4_k_m, f32, f16, bf16".
std::string scheme_names();
// llama.cpp's general.file_type (enum llama_ftype) for the scheme. The single k-quant types have
// no "pure" file type; they take the _S variant of their size (Q4_K_S, Q5_K_S) and Q6_K.
uint32_t llama_file_type(Scheme s);

// What a tensor becomes, and why when that is not the scheme's main type.
struct TensorPlan {
  DType dtype = DType::F32;
  // "" when quantised as the scheme asks; else a short reason for the summary, the same for
  // every tensor it applies to ("1-D", "row of 200 is not whole q8_0 blocks", "Q4_K_M: output",
  // "q4_K fallback: row of 640 is not whole q4_K blocks").
  std::string why;
  bool quantized() const { return is_quantized(dtype); }
};

struct ModelShape {
  int64_t n_layers = 0;     // highest blk.N index + 1
  bool has_output = false;  // output.weight exists (else the embeddings are tied to it)
};

// The plan for tensor `name` ([rows, cols], row-major; `src` f32, f16 or bf16). The rules:
//  - 1-D tensors (norm weights, biases, rope_freqs) become f32, as llama.cpp's converter writes
//    them; other tensors that are not "*.weight" matrices, and "*_norm.weight" of any shape,
//    keep `src`.
//  - every other weight matrix takes the scheme's type (token_embd too, as llama.cpp does);
//    Q4_K_M picks per tensor, following llama.cpp's llama_tensor_get_type for LLAMA_FTYPE_MOSTLY
//    _Q4_K_M on these architectures:
//      output.weight (token_embd.weight when there is none: tied)     -> Q6_K
//      blk.N.attn_v.weight and blk.N.ffn_down.weight, for the layers
//        where use_more_bits(N): N < L/8, N >= 7L/8, or (N - L/8) % 3 == 2  -> Q6_K
//      blk.N.attn_qkv.weight (Phi-3's fused Q|K|V)                   -> Q5_K
//      every other weight matrix                                     -> Q4_K
//  - a row (cols) that is not whole blocks of that type falls back as llama.cpp does: Q4_K to
//    Q5_0, Q5_K to Q5_1, Q6_K to Q8_0 (32-wide blocks); a row that is not whole 32-blocks either
//    keeps `src` (llama.cpp would write f16).
TensorPlan plan_tensor(Scheme scheme, const std::string& name, const Shape& shape, DType src,
                       const ModelShape& model);

}  // namespace llmk::quant
