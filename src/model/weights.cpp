#include "model/weights.h"

#include <fmt/format.h>

#include <cstring>
#include <string_view>
#include <unordered_map>

#include "core/error.h"
#include "core/text.h"
#include "kernels/quant_layout.h"
#include "ops/ops.h"

#ifdef LLMK_HAS_CUDA
#include "core/cuda/allocator.h"
#endif

namespace llmk {

namespace {

// The layer index of `name` when it starts with `prefix` and a number and a dot
// ("blk.12." -> 12), else -1.
int64_t layer_index(std::string_view name, std::string_view prefix) {
  if (name.substr(0, prefix.size()) != prefix) return -1;
  int64_t index = 0;
  size_t i = prefix.size();
  for (; i < name.size() && name[i] >= '0' && name[i] <= '9' && i < prefix.size() + 9; ++i) {
    index = index * 10 + (name[i] - '0');
  }
  return i > prefix.size() && i < name.size() && name[i] == '.' ? index : -1;
}

// The name among `names` of the highest layer index under `prefix`; `layers` = that index + 1.
template <class Names, class NameOf>
std::string last_layer_of(const Names& names, NameOf name_of, std::string_view prefix,
                          int64_t& layers) {
  std::string last;
  layers = 0;
  for (const auto& n : names) {
    const std::string& name = name_of(n);
    const int64_t i = layer_index(name, prefix);
    if (i >= layers) {
      layers = i + 1;
      last = name;
    }
  }
  return last;
}

class GgufSource final : public WeightSource {
 public:
  explicit GgufSource(const gguf::File& f) : f_(f) {}
  const std::string& path() const override { return f_.path(); }
  std::string file_name(const std::string& n) const override { return n; }
  Tensor find(const std::string& n) const override {
    return f_.find_tensor(n) ? f_.tensor(n) : Tensor();
  }
  std::string config_name() const override { return ""; }
  std::string last_layer_tensor(int64_t& layers) const override {
    return last_layer_of(
        f_.tensors(), [](const gguf::TensorInfo& t) -> const std::string& { return t.name; },
        "blk.", layers);
  }

 private:
  gguf::File f_;
};

using NameMap = std::vector<std::pair<std::string, std::string>>;

// GGUF names -> transformers names for the Llama-family layout (Llama, Qwen2, SmolLM2), with a
// family's own names within a layer taking precedence (`family`).
std::string to_hf_name(const std::string& n, const NameMap& family) {
  static const std::pair<const char*, const char*> kTop[] = {
      {"token_embd.weight", "model.embed_tokens.weight"},
      {"output_norm.weight", "model.norm.weight"},
      {"output.weight", "lm_head.weight"},
  };
  for (const auto& [g, h] : kTop) {
    if (n == g) return h;
  }
  static const std::pair<const char*, const char*> kLayer[] = {
      {"attn_norm.weight", "input_layernorm.weight"},
      {"attn_q.weight", "self_attn.q_proj.weight"},
      {"attn_k.weight", "self_attn.k_proj.weight"},
      {"attn_v.weight", "self_attn.v_proj.weight"},
      {"attn_q.bias", "self_attn.q_proj.bias"},
      {"attn_k.bias", "self_attn.k_proj.bias"},
      {"attn_v.bias", "self_attn.v_proj.bias"},
      {"attn_output.weight", "self_attn.o_proj.weight"},
      {"ffn_norm.weight", "post_attention_layernorm.weight"},
      {"ffn_gate.weight", "mlp.gate_proj.weight"},
      {"ffn_up.weight", "mlp.up_proj.weight"},
      {"ffn_down.weight", "mlp.down_proj.weight"},
  };
  // "blk.<layer>.<name>"
  constexpr std::string_view kBlk = "blk.";
  if (n.rfind(kBlk, 0) == 0) {
    const size_t dot = n.find('.', kBlk.size());
    const std::string layer = n.substr(kBlk.size(), dot - kBlk.size());
    if (dot != std::string::npos && !layer.empty() &&
        layer.find_first_not_of("0123456789") == std::string::npos) {
      const std::string rest = n.substr(dot + 1);
      for (const auto& [g, h] : family) {
        if (rest == g) return fmt::format("model.layers.{}.{}", layer, h);
      }
      for (const auto& [g, h] : kLayer) {
        if (rest == g) return fmt::format("model.layers.{}.{}", layer, h);
      }
    }
  }
  return n;
}

// A folder's tensors under transformers' names. In a quantised checkpoint (HfQuant) a linear
// layer's "<layer>.weight" is absent and "<layer>.qweight" with its scales and zero points stands
// for it: find() gives that layer (read_packed) as Q5_0 blocks holding its weights exactly (Q4_0
// where every zero point is 8), which the CPU and CUDA linears read as they are, or where those
// cannot hold them (act order, groups not of 32s, scales not f16) dequantised to f16. A
// compressed-tensors int8 checkpoint keeps "<layer>.weight" as int8 beside
// "<layer>.weight_scale": find() gives it as Q8_0 blocks (read_channel_int8), or f16 where they
// cannot hold it. Either is kept after the first call, since the loader asks for a tensor more
// than once.
class HfSource final : public WeightSource {
 public:
  HfSource(const safetensors::Folder& f, NameMap names, HfQuant quant)
      : f_(f), names_(std::move(names)), quant_(quant) {}
  const std::string& path() const override { return f_.path(); }
  std::string file_name(const std::string& n) const override {
    const std::string h = to_hf_name(n, names_);
    const std::string packed = packed_base(h);
    return packed.empty() ? h : packed + kPackedParts[0];
  }
  Tensor find(const std::string& n) const override {
    const std::string h = to_hf_name(n, names_);
    if (f_.find(h)) {
      if (!channel_int8(h)) return f_.tensor(h);
      return converted(h, [&](const std::string& base) {
        const ChannelInt8 c{f_.tensor(h), part(base, kChannelScale), part(base, kChannelZero)};
        return read_channel_int8(c, f_.shard_of(h).path() + ": " + base);
      });
    }
    const std::string packed = packed_base(h);
    if (packed.empty()) return Tensor();
    return converted(h, [&](const std::string& base) {
      const PackedLinear p{part(base, kPackedParts[0]), part(base, kPackedParts[1]),
                           part(base, kPackedParts[2]), part(base, kPackedParts[3])};
      return read_packed(quant_, p, f_.shard_of(base + kPackedParts[0]).path() + ": " + base);
    });
  }
  std::string file_of(const std::string& n) const override {
    const std::string h = to_hf_name(n, names_);
    if (f_.find(h)) return f_.shard_of(h).path();
    const std::string packed = packed_base(h);
    return packed.empty() ? f_.path() : f_.shard_of(packed + kPackedParts[0]).path();
  }
  std::string config_name() const override { return f_.path() + "/config.json"; }
  std::string last_layer_tensor(int64_t& layers) const override {
    return last_layer_of(
        f_.names(), [](const std::string& n) -> const std::string& { return n; }, "model.layers.",
        layers);
  }

