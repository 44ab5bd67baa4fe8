// Phi-3: the Llama layout with Q|K|V in one tensor and gate|up in one tensor (as both
// transformers and llama.cpp store them), NeoX RoPE over a possibly partial head, and a
// sliding window on every layer. The forward pass is the shared decoder (src/model/decoder.cpp),
// which loads each fused tensor as its stacked projection.
#include "core/error.h"
#include "formats/gguf.h"
#include "formats/hf_config.h"
#include "model/family.h"

namespace llmk {

void apply_phi3_gguf(ModelConfig& c, const gguf::File& f) {
  // llama.cpp's converter keeps the checkpoint's rotate-half rows (no permutation).
  c.rope_layout = ops::RopeLayout::HalfSplit;
  c.fused_qkv = true;
  c.fused_gate_up = true;  // blk.N.ffn_up.weight is [2*d_ff, d_model]: gate rows, then up
  // transformers applies the window on every layer; llama.cpp currently ignores it for Phi-3
  // (a warning), so llmk follows the reference implementation.
  c.sliding_window = f.get_int("phi3.attention.sliding_window", 0);
  c.sliding_pattern = 0;
  for (const char* t : {"rope_factors_long.weight", "rope_factors_short.weight"}) {
    LLMK_CHECK(f.find_tensor(t) == nullptr,
               "{}: tensor '{}': longrope scaling (Phi-3 128k) is not supported", f.path(), t);
  }
}

void apply_phi3_hf(ModelConfig& c, const HfConfig& h) {
  c.fused_qkv = true;
  c.fused_gate_up = true;
  // Phi3Model builds a sliding-window causal mask for every layer when sliding_window is set
  // (keys in (p - window, p]), as ops::attention's window does.
  c.sliding_window = h.get_int("sliding_window", 0);
  c.sliding_pattern = 0;
  c.hf_layer_names = {
      {"attn_qkv.weight", "self_attn.qkv_proj.weight"},
      {"ffn_up.weight", "mlp.gate_up_proj.weight"},
  };
}

}  // namespace llmk
