// llmk._C: the engine for Python (nanobind); llmk._C.ops (ops.cpp) holds the training ops.
// _Engine: a model and its tokenizer loaded from a GGUF file or a Hugging Face folder, with
// tokenize, detokenize and generate over engine/generator.h (detokenize gives bytes), and
// teacher_topk over engine/teacher_topk.h. python/llmk/__init__.py wraps it as llmk.LLM.
// llmk::Error becomes llmk.Error (a RuntimeError) with the same one-line message. generate()
// releases the GIL.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/generator.h"
#include "engine/teacher_topk.h"
#include "kernels/cpu/matmul.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace nb = nanobind;

namespace llmk {
namespace {

class Engine {
 public:
  Engine(const std::string& path, const std::string& device, int64_t context, int threads,
         const std::string& dtype, bool dequantize, bool cpu_int8, bool gpu_embeddings)
      : model_([&] {
          LLMK_CHECK(context >= 0, "context {} must be >= 0 (0: the model's, at most 4096)",
                     context);
          LLMK_CHECK(threads >= 0, "threads {} must be >= 0 (0: one per hardware thread)", threads);
          if (threads > 0) set_num_threads(threads);
          const Device dev = resolve_device(device);
          return Model::load(path, LoadOptions{.context = context,
                                               .device = dev,
                                               .dtype = parse_dtype(dtype, dev),
                                               .quantized_weights = !dequantize,
                                               .host_embeddings = !gpu_embeddings});
        }()),
        tok_(load_tokenizer(*model_, path)),
        cpu_int8_(cpu_int8) {}

  std::vector<int32_t> tokenize(const std::string& text, bool add_bos, bool parse_special) const {
    return tok_.encode(text, add_bos && tok_.add_bos(), parse_special);
  }

  // Bytes: a token sequence need not end on a character boundary (Python decodes them).
  nb::bytes detokenize(const std::vector<int32_t>& ids, bool skip_special) const {
    for (int32_t id : ids) {
      LLMK_CHECK(id >= 0 && id < tok_.vocab_size(), "token id {} is outside the vocabulary of {}",
                 id, tok_.vocab_size());
    }
    const std::string text = tok_.decode(ids, skip_special);
    return nb::bytes(text.data(), text.size());
  }

  // The bytes of the generated text as `llmk run` prints them (each token's piece, an
  // end-of-generation token's left out). Bad settings throw from the decoder's sampler. on_text
  // (None or a callable): called with each new piece of text that ends on a character boundary
  // (bytes), as it is generated, and once more with what is left at the end; it returns a bool,
  // false stopping generation (stop reason "callback", no further calls; the text may then end in
  // bytes not yet passed on); an exception it raises propagates.
  nb::bytes generate(const std::vector<int32_t>& prompt, const GenerateOptions& opts,
                     nb::object on_text) {
    std::string text;
    Utf8Stream pieces;
    bool stopped = false;
    auto send = [&](const std::string& piece) {
      if (on_text.is_none() || piece.empty() || stopped) return !stopped;
      nb::gil_scoped_acquire held;
      stopped = !nb::cast<bool>(on_text(nb::bytes(piece.data(), piece.size())));
      return !stopped;
    };
    {
      nb::gil_scoped_release released;
      // One generation at a time per model (its KV cache and scratch); taken without the GIL,
      // so that on_text of the generation holding it can run.
      std::lock_guard<std::mutex> one_at_a_time(mu_);
      cpu::set_int8_activations(cpu_int8_);  // process-wide: set for each call of this model
      llmk::generate(*model_, tok_, prompt, opts, [&](int32_t, const std::string& bytes) {
        text += bytes;
        return send(pieces.push(bytes));
      });
      send(pieces.flush());
    }
    return nb::bytes(text.data(), text.size());
  }

  // engine/teacher_topk.h's export; progress (None or a callable) gets (sequences done,
  // positions done) after each sequence. Returns (sequences, positions, seconds).
  std::tuple<int64_t, int64_t, double> teacher_topk(const std::vector<std::vector<int32_t>>& seqs,
                                                    const std::string& path, int k, int64_t chunk,
                                                    nb::object progress) {
    TeacherTopkOptions o;
    o.k = k;
    o.chunk = chunk;
    if (!progress.is_none()) {
      o.progress = [&](int64_t s, int64_t p) {
        nb::gil_scoped_acquire held;
        progress(s, p);
      };
    }
    nb::gil_scoped_release released;
    std::lock_guard<std::mutex> one_at_a_time(mu_);
    cpu::set_int8_activations(cpu_int8_);
    const TeacherTopkStats st = export_teacher_topk(*model_, seqs, path, o);
    return {st.sequences, st.positions, st.seconds};
  }

  std::string device() const { return model_->device() == Device::CUDA ? "cuda" : "cpu"; }
  int64_t context() const { return model_->context(); }
  std::string dtype() const { return std::string(dtype_name(model_->dtype())); }
  std::string summary() const { return model_->config().summary(); }

 private:
  std::unique_ptr<Model> model_;
  Tokenizer tok_;
  bool cpu_int8_;  // cpu::set_int8_activations for this model's calls
  std::mutex mu_;
};

}  // namespace

void register_ops(nb::module_& parent);  // ops.cpp

}  // namespace llmk

NB_MODULE(_C, m) {
  using llmk::Engine;
  m.attr("__version__") = LLMK_VERSION;
  nb::exception<llmk::Error>(m, "Error", PyExc_RuntimeError);
  nb::class_<Engine>(m, "_Engine")
      .def(nb::init<const std::string&, const std::string&, int64_t, int, const std::string&, bool,
                    bool, bool>(),
           nb::arg("path"), nb::arg("device"), nb::arg("context"), nb::arg("threads"),
           nb::arg("dtype"), nb::arg("dequantize"), nb::arg("cpu_int8"), nb::arg("gpu_embeddings"))
      .def("tokenize", &Engine::tokenize, nb::arg("text"), nb::arg("add_bos"),
           nb::arg("parse_special"))
      .def("detokenize", &Engine::detokenize, nb::arg("ids"), nb::arg("skip_special"))
      .def(
          "generate",
          [](Engine& e, const std::vector<int32_t>& prompt, int max_tokens, float temperature,
             int top_k, float top_p, float min_p, float repeat_penalty, uint64_t seed,
             bool stop_at_eos, nb::object on_text) {
            llmk::GenerateOptions o;
            o.max_tokens = max_tokens;
            o.stop_at_eog = stop_at_eos;
            o.sampler.temperature = temperature;
            o.sampler.top_k = top_k;
            o.sampler.top_p = top_p;
            o.sampler.min_p = min_p;
            o.sampler.repeat_penalty = repeat_penalty;
            o.sampler.seed = seed;
            return e.generate(prompt, o, on_text);
          },
          nb::arg("prompt"), nb::arg("max_tokens"), nb::arg("temperature"), nb::arg("top_k"),
          nb::arg("top_p"), nb::arg("min_p"), nb::arg("repeat_penalty"), nb::arg("seed"),
          nb::arg("stop_at_eos"), nb::arg("on_text").none())
      .def("teacher_topk", &Engine::teacher_topk, nb::arg("sequences"), nb::arg("path"),
           nb::arg("k"), nb::arg("chunk"), nb::arg("progress").none())
      .def_prop_ro("device", &Engine::device)
      .def_prop_ro("dtype", &Engine::dtype)
      .def_prop_ro("context", &Engine::context)
      .def_prop_ro("summary", &Engine::summary);
  llmk::register_ops(m);
}
