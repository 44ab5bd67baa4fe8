// What each family file (src/model/<family>.cpp) adds to the common configuration, and the
// RoPE-scaling readers they share. Internal to src/model.
#pragma once

#include <string>
#include <string_view>

#include "model/config.h"

namespace llmk {
namespace gguf {
class File;
}
class HfConfig;

// After the common keys are read: the family's settings from the same file.
void apply_gemma3_gguf(ModelConfig& c, const gguf::File& f);
void apply_gemma3_hf(ModelConfig& c, const HfConfig& h);
void apply_phi3_gguf(ModelConfig& c, const gguf::File& f);
void apply_phi3_hf(ModelConfig& c, const HfConfig& h);

// One RoPE setting of config.json: the base and the scaling of one kind of layer.
struct HfRope {
  double theta = 10000.0;
  float freq_scale = 1.0f;
  std::vector<float> freq_factors;
};
// Reads a transformers rope object (rope_scaling, rope_parameters, or one per layer type of
// rope_parameters): "rope_type" (or "type") default, linear or llama3, with their keys, and
// "rope_theta" when present (else `theta`). `rope_dim` is the rotated size the llama3 factors
// are computed for. Any other type throws "<file>: <key>.rope_type 'yarn' is not supported".
HfRope read_hf_rope(const HfConfig& r, const std::string& key, double theta, int64_t rope_dim);

// `theta`, a RoPE base read from `key` of the file `where`, when finite and above 1; else throws
// naming the file and the key.
double checked_theta(double theta, const std::string& where, std::string_view key);

// The llama3 per-frequency divisors of inv_freq[i] = theta^(-2i/rope_dim), as transformers'
// _compute_llama3_parameters applies them (and llama.cpp's converter writes rope_freqs.weight).
std::vector<float> llama3_rope_factors(double theta, int64_t rope_dim, double factor,
                                       double low_freq_factor, double high_freq_factor,
                                       double original_context);

}  // namespace llmk
