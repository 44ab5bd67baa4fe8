#include "formats/hf_quant.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "kernels/cpu/quantize.h"

namespace llmk {

std::string HfQuant::describe() const {
  if (method == Method::ChannelInt8) return "compressed-tensors int8, a scale an output channel";
  const char* name = method == Method::Awq ? "AWQ" : method == Method::Gptq ? "GPTQ" : "none";
  return group_size > 0 ? fmt::format("{} 4-bit, group {}", name, group_size)
                        : fmt::format("{} 4-bit, one group a row", name);
}

namespace {

// compressed-tensors' quantization_config (c): int8 weights with a scale an output channel.
HfQuant read_compressed_tensors(const HfConfig& c, const std::string& where) {
  const std::string format = c.get_string("format", "");
  LLMK_CHECK(format == "int-quantized" || format == "naive-quantized",
             "{}.format '{}' is not supported (llmk reads compressed-tensors' int-quantized int8 "
             "weights)",
             where, format);
  const nlohmann::json* groups = c.find("config_groups");
  LLMK_CHECK(groups != nullptr && groups->is_object() && groups->size() == 1,
             "{}.config_groups: llmk reads one group of int8 weights, got {}", where,
             groups == nullptr || !groups->is_object() ? std::string("none")
                                                       : std::to_string(groups->size()));
  const HfConfig group = c.object("config_groups").object(groups->begin().key());
  const HfConfig w = group.object("weights");
  const std::string at = where + ".config_groups." + groups->begin().key() + ".weights";
  const int64_t bits = w.get_int("num_bits");
  const std::string type = w.get_string("type", "int");
  const std::string strategy = w.get_string("strategy");
  LLMK_CHECK(bits == 8 && type == "int" && strategy == "channel",
             "{}: {}-bit {} weights by '{}' are not supported (llmk reads 8-bit int weights with "
             "strategy 'channel')",
             at, bits, type, strategy);
  LLMK_CHECK(!w.get_bool("dynamic", false), "{}.dynamic true is not supported", at);
  HfQuant q;
  q.method = HfQuant::Method::ChannelInt8;
  return q;
}

}  // namespace

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
  } else if (method == "compressed-tensors") {
    return read_compressed_tensors(c, where);
  } else {
    throw Error(fmt::format(
        "{}.quant_method '{}' is not supported (llmk reads awq and gptq checkpoints, 4-bit, and "
        "compressed-tensors int8 a channel)",
        where, method));
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

// A packed layer checked against its quantization_config, read weight by weight.
class Unpacked {
 public:
  Unpacked(const HfQuant& q, const PackedLinear& p, const std::string& what)
      : awq_(q.method == HfQuant::Method::Awq), zero_add_(q.zero_less_one ? 1 : 0) {
    LLMK_CHECK(q.method != HfQuant::Method::None, "{}: not a quantised checkpoint", what);
    check_2d(p.qweight, DType::I32, what, "qweight");
    check_2d(p.qzeros, DType::I32, what, "qzeros");
    // in x out, from qweight: AWQ [in, out / 8], GPTQ [in / 8, out].
    in_ = awq_ ? p.qweight.dim(0) : 8 * p.qweight.dim(0);
    out_ = awq_ ? 8 * p.qweight.dim(1) : p.qweight.dim(1);
    LLMK_CHECK(out_ % 8 == 0 && in_ > 0 && out_ > 0, "{}.qweight: shape {} holds no whole words",
               what, shape_str(p.qweight.shape()));
    group_ = q.group_size > 0 ? q.group_size : in_;
    LLMK_CHECK(in_ % group_ == 0, "{}: {} input rows are not whole groups of {} ({})", what, in_,
               group_, q.describe());
    const int64_t groups = in_ / group_;
    scale_ = scales_f32(p.scales, what);
    check_shape(p.scales, groups, out_, what, "scales", q.describe());
    check_shape(p.qzeros, groups, out_ / 8, what, "qzeros", q.describe());
    group_of_.resize(static_cast<size_t>(in_));
    for (int64_t k = 0; k < in_; ++k)
      group_of_[static_cast<size_t>(k)] = static_cast<int32_t>(k / group_);
    if (!awq_ && p.g_idx.defined()) {
      LLMK_CHECK(p.g_idx.dtype() == DType::I32 && p.g_idx.ndim() == 1 && p.g_idx.dim(0) == in_,
                 "{}.g_idx: {} {}, expected I32 [{}]", what, dtype_name(p.g_idx.dtype()),
                 shape_str(p.g_idx.shape()), in_);
      for (int64_t k = 0; k < in_; ++k) {
        const int32_t g = p.g_idx.data<const int32_t>()[k];
        LLMK_CHECK(g >= 0 && g < groups, "{}.g_idx[{}] = {}: outside the {} groups", what, k, g,
                   groups);
        group_of_[static_cast<size_t>(k)] = g;
        in_order_ = in_order_ && g == k / group_;
      }
    }
    qw_ = p.qweight.data<const int32_t>();
    qz_ = p.qzeros.data<const int32_t>();
  }

  int64_t in() const { return in_; }
  int64_t out() const { return out_; }
  int64_t group() const { return group_; }
  // Whether input row k is in group k / group() for every k (no act-order g_idx).
  bool in_order() const { return in_order_; }
  int64_t group_of(int64_t k) const { return group_of_[static_cast<size_t>(k)]; }
  float scale(int64_t g, int64_t n) const { return scale_[static_cast<size_t>(g * out_ + n)]; }
  // The 4-bit value of weight (n, k) and its group's zero point (1 to 16 in GPTQ v1).
  int value(int64_t n, int64_t k) const {
    return static_cast<int>(awq_ ? nibble(qw_[k * (out_ / 8) + n / 8], kAwqNibble[n % 8])
                                 : nibble(qw_[(k / 8) * out_ + n], static_cast<int>(k % 8)));
  }
  int zero(int64_t g, int64_t n) const {
    // The zero's nibble: AWQ's order; GPTQ packs columns in order.
    const int nib = awq_ ? kAwqNibble[n % 8] : static_cast<int>(n % 8);
    return static_cast<int>(nibble(qz_[g * (out_ / 8) + n / 8], nib)) + zero_add_;
  }

 private:
  // AWQ's nibble of output column j (of each eight): the inverse of its order {0, 2, 4, 6, 1, 3,
  // 5, 7}.
  static constexpr int kAwqNibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};
  bool awq_;
  int zero_add_;
  int64_t in_ = 0, out_ = 0, group_ = 0;
  bool in_order_ = true;
  std::vector<float> scale_;
  std::vector<int32_t> group_of_;
  const int32_t* qw_ = nullptr;
  const int32_t* qz_ = nullptr;
};