 private:
  static constexpr std::string_view kWeight = ".weight";
  // "<layer>" of "<layer>.weight".
  static std::string layer_of(const std::string& h) {
    return h.substr(0, h.size() - kWeight.size());
  }
  // "<layer><suffix>", or undefined where the folder has no such tensor.
  Tensor part(const std::string& base, const char* suffix) const {
    const std::string name = base + suffix;
    return f_.find(name) ? f_.tensor(name) : Tensor();
  }
  // The layer `h` ("<layer>.weight") as make(layer) gives it, made once.
  template <class Make>
  const Tensor& converted(const std::string& h, Make&& make) const {
    auto it = converted_.find(h);
    if (it == converted_.end()) it = converted_.emplace(h, make(layer_of(h))).first;
    return it->second;
  }

  // Whether `h` (present) is a compressed-tensors int8 layer's "<layer>.weight".
  bool channel_int8(const std::string& h) const {
    return quant_.method == HfQuant::Method::ChannelInt8 && h.ends_with(kWeight) &&
           f_.find(layer_of(h) + kChannelScale) && f_.tensor(h).dtype() == DType::I8;
  }

  // "<layer>" when `h` is "<layer>.weight", absent, and packed as "<layer>.qweight"; else "".
  std::string packed_base(const std::string& h) const {
    if (quant_.method == HfQuant::Method::None || !h.ends_with(kWeight) || f_.find(h)) return "";
    std::string base = layer_of(h);
    return f_.find(base + kPackedParts[0]) ? base : "";
  }

