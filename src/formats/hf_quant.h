// Hugging Face checkpoints of 4-bit weight-only quantisation: config.json's quantization_config
// and each linear layer's packed tensors, dequantised into an f16 [out, in] matrix the way the
// formats' own reference code computes it, w = scale * (q - zero) in f32, rounded once to f16.
//
// AWQ ("quant_method": "awq", "version": "gemm", AutoAWQ's packing): qweight int32 [in, out / 8],
// each word eight output columns with column j of the eight in nibble {0, 4, 1, 5, 2, 6, 3, 7}[j];
// qzeros int32 [in / group, out / 8] packed the same; scales f16 [in / group, out].
// GPTQ ("quant_method": "gptq"): qweight int32 [in / 8, out], word k / 8 holding input row k in
// nibble k % 8; qzeros int32 [groups, out / 8], column n in nibble n % 8; scales f16 [groups,
// out]; g_idx int32 [in] (the group of each input row; absent: row / group). "checkpoint_format"
// "gptq" (v1, the default) stores each zero point less one, "gptq_v2" as it is.
//
// compressed-tensors ("quant_method": "compressed-tensors", "format": "int-quantized" or
// "naive-quantized", llm-compressor's W8A16 / W8A8 checkpoints): one config group whose weights
// are 8-bit ints with one scale an output channel ("strategy": "channel"), the layer's "weight"
// int8 [out, in] beside "weight_scale" [out, 1] (f16, bf16 or f32) and, when not symmetric,
// "weight_zero_point" [out, 1] (int8 or int32): w = scale * (q - zero). Activations stay 16-bit
// (a W8A8 checkpoint's activation scheme is not applied).
//
// Only 4 bits (AWQ, GPTQ) and 8 bits a channel (compressed-tensors); other widths, methods, AWQ
// versions and compressed-tensors schemes are refused with the key that says so.
#pragma once

#include <cstdint>
#include <string>

#include "core/tensor.h"
#include "formats/hf_config.h"

namespace llmk {

struct HfQuant {
  enum class Method { None, Awq, Gptq, ChannelInt8 };
  Method method = Method::None;
  int64_t group_size = 0;      // input rows a group; -1 (GPTQ): one group over every row
  bool zero_less_one = false;  // GPTQ v1: stored zero points are the zero point less one

  // "AWQ 4-bit, group 128" / "GPTQ 4-bit, group 128" / "compressed-tensors int8, a scale an
  // output channel", for messages.
  std::string describe() const;
};

// The folder's quantization_config (Method::None when config.json has none). Throws naming the
// key for what it cannot read: another quant_method, bits other than 4, an AWQ version other
// than gemm, AWQ without zero points, a group size of 0 or below -1.
HfQuant read_hf_quant(const HfConfig& config);

// One linear layer's packed tensors (CPU views); g_idx may be undefined.
struct PackedLinear {
  Tensor qweight, qzeros, scales, g_idx;
};

// The names of a packed layer's tensors after "<layer>": qweight, qzeros, scales, g_idx (the
// members of PackedLinear, in order).
inline constexpr const char* kPackedParts[] = {".qweight", ".qzeros", ".scales", ".g_idx"};

// The f16 [out, in] weights of `p`. `what` names the layer in errors ("<folder>: model.layers.0.
// self_attn.q_proj"), which come for a dtype other than int32 (packed tensors) or f16 / bf16 /
// f32 (scales), shapes that disagree with each other or with the group size, and g_idx entries
// outside the groups.
Tensor dequantize_packed(const HfQuant& q, const PackedLinear& p, const std::string& what);

// The same layer as GGUF Q5_0 blocks ([out, in], 22 bytes a block of 32 input rows: an f16 scale d
// and each weight's 16 + q - zero in five bits), whose weights d (v - 16) are scale * (q - zero)
// exactly: 5.5 bits a weight, and a type the CPU and CUDA linears read without dequantising
// (QLinear on the GPU). Where every zero point is 8 (a symmetric checkpoint: GPTQ's sym), Q4_0
// blocks instead (18 bytes: d and 8 + q - zero in four bits, 4.5 bits a weight, the GPU's fastest
// one-token kernel). Undefined (no error) where a block cannot hold its weights exactly: an
// act-order g_idx, a group size not a multiple of 32, or a scale that is not an f16 value. The
// same errors as dequantize_packed for malformed tensors.
Tensor repack_packed_blocks(const HfQuant& q, const PackedLinear& p, const std::string& what);

// The loader's choice, the layer read and checked once: repack_packed_blocks' blocks where they
// hold it, else dequantize_packed's f16 weights.
Tensor read_packed(const HfQuant& q, const PackedLinear& p, const std::string& what);

// A compressed-tensors int8 layer (Method::ChannelInt8; CPU views): "<layer>.weight" int8 [out,
// in], "<layer>.weight_scale" [out, 1], "<layer>.weight_zero_point" [out, 1] or undefined.
struct ChannelInt8 {
  Tensor weight, scale, zero;
};
inline constexpr const char* kChannelScale = ".weight_scale";
inline constexpr const char* kChannelZero = ".weight_zero_point";

// The layer as GGUF Q8_0 blocks ([out, in], each block of 32 its row's scale as an f16 and the
// int8 weights as they are): exact, undefined (no error) where blocks cannot hold it (a nonzero
// zero point, in not whole blocks of 32, a scale that is not an f16 value). Or its f16 [out, in]
// weights, scale * (q - zero) in f32 rounded once. Errors, naming `what`, for dtypes and shapes
// that are not the format's.
Tensor repack_channel_int8_q8_0(const ChannelInt8& c, const std::string& what);
Tensor dequantize_channel_int8(const ChannelInt8& c, const std::string& what);
// repack_channel_int8_q8_0 where it is defined, else dequantize_channel_int8.
Tensor read_channel_int8(const ChannelInt8& c, const std::string& what);

}  // namespace llmk