// The f16 [out, in] weights of u.
Tensor to_f16(const Unpacked& u) {
  const int64_t in = u.in(), out = u.out();
  Tensor w = Tensor::empty({out, in}, DType::F16);
  auto* dst = w.data<uint16_t>();
  for (int64_t k = 0; k < in; ++k) {
    const int64_t g = u.group_of(k);
    for (int64_t n = 0; n < out; ++n) {
      dst[n * in + k] =
          float_to_fp16(u.scale(g, n) * static_cast<float>(u.value(n, k) - u.zero(g, n)));
    }
  }
  return w;
}

// u as exact Q4_0 (every zero point 8) or Q5_0 blocks, or undefined where they cannot hold it
// (repack_packed_blocks).
Tensor to_blocks(const Unpacked& u) {
  const int64_t in = u.in(), out = u.out();
  if (!u.in_order() || u.group() % 32 != 0) return Tensor();
  const int64_t groups = in / u.group();
  bool all_eight = true;
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t n = 0; n < out; ++n) {
      const float s = u.scale(g, n);
      if (fp16_to_float(float_to_fp16(s)) != s) return Tensor();  // d is an f16
      all_eight = all_eight && u.zero(g, n) == 8;
    }
  }
  // q - zero in [-16, 15] (a GPTQ v1 zero is at most 16) with the group's scale: exact Q5_0; in
  // [-8, 7] when every zero is 8: exact Q4_0.
  const DType type = all_eight ? DType::Q4_0 : DType::Q5_0;
  const int64_t blocks = in / 32;
  Tensor w = Tensor::empty({out, in}, type);
  std::vector<int8_t> q(static_cast<size_t>(in));
  std::vector<float> d(static_cast<size_t>(blocks));
  const int64_t row_bytes = bytes_for(type, in);
  for (int64_t n = 0; n < out; ++n) {
    for (int64_t k = 0; k < in; ++k) {
      q[k] = static_cast<int8_t>(u.value(n, k) - u.zero(32 * (k / 32) / u.group(), n));
    }
    for (int64_t b = 0; b < blocks; ++b) d[b] = u.scale(32 * b / u.group(), n);
    cpu::pack_symmetric_row(type, q.data(), d.data(),
                            static_cast<uint8_t*>(w.data()) + n * row_bytes, in);
  }
  return w;
}

}  // namespace