  safetensors::Folder f_;
  NameMap names_;
  HfQuant quant_;
  mutable std::unordered_map<std::string, Tensor> converted_;
};

// " (<folder>/config.json)" for messages about sizes, or "" (GGUF: the same file).
std::string config_note(const WeightSource& src) {
  const std::string c = src.config_name();
  return c.empty() ? c : " (" + c + ")";
}

// Weights must be numbers a linear layer reads: floats or GGUF blocks, not integers.
void check_weight_dtype(const WeightSource& src, const std::string& name, const Tensor& t) {
  const DType d = t.dtype();
  LLMK_CHECK(d != DType::I32 && d != DType::I8,
             "{}: tensor '{}' has dtype {}, which is not a weight type (expected F32, F16, BF16 "
             "or a GGUF block type)",
             src.file_of(name), src.file_name(name), dtype_name(d));
}

}  // namespace

std::unique_ptr<WeightSource> gguf_source(const gguf::File& f) {
  return std::make_unique<GgufSource>(f);
}
std::unique_ptr<WeightSource> hf_source(const safetensors::Folder& f, NameMap layer_names,
                                        HfQuant quant) {
  return std::make_unique<HfSource>(f, std::move(layer_names), quant);
}

void check_layer_count(const WeightSource& src, int64_t n_layers) {
  int64_t layers = 0;
  const std::string last = src.last_layer_tensor(layers);
  const std::string config = src.config_name().empty() ? "its block_count" : src.config_name();
  LLMK_CHECK(layers <= n_layers,
             "{}: tensor '{}' belongs to layer {}, but {} says the model has {} layers", src.path(),
             printable(last), layers - 1, config, n_layers);
}

WeightLoader::WeightLoader(const WeightSource& src, Device device, ProgressFn progress, DType act,
                           bool keep_quantized)
    : src_(src),
      device_(device),
      act_(act),
      keep_quantized_(keep_quantized && device != Device::CPU && act == DType::BF16),
      progress_(std::move(progress)) {}

DType WeightLoader::placed_dtype(DType stored, Kind kind) const {
  if (kind == Kind::Vector) return DType::F32;
  if (device_ == Device::CPU) return stored;
  return keep_quantized_ && qlayout::gpu_keeps(stored) ? stored : act_;
}

bool WeightLoader::has(const std::string& name) const { return src_.find(name).defined(); }

void WeightLoader::finish_plan() {
  planning_ = false;
  prog_ = LoadProgress{};
  prog_.total = plan_count_;
  prog_.bytes_total = planned_raw_;  // what count() adds up
  if (device_ != Device::CPU && planned_bytes_ > 0) {
    block_ = Tensor::empty({static_cast<int64_t>(planned_bytes_)}, DType::I8, device_);
    block_owner_ = std::make_shared<Tensor>(block_);
    block_used_ = 0;
  }
}

// Each tensor starts 512 bytes into the block after the last, as the allocator aligns its own.
uint64_t WeightLoader::planned_size(DType dtype, int64_t numel) {
  return (static_cast<uint64_t>(bytes_for(dtype, numel)) + 511) / 512 * 512;
}

Tensor WeightLoader::fresh(const Shape& shape, DType dtype) {
  const uint64_t bytes = planned_size(dtype, shape_numel(shape));
  if (!block_.defined() || block_used_ + bytes > planned_bytes_) {
    return Tensor::empty(shape, dtype, device_);  // not planned (a tensor placed twice)
  }
  void* at = static_cast<char*>(block_.data()) + block_used_;
  block_used_ += bytes;
  return Tensor::borrow(at, shape, dtype, device_, block_owner_);
}

Tensor WeightLoader::place(const std::string& name, const Shape& shape, Kind kind, bool required,
                           bool host_mapped) {
  Tensor t = src_.find(name);
  if (!t.defined()) {
    LLMK_CHECK(!required, "{}: missing tensor '{}'", src_.path(), src_.file_name(name));
    return Tensor();
  }
  LLMK_CHECK(t.shape() == shape, "{}: tensor '{}' has shape {} but the model config{} needs {}",
             src_.file_of(name), src_.file_name(name), shape_str(t.shape()), config_note(src_),
             shape_str(shape));
  check_weight_dtype(src_, name, t);
  const DType want = placed_dtype(t.dtype(), kind);
  host_mapped = host_mapped && device_ != Device::CPU;
  if (planning_) {
    if (!host_mapped) planned_bytes_ += planned_size(want, t.numel());
    planned_raw_ += static_cast<uint64_t>(bytes_for(want, t.numel()));
    ++plan_count_;
    return Tensor();
  }
  Tensor out;
  if (t.dtype() == want && device_ == Device::CPU) {
    out = t;  // borrowed from the mapping
  } else if (host_mapped) {
#ifdef LLMK_HAS_CUDA
    Tensor host;
    out = cuda::host_mapped_tensor(shape, want, &host);
    convert(host, t, want, /*gpu_layout=*/true);
#endif
  } else {
    out = fresh(shape, want);
    put(out, t, want);
  }
  count(out);
  return out;
}

void WeightLoader::put(Tensor& dst, const Tensor& t, DType want) {
  if (t.dtype() != want && dst.device() == Device::CPU) {
    ops::dequantize(dst, t);  // straight into place: no staging copy on the host
    return;
  }
  if (t.dtype() == want && !is_quantized(want)) {
    ops::transfer(dst, t);
    return;
  }
  Tensor host = Tensor::empty(t.shape(), want);
  convert(host, t, want, dst.device() != Device::CPU);
  ops::transfer(dst, host);
}

void WeightLoader::convert(Tensor& host, const Tensor& t, DType want, bool gpu_layout) {
  if (is_quantized(want) && gpu_layout) {  // the GPU layout of the blocks
    qlayout::repack(want, t.data(), host.data(), t.dim(0), t.dim(1));
  } else if (t.dtype() != want) {
    ops::dequantize(host, t);
  } else {
    std::memcpy(host.data(), t.data(), static_cast<size_t>(t.nbytes()));
  }
}

void WeightLoader::count(const Tensor& placed) {
  ++prog_.done;
  prog_.bytes_done += static_cast<uint64_t>(placed.nbytes());
  if (progress_) progress_(prog_);
}

bool WeightLoader::can_stack(const std::vector<std::string>& names) const {
  DType first = DType::F32;
  for (size_t i = 0; i < names.size(); ++i) {
    const Tensor t = src_.find(names[i]);
    if (!t.defined()) return device_ != Device::CPU;  // stacked() names the missing part
    const DType placed = placed_dtype(t.dtype(), Kind::Matrix);
    if (i == 0) first = placed;
    if (placed != first) return false;
  }
  return true;
}

Tensor WeightLoader::stacked(const std::vector<std::string>& names,
                             const std::vector<Shape>& shapes, bool is_bias) {
  const bool is_vector = is_bias;
  LLMK_CHECK(names.size() == shapes.size() && !names.empty(), "stacked(): {} names, {} shapes",
             names.size(), shapes.size());
  std::vector<Tensor> parts;
  int64_t rows = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    Tensor t = src_.find(names[i]);
    if (!t.defined()) {
      LLMK_CHECK(parts.empty(), "{}: tensor '{}' is missing but '{}' is there", src_.path(),
                 src_.file_name(names[i]), src_.file_name(names[0]));
      if (is_vector) return Tensor();  // e.g. no q/k/v biases at all
      LLMK_FAIL("{}: missing tensor '{}'", src_.path(), src_.file_name(names[i]));
    }
    LLMK_CHECK(t.shape() == shapes[i],
               "{}: tensor '{}' has shape {} but the model config{} needs {}",
               src_.file_of(names[i]), src_.file_name(names[i]), shape_str(t.shape()),
               config_note(src_), shape_str(shapes[i]));
    check_weight_dtype(src_, names[i], t);
    LLMK_CHECK(is_vector ? t.ndim() == 1 : t.ndim() == 2 && t.dim(1) == shapes[0][1],
               "{}: tensor '{}' of shape {} cannot be stacked with '{}'", src_.path(),
               src_.file_name(names[i]), shape_str(t.shape()), src_.file_name(names[0]));
    rows += t.dim(0);
    parts.push_back(std::move(t));
  }
  const DType want = is_vector && device_ != Device::CPU
                         ? act_
                         : placed_dtype(parts[0].dtype(), is_vector ? Kind::Vector : Kind::Matrix);
  const Shape shape = is_vector ? Shape{rows} : Shape{rows, shapes[0][1]};
  if (planning_) {
    planned_bytes_ += planned_size(want, shape_numel(shape));
    planned_raw_ += static_cast<uint64_t>(bytes_for(want, shape_numel(shape)));
    plan_count_ += static_cast<int64_t>(parts.size());
    return Tensor();
  }
  Tensor out = fresh(shape, want);
  if (is_quantized(want) && device_ != Device::CPU) {
    // The parts' blocks back to back (whole rows), then the GPU layout of the whole.
    Tensor rows_host = Tensor::empty(shape, want);
    auto* at = static_cast<uint8_t*>(rows_host.data());
    for (const Tensor& t : parts) {
      std::memcpy(at, t.data(), static_cast<size_t>(t.nbytes()));
      at += t.nbytes();
      ++prog_.done;
    }
    put(out, rows_host, want);
    prog_.bytes_done += static_cast<uint64_t>(out.nbytes());
    if (progress_) progress_(prog_);
    return out;
  }
  int64_t at = 0;
  for (const Tensor& t : parts) {
    Tensor dst = out.slice(0, at, at + t.dim(0));
    put(dst, t, want);
    at += t.dim(0);
    ++prog_.done;
  }
  prog_.bytes_done += static_cast<uint64_t>(out.nbytes());
  if (progress_) progress_(prog_);
  return out;
}

Tensor WeightLoader::matrix(const std::string& name, const Shape& shape) {
  return place(name, shape, Kind::Matrix, true);
}
Tensor WeightLoader::host_matrix(const std::string& name, const Shape& shape) {
  return place(name, shape, Kind::Matrix, true, /*host_mapped=*/true);
}
Tensor WeightLoader::vector(const std::string& name, const Shape& shape) {
  return place(name, shape, Kind::Vector, true);
}
Tensor WeightLoader::optional_vector(const std::string& name, const Shape& shape) {
  return place(name, shape, Kind::Vector, false);
}

}  // namespace llmk
