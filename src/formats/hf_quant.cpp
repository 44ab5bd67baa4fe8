#include "formats/hf_quant.h"

#include <fmt/format.h>

#include <vector>

#include "core/error.h"
#include "core/half.h"

namespace llmk {

std::string HfQuant::describe() const {
  const char* name = method == Method::Awq ? "AWQ" : method == Method::Gptq ? "GPTQ" : "none";
  return group_size > 0 ? fmt::format("{} 4-bit, group {}", name, group_size)
                        : fmt::format("{} 4-bit, one group a row", name);
}

HfQuant read_hf_quant(const HfConfig& config) {
  HfQuant q;
  if (!config.has("quantization_config")) return q;
  const HfConfig c = config.object("quantization_config");
  const std::string method = c.get_string("quant_method");
  const std::string where = config.path() + ": quantization_config";
  if (method == "awq") {
    q.method = HfQuant::Method::Awq;
    const std::string version = c.get_string("version", "gemm");
    LLMK_CHECK(version == "gemm" || version == "GEMM",
               "{}.version '{}' is not supported (llmk reads AutoAWQ's gemm packing)", where,
               version);
    LLMK_CHECK(c.get_bool("zero_point", true),
               "{}.zero_point false is not supported (llmk reads AWQ with zero points)", where);
  } else if (method == "gptq") {
    q.method = HfQuant::Method::Gptq;
    const std::string format = c.get_string("checkpoint_format", "gptq");
    LLMK_CHECK(format == "gptq" || format == "gptq_v2",
               "{}.checkpoint_format '{}' is not supported (gptq and gptq_v2 are)", where, format);
    q.zero_less_one = format == "gptq";
  } else {
    throw Error(fmt::format(
        "{}.quant_method '{}' is not supported (llmk reads awq and gptq checkpoints, 4-bit)", where,
        method));
  }
  const int64_t bits =
      c.get_int(q.method == HfQuant::Method::Awq ? "w_bit" : "bits", c.get_int("bits", 4));
  LLMK_CHECK(bits == 4, "{}: {}-bit weights are not supported (4-bit only)", where, bits);
  q.group_size = c.get_int(
      q.method == HfQuant::Method::Awq && c.has("q_group_size") ? "q_group_size" : "group_size");
  LLMK_CHECK(q.group_size > 0 || (q.group_size == -1 && q.method == HfQuant::Method::Gptq),
             "{}.group_size {} is not a group size (a positive number of input rows{})", where,
             q.group_size, q.method == HfQuant::Method::Gptq ? ", or -1 for one group" : "");
  return q;
}

namespace {

void check_2d(const Tensor& t, DType dtype, const std::string& what, const char* name) {
  LLMK_CHECK(t.defined(), "{}: missing tensor '{}'", what, name);
  LLMK_CHECK(t.ndim() == 2 && t.is_contiguous(), "{}.{}: expected a 2-D tensor, got shape {}", what,
             name, shape_str(t.shape()));
  LLMK_CHECK(t.dtype() == dtype, "{}.{}: dtype {}, expected {}", what, name, dtype_name(t.dtype()),
             dtype_name(dtype));
}

void check_shape(const Tensor& t, int64_t rows, int64_t cols, const std::string& what,
                 const char* name, const std::string& why) {
  LLMK_CHECK(t.dim(0) == rows && t.dim(1) == cols, "{}.{}: shape {}, expected [{}, {}] ({})", what,
             name, shape_str(t.shape()), rows, cols, why);
}

// The scales as f32, [groups, out].
std::vector<float> scales_f32(const Tensor& s, const std::string& what) {
  LLMK_CHECK(s.defined(), "{}: missing tensor 'scales'", what);
  LLMK_CHECK(s.ndim() == 2 && s.is_contiguous(), "{}.scales: expected a 2-D tensor, got shape {}",
             what, shape_str(s.shape()));
  std::vector<float> out(static_cast<size_t>(s.numel()));
  switch (s.dtype()) {
    case DType::F16:
      for (size_t i = 0; i < out.size(); ++i) out[i] = fp16_to_float(s.data<const uint16_t>()[i]);
      break;
    case DType::BF16:
      for (size_t i = 0; i < out.size(); ++i) out[i] = bf16_to_float(s.data<const uint16_t>()[i]);
      break;
    case DType::F32:
      for (size_t i = 0; i < out.size(); ++i) out[i] = s.data<const float>()[i];
      break;
    default:
      throw Error(fmt::format("{}.scales: dtype {}, expected F16, BF16 or F32", what,
                              dtype_name(s.dtype())));
  }
  return out;
}

uint32_t nibble(int32_t word, int i) { return (static_cast<uint32_t>(word) >> (4 * i)) & 0xFu; }

}  // namespace

Tensor dequantize_packed(const HfQuant& q, const PackedLinear& p, const std::string& what) {
  LLMK_CHECK(q.method != HfQuant::Method::None, "{}: not a quantised checkpoint", what);
  check_2d(p.qweight, DType::I32, what, "qweight");
  check_2d(p.qzeros, DType::I32, what, "qzeros");
  const bool awq = q.method == HfQuant::Method::Awq;
  // in x out, from qweight: AWQ [in, out / 8], GPTQ [in / 8, out].
  const int64_t in = awq ? p.qweight.dim(0) : 8 * p.qweight.dim(0);
  const int64_t out = awq ? 8 * p.qweight.dim(1) : p.qweight.dim(1);
  LLMK_CHECK(out % 8 == 0 && in > 0 && out > 0, "{}.qweight: shape {} holds no whole words", what,
             shape_str(p.qweight.shape()));
  const int64_t group = q.group_size > 0 ? q.group_size : in;
  LLMK_CHECK(in % group == 0, "{}: {} input rows are not whole groups of {} ({})", what, in, group,
             q.describe());
  const int64_t groups = in / group;
  const std::vector<float> scale = scales_f32(p.scales, what);
  check_shape(p.scales, groups, out, what, "scales", q.describe());
  check_shape(p.qzeros, groups, out / 8, what, "qzeros", q.describe());
  std::vector<int32_t> group_of(static_cast<size_t>(in));
  for (int64_t k = 0; k < in; ++k)
    group_of[static_cast<size_t>(k)] = static_cast<int32_t>(k / group);
  if (!awq && p.g_idx.defined()) {
    LLMK_CHECK(p.g_idx.dtype() == DType::I32 && p.g_idx.ndim() == 1 && p.g_idx.dim(0) == in,
               "{}.g_idx: {} {}, expected I32 [{}]", what, dtype_name(p.g_idx.dtype()),
               shape_str(p.g_idx.shape()), in);
    for (int64_t k = 0; k < in; ++k) {
      const int32_t g = p.g_idx.data<const int32_t>()[k];
      LLMK_CHECK(g >= 0 && g < groups, "{}.g_idx[{}] = {}: outside the {} groups", what, k, g,
                 groups);
      group_of[static_cast<size_t>(k)] = g;
    }
  }
  // AWQ's nibble of output column j (of each eight): the inverse of its order {0, 2, 4, 6, 1, 3,
  // 5, 7}.
  static constexpr int kAwqNibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};
  const auto* qw = p.qweight.data<const int32_t>();
  const auto* qz = p.qzeros.data<const int32_t>();
  const int64_t zero_cols = out / 8;
  const int zero_add = q.zero_less_one ? 1 : 0;
  Tensor w = Tensor::empty({out, in}, DType::F16);
  auto* dst = w.data<uint16_t>();
  for (int64_t k = 0; k < in; ++k) {
    const int64_t g = group_of[static_cast<size_t>(k)];
    const float* s = scale.data() + g * out;
    for (int64_t n = 0; n < out; ++n) {
      const int j = static_cast<int>(n % 8);
      const int nib = awq ? kAwqNibble[j] : j;  // the zero's nibble; GPTQ packs columns in order
      const uint32_t qv = awq ? nibble(qw[k * (out / 8) + n / 8], kAwqNibble[j])
                              : nibble(qw[(k / 8) * out + n], static_cast<int>(k % 8));
      const int zero = static_cast<int>(nibble(qz[g * zero_cols + n / 8], nib)) + zero_add;
      dst[n * in + k] = float_to_fp16(s[n] * static_cast<float>(static_cast<int>(qv) - zero));
    }
  }
  return w;
}

}  // namespace llmk