Tensor dequantize_packed(const HfQuant& q, const PackedLinear& p, const std::string& what) {
  return to_f16(Unpacked(q, p, what));
}

Tensor repack_packed_blocks(const HfQuant& q, const PackedLinear& p, const std::string& what) {
  return to_blocks(Unpacked(q, p, what));
}

Tensor read_packed(const HfQuant& q, const PackedLinear& p, const std::string& what) {
  const Unpacked u(q, p, what);
  Tensor w = to_blocks(u);
  return w.defined() ? w : to_f16(u);
}

namespace {

// A compressed-tensors int8 layer checked: the weights, and each row's scale and zero point.
struct Channels {
  int64_t out = 0, in = 0;
  const int8_t* q = nullptr;
  std::vector<float> scale;
  std::vector<int32_t> zero;  // zeros when the layer has none
};

Channels check_channels(const ChannelInt8& c, const std::string& what) {
  check_2d(c.weight, DType::I8, what, "weight");
  Channels ch;
  ch.out = c.weight.dim(0);
  ch.in = c.weight.dim(1);
  ch.q = c.weight.data<const int8_t>();
  LLMK_CHECK(c.scale.defined(), "{}: missing tensor 'weight_scale'", what);
  LLMK_CHECK(c.scale.numel() == ch.out && c.scale.is_contiguous() &&
                 (c.scale.ndim() == 1 || (c.scale.ndim() == 2 && c.scale.dim(1) == 1)),
             "{}.weight_scale: shape {}, expected [{}, 1] (a scale an output channel)", what,
             shape_str(c.scale.shape()), ch.out);
  ch.scale = scales_f32(c.scale, what);
  ch.zero.assign(static_cast<size_t>(ch.out), 0);
  if (c.zero.defined()) {
    LLMK_CHECK(c.zero.numel() == ch.out && c.zero.is_contiguous() &&
                   (c.zero.dtype() == DType::I8 || c.zero.dtype() == DType::I32),
               "{}.weight_zero_point: {} {}, expected I8 or I32 [{}, 1]", what,
               dtype_name(c.zero.dtype()), shape_str(c.zero.shape()), ch.out);
    for (int64_t n = 0; n < ch.out; ++n) {
      ch.zero[static_cast<size_t>(n)] = c.zero.dtype() == DType::I8
                                            ? c.zero.data<const int8_t>()[n]
                                            : c.zero.data<const int32_t>()[n];
    }
  }
  return ch;
}

}  // namespace

Tensor dequantize_channel_int8(const ChannelInt8& c, const std::string& what) {
  const Channels ch = check_channels(c, what);
  Tensor w = Tensor::empty({ch.out, ch.in}, DType::F16);
  auto* dst = w.data<uint16_t>();
  for (int64_t n = 0; n < ch.out; ++n) {
    const float s = ch.scale[static_cast<size_t>(n)];
    const int32_t z = ch.zero[static_cast<size_t>(n)];
    for (int64_t k = 0; k < ch.in; ++k) {
      dst[n * ch.in + k] = float_to_fp16(s * static_cast<float>(ch.q[n * ch.in + k] - z));
    }
  }
  return w;
}

Tensor repack_channel_int8_q8_0(const ChannelInt8& c, const std::string& what) {
  const Channels ch = check_channels(c, what);
  if (ch.in % 32 != 0) return Tensor();
  for (int64_t n = 0; n < ch.out; ++n) {
    const float s = ch.scale[static_cast<size_t>(n)];
    if (ch.zero[static_cast<size_t>(n)] != 0 || !std::isfinite(s) ||
        fp16_to_float(float_to_fp16(s)) != s) {
      return Tensor();
    }
  }
  Tensor w = Tensor::empty({ch.out, ch.in}, DType::Q8_0);
  const int64_t row_bytes = bytes_for(DType::Q8_0, ch.in);
  std::vector<float> d(static_cast<size_t>(ch.in / 32));
  for (int64_t n = 0; n < ch.out; ++n) {
    std::fill(d.begin(), d.end(), ch.scale[static_cast<size_t>(n)]);
    cpu::pack_symmetric_row(DType::Q8_0, ch.q + n * ch.in, d.data(),
                            static_cast<uint8_t*>(w.data()) + n * row_bytes, ch.in);
  }
  return w;
}

Tensor read_channel_int8(const ChannelInt8& c, const std::string& what) {
  Tensor w = repack_channel_int8_q8_0(c, what);
  return w.defined() ? w : dequantize_channel_int8(c, what);
}

}  // namespace llmk
