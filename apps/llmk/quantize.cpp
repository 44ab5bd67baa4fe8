// llmk quantize IN OUT --type TYPE: a bf16/f16/f32 model (a GGUF file or a Hugging Face folder)
// written as a GGUF file whose weight matrices are quantised (src/kernels/cpu/quantize.h) with
// the types of src/formats/quant_plan.h. Everything that can be refused is refused before the
// output is opened: a missing input, an output that exists (without --force), an input that is
// already quantised, a tensor of another dtype, a Hugging Face model GGUF cannot describe. Then
// each tensor is converted in chunks of rows on the CPU thread pool and streamed to
// "<OUT>.partial", renamed to OUT at the end; progress goes to stderr, the summary to stdout.
#include "apps/llmk/quantize.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>

#include "apps/llmk/commands.h"
#include "core/error.h"
#include "core/half.h"
#include "core/text.h"
#include "core/thread_pool.h"
#include "formats/gguf_write.h"
#include "formats/quant_plan.h"
#include "kernels/cpu/dequant.h"
#include "kernels/cpu/quantize.h"

namespace llmk::cli {

namespace {

namespace fs = std::filesystem;
using quantize::Edit;
using quantize::Source;
using quantize::SourceTensor;

constexpr const char* kTypesHelp =
    R"(Types (bits per weight of a quantised matrix, its scales included):
  q8_0    8.5   blocks of 32: 8-bit weights, one f16 scale; closest to the original
  q6_k    6.56  super-blocks of 256: 16 groups of 16 with 8-bit scales, 6-bit weights
  q5_1    6.0   blocks of 32: 5-bit weights, f16 scale and minimum
  q5_0    5.5   blocks of 32: 5-bit weights, one f16 scale
  q5_k    5.5   super-blocks of 256: 8 sub-blocks of 32 with 6-bit scales and minima
  q4_1    5.0   blocks of 32: 4-bit weights, f16 scale and minimum
  q4_0    4.5   blocks of 32: 4-bit weights, one f16 scale
  q4_k    4.5   super-blocks of 256 as q5_k, 4-bit weights
  q4_k_m  mixed llama.cpp's Q4_K_M: q4_k, with q6_k for the output (or tied embeddings)
                and for attn_v and ffn_down of the first and last eighth of the layers and
                every third layer between, q5_k for a fused attn_qkv
  f32, f16, bf16      no quantisation: every weight matrix in that float type (a Hugging
                      Face folder converted to GGUF as it is)
A single type applies to every weight matrix, the token embeddings included. Norm weights and
other 1-D tensors are written as f32; a matrix whose rows are not whole blocks takes llama.cpp's
fallback (q4_k -> q5_0, q5_k -> q5_1, q6_k -> q8_0) or, when even 32-blocks do not fit, keeps its
float type. The input must be bf16, f16 or f32: requantising a quantised file is not supported.
A Hugging Face folder (config.json, *.safetensors, tokenizer.json) is converted as llama.cpp's
converter does (names, metadata, tokenizer; Llama's Q/K rows interleaved for its RoPE layout).
The legacy types round as ggml's reference quantiser does, byte for byte; the k-quants use
llmk's own search for each sub-block's scale.)";

// A GGUF input: its metadata and tensors as they are (the quantisation keys are written anew).
Source read_gguf(const std::string& path) {
  const gguf::File f = gguf::File::open(path);
  Source s;
  for (const auto& [key, value] : f.metadata()) {
    if (key == "general.file_type" || key == "general.quantization_version") continue;
    s.metadata.emplace_back(key, value);
  }
  for (const gguf::TensorInfo& t : f.tensors()) {
    s.tensors.push_back({t.name, t.name, f.tensor(t.name), Edit::None, 0});
  }
  return s;
}

// What llmk cannot quantise, refused before anything is written.
void check_source(const std::string& path, const Source& s) {
  LLMK_CHECK(!s.tensors.empty(), "{}: the model has no tensors", path);
  size_t quantised = 0;
  const SourceTensor* first = nullptr;
  for (const SourceTensor& t : s.tensors) {
    if (!is_quantized(t.data.dtype())) continue;
    if (first == nullptr) first = &t;
    ++quantised;
  }
  if (first != nullptr) {
    LLMK_FAIL(
        "{}: already quantised (tensor '{}' is {}, and {} of the {} tensors are quantised); "
        "requantising is not supported: quantise the bf16, f16 or f32 original",
        path, printable(first->origin), dtype_name(first->data.dtype()), quantised,
        s.tensors.size());
  }
  for (const SourceTensor& t : s.tensors) {
    LLMK_CHECK(is_float_type(t.data.dtype()),
               "{}: tensor '{}' has dtype {}; llmk quantize reads f32, f16 and bf16 tensors", path,
               printable(t.origin), dtype_name(t.data.dtype()));
  }
}

quant::ModelShape model_shape(const Source& s) {
  quant::ModelShape m;
  for (const SourceTensor& t : s.tensors) {
    m.has_output |= t.name == "output.weight";
    if (t.name.rfind("blk.", 0) != 0) continue;
    int64_t layer = 0;
    size_t i = 4;
    for (; i < t.name.size() && i < 12 && t.name[i] >= '0' && t.name[i] <= '9'; ++i) {
      layer = layer * 10 + (t.name[i] - '0');
    }
    if (i > 4 && i < t.name.size() && t.name[i] == '.')
      m.n_layers = std::max(m.n_layers, layer + 1);
  }
  return m;
}

struct Planned {
  const SourceTensor* src;
  quant::TensorPlan plan;
};

// Rows [r0, r1) of `t` ([rows, cols]) converted to `type` at `out` (row after row). Each row is
// read as f32, edited, checked and written in the output's type.
void convert_rows(const std::string& path, const SourceTensor& t, int64_t rows, DType type,
                  int64_t r0, int64_t r1, uint8_t* out) {
  const int64_t cols = t.data.shape().back();
  const int64_t in_row = bytes_for(t.data.dtype(), cols), out_row = bytes_for(type, cols);
  const auto* in = static_cast<const uint8_t*>(t.data.data());
  std::vector<float> x(static_cast<size_t>(cols));
  for (int64_t r = r0; r < r1; ++r) {
    int64_t from = r;
    if (t.edit == Edit::InterleaveRopeHalves) {
      // Output row h*D + 2j + s is input row h*D + s*(D/2) + j.
      const int64_t d = rows / t.heads, h = r / d, i = r % d;
      from = h * d + (i % 2) * (d / 2) + i / 2;
    }
    cpu::dequantize_row(t.data.dtype(), in + from * in_row, x.data(), cols);
    if (t.edit == Edit::AddOne) {
      for (float& v : x) v += 1.0f;
    }
    uint8_t* o = out + (r - r0) * out_row;
    switch (type) {
      case DType::F32:
        std::memcpy(o, x.data(), static_cast<size_t>(out_row));
        break;
      case DType::F16:
      case DType::BF16:
        for (int64_t i = 0; i < cols; ++i) {
          const float v = x[static_cast<size_t>(i)];
          const uint16_t h = type == DType::F16 ? float_to_fp16(v) : float_to_bf16(v);
          std::memcpy(o + 2 * i, &h, 2);
        }
        break;
      default:
        for (int64_t i = 0; i < cols; ++i) {
          LLMK_CHECK(std::isfinite(x[static_cast<size_t>(i)]),
                     "{}: tensor '{}' holds {} at row {}, column {}: a weight that is not finite "
                     "cannot be quantised",
                     path, printable(t.origin), x[static_cast<size_t>(i)], from, i);
        }
        cpu::quantize_row(type, x.data(), o, cols);
    }
  }
}

// Streams tensor `p` into the writer: its bytes as they are when nothing changes, else chunks of
// rows converted on the thread pool.
void write_tensor(const std::string& path, const Planned& p, gguf::Writer& w) {
  const SourceTensor& t = *p.src;
  const DType type = p.plan.dtype;
  const int64_t cols = t.data.shape().back(), rows = t.data.numel() / cols;
  constexpr int64_t kChunkBytes = int64_t{32} << 20;
  if (type == t.data.dtype() && t.edit == Edit::None) {
    const auto* bytes = static_cast<const uint8_t*>(t.data.data());
    const auto n = static_cast<uint64_t>(t.data.nbytes());
    for (uint64_t at = 0; at < n; at += kChunkBytes) {
      w.write(bytes + at, std::min<uint64_t>(kChunkBytes, n - at));
    }
    return;
  }
  const int64_t out_row = bytes_for(type, cols);
  const int64_t chunk = std::max<int64_t>(1, kChunkBytes / out_row);
  std::vector<uint8_t> buf(static_cast<size_t>(std::min(chunk, rows) * out_row));
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t n = std::min(chunk, rows - r0);
    cpu_pool().parallel_for(n, 1, [&](int64_t a, int64_t b) {
      convert_rows(path, t, rows, type, r0 + a, r0 + b, buf.data() + a * out_row);
    });
    w.write(buf.data(), static_cast<uint64_t>(n * out_row));
  }
}

std::string mib(uint64_t bytes) { return fmt::format("{:.2f} MiB", bytes / 1048576.0); }

// The output path: refused when it exists (unless --force), is the input, or has no folder.
void check_output(const std::string& in, const std::string& out, bool force) {
  std::error_code ec;
  const fs::path parent = fs::path(out).has_parent_path() ? fs::path(out).parent_path() : ".";
  LLMK_CHECK(fs::is_directory(parent, ec), "{}: the folder {} does not exist", out,
             parent.string());
  if (!fs::exists(out, ec)) return;
  LLMK_CHECK(!fs::is_directory(out, ec), "{}: is a folder; give the GGUF file to write", out);
  LLMK_CHECK(!fs::equivalent(in, out, ec), "{}: is the input; write the output to another file",
             out);
  LLMK_CHECK(force, "{}: already exists; pass --force to replace it", out);
}

struct Args {
  std::string in, out, type;
  bool force = false;
  int threads = 0;
};

int run_quantize(const Args& a) {
  const auto start = std::chrono::steady_clock::now();
  std::error_code ec;
  LLMK_CHECK(fs::exists(a.in, ec), "{}: no such file or folder", a.in);
  const quant::Scheme scheme = *quant::parse_scheme(a.type);  // the option's check passed
  check_output(a.in, a.out, a.force);
  set_num_threads(a.threads);

  const bool hf = fs::is_directory(a.in, ec);
  const Source s = hf ? quantize::read_hf_folder(a.in) : read_gguf(a.in);
  check_source(a.in, s);
  const quant::ModelShape shape = model_shape(s);
  std::vector<Planned> plan;
  for (const SourceTensor& t : s.tensors) {
    plan.push_back({&t, quant::plan_tensor(scheme, t.name, t.data.shape(), t.data.dtype(), shape)});
  }

  gguf::Writer w;
  for (const auto& [key, value] : s.metadata) w.set(key, value);
  w.set("general.quantization_version", gguf::Value(gguf::ValueType::U32, int64_t{2}));
  w.set("general.file_type",
        gguf::Value(gguf::ValueType::U32, int64_t{quant::llama_file_type(scheme)}));
  for (const Planned& p : plan) w.add_tensor(p.src->name, p.src->data.shape(), p.plan.dtype);
  w.open(a.out);

  uint64_t in_bytes = 0, out_bytes = 0, weights = 0;
  std::map<std::string, int> types, reasons;
  std::map<std::string, int> in_types;
  for (size_t i = 0; i < plan.size(); ++i) {
    const Planned& p = plan[i];
    const SourceTensor& t = *p.src;
    fmt::print(stderr, "[{:>{}}/{}] {:<32} {:<14} {} -> {}{}\n", i + 1,
               fmt::formatted_size("{}", plan.size()), plan.size(), printable(t.name),
               shape_str(t.data.shape()), dtype_name(t.data.dtype()), dtype_name(p.plan.dtype),
               p.plan.why.empty() ? "" : " (" + p.plan.why + ")");
    std::fflush(stderr);
    write_tensor(a.in, p, w);
    in_bytes += static_cast<uint64_t>(t.data.nbytes());
    out_bytes += w.tensor_bytes(i);
    weights += static_cast<uint64_t>(t.data.numel());
    ++types[std::string(dtype_name(p.plan.dtype))];
    ++in_types[std::string(dtype_name(t.data.dtype()))];
    if (!p.plan.why.empty())
      ++reasons[fmt::format("{} ({})", dtype_name(p.plan.dtype), p.plan.why)];
  }
  w.finish();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  const auto counts = [](const std::map<std::string, int>& m) {
    std::string out;
    for (const auto& [name, n] : m) out += fmt::format("{}{} {}", out.empty() ? "" : ", ", n, name);
    return out;
  };
  fmt::print("quantized {} -> {} as {}\n", printable(a.in), printable(a.out),
             quant::scheme_name(scheme));
  fmt::print("  input:  {} tensors, {} of tensor data ({}), {:.3f} M weights\n", plan.size(),
             mib(in_bytes), counts(in_types), weights / 1e6);
  fmt::print("  output: {} file, {} of tensor data, {:.2f} bits per weight\n", mib(w.file_bytes()),
             mib(out_bytes),
             weights > 0 ? 8.0 * static_cast<double>(out_bytes) / static_cast<double>(weights) : 0);
  fmt::print("  types:  {}\n", counts(types));
  for (const auto& [why, n] : reasons) fmt::print("  {} x {}\n", n, why);
  for (const std::string& skipped : s.skipped) fmt::print("  not written: {}\n", skipped);
  fmt::print("  time:   {:.2f} s on {} threads\n", seconds, cpu_pool().num_threads());
  return 0;
}

}  // namespace

Command add_quantize(CLI::App& cmd) {
  auto a = std::make_shared<Args>();
  cmd.add_option("input", a->in,
                 "The model: a GGUF file, or a Hugging Face folder (config.json, *.safetensors, "
                 "tokenizer.json), in bf16, f16 or f32")
      ->required();
  cmd.add_option("output", a->out, "The GGUF file to write")->required();
  cmd.add_option("--type", a->type, "The quantisation: " + quant::scheme_names())
      ->required()
      ->check(CLI::Validator(
          [](std::string& s) -> std::string {
            if (quant::parse_scheme(s)) return {};
            return fmt::format("unknown type '{}' (supported: {})", printable(s, 40),
                               quant::scheme_names());
          },
          "TYPE"));
  cmd.add_flag("--force", a->force, "Replace the output file when it exists");
  add_threads_option(cmd, a->threads);
  cmd.footer(kTypesHelp);
  return [a] { return run_quantize(*a); };
}

}  // namespace llmk::cli
