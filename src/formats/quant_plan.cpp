#include "formats/quant_plan.h"

#include <fmt/format.h>

#include <array>
#include <cctype>
#include <tuple>
#include <utility>

namespace llmk::quant {

namespace {

struct SchemeInfo {
  Scheme scheme;
  std::string_view name;
  DType main;          // the type most weights take
  uint32_t file_type;  // llama_ftype
};

constexpr std::array<SchemeInfo, 12> kSchemes = {{
    {Scheme::Q8_0, "q8_0", DType::Q8_0, 7},
    {Scheme::Q4_0, "q4_0", DType::Q4_0, 2},
    {Scheme::Q4_1, "q4_1", DType::Q4_1, 3},
    {Scheme::Q5_0, "q5_0", DType::Q5_0, 8},
    {Scheme::Q5_1, "q5_1", DType::Q5_1, 9},
    {Scheme::Q4_K, "q4_k", DType::Q4_K, 14},  // LLAMA_FTYPE_MOSTLY_Q4_K_S
    {Scheme::Q5_K, "q5_k", DType::Q5_K, 16},  // LLAMA_FTYPE_MOSTLY_Q5_K_S
    {Scheme::Q6_K, "q6_k", DType::Q6_K, 18},
    {Scheme::Q4_K_M, "q4_k_m", DType::Q4_K, 15},
    {Scheme::F32, "f32", DType::F32, 0},  // LLAMA_FTYPE_ALL_F32
    {Scheme::F16, "f16", DType::F16, 1},
    {Scheme::BF16, "bf16", DType::BF16, 32},
}};

const SchemeInfo& info(Scheme s) {
  for (const SchemeInfo& i : kSchemes) {
    if (i.scheme == s) return i;
  }
  return kSchemes[0];  // unreachable: every Scheme is in the table
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// "blk.12.ffn_down.weight" -> {12, "ffn_down.weight"}; {-1, name} outside the layers.
std::pair<int64_t, std::string_view> layer_of(std::string_view name) {
  constexpr std::string_view kBlk = "blk.";
  if (name.substr(0, kBlk.size()) != kBlk) return {-1, name};
  size_t i = kBlk.size();
  int64_t layer = 0;
  while (i < name.size() && std::isdigit(static_cast<unsigned char>(name[i])) && i < 12) {
    layer = layer * 10 + (name[i] - '0');
    ++i;
  }
  if (i == kBlk.size() || i >= name.size() || name[i] != '.') return {-1, name};
  return {layer, name.substr(i + 1)};
}

// llama.cpp's use_more_bits: the first and last eighth of the layers, and every third between.
bool use_more_bits(int64_t layer, int64_t n_layers) {
  return layer < n_layers / 8 || layer >= 7 * n_layers / 8 || (layer - n_layers / 8) % 3 == 2;
}

// Q4_K_M's type for a weight matrix, with the reason when it is not Q4_K.
std::pair<DType, std::string> q4_k_m_type(const std::string& name, const ModelShape& model) {
  if (name == "output.weight" || (!model.has_output && name == "token_embd.weight")) {
    return {DType::Q6_K, model.has_output ? "Q4_K_M: output" : "Q4_K_M: output (tied embeddings)"};
  }
  const auto [layer, rest] = layer_of(name);
  if (layer >= 0 && (rest == "attn_v.weight" || rest == "ffn_down.weight") &&
      use_more_bits(layer, model.n_layers)) {
    return {DType::Q6_K,
            fmt::format("Q4_K_M: {} of a use_more_bits layer", rest.substr(0, rest.size() - 7))};
  }
  if (layer >= 0 && rest == "attn_qkv.weight") return {DType::Q5_K, "Q4_K_M: attn_qkv"};
  return {DType::Q4_K, ""};
}

// llama.cpp's fallback for k-quants whose 256-blocks do not fit a row.
DType legacy_fallback(DType t) {
  switch (t) {
    case DType::Q4_K:
      return DType::Q5_0;
    case DType::Q5_K:
      return DType::Q5_1;
    case DType::Q6_K:
      return DType::Q8_0;
    default:
      return t;
  }
}

}  // namespace

std::optional<Scheme> parse_scheme(std::string_view name) {
  std::string lower(name);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const SchemeInfo& i : kSchemes) {
    if (i.name == lower) return i.scheme;
  }
  return std::nullopt;
}

std::string_view scheme_name(Scheme s) { return info(s).name; }

std::string scheme_names() {
  std::string out;
  for (const SchemeInfo& i : kSchemes) {
    if (!out.empty()) out += ", ";
    out += i.name;
  }
  return out;
}

uint32_t llama_file_type(Scheme s) { return info(s).file_type; }

TensorPlan plan_tensor(Scheme scheme, const std::string& name, const Shape& shape, DType src,
                       const ModelShape& model) {
  if (shape.size() < 2) return {DType::F32, "1-D"};
  if (!ends_with(name, ".weight")) return {src, "not a weight"};
  if (ends_with(name, "_norm.weight")) return {src, "norm"};
  TensorPlan p;
  if (scheme == Scheme::Q4_K_M) {
    std::tie(p.dtype, p.why) = q4_k_m_type(name, model);
  } else {
    p.dtype = info(scheme).main;
  }
  const int64_t cols = shape.back();
  if (cols % block_size(p.dtype) != 0) {
    const DType fallback = legacy_fallback(p.dtype);
    const std::string reason =
        fmt::format("row of {} is not whole {} blocks", cols, dtype_name(p.dtype));
    if (fallback != p.dtype && cols % block_size(fallback) == 0) {
      return {fallback, fmt::format("{} fallback: {}", dtype_name(p.dtype), reason)};
    }
    return {src, reason};
  }
  return p;
}

}  // namespace llmk::quant
