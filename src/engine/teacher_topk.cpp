#include "engine/teacher_topk.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <string_view>

#include "core/error.h"
#include "core/tensor.h"
#include "formats/safetensors_write.h"
#include "model/model.h"
#include "ops/ops.h"

namespace llmk {

namespace {
// The bytes of a contiguous host tensor.
std::string_view bytes_of(const Tensor& t) {
  return {static_cast<const char*>(t.data()), static_cast<size_t>(t.nbytes())};
}
}  // namespace

TeacherTopkStats export_teacher_topk(Model& model, const std::vector<std::vector<int32_t>>& seqs,
                                     const std::string& path, const TeacherTopkOptions& opts) {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t vocab = model.config().vocab_size;
  const int64_t max_k = std::min<int64_t>(vocab, ops::kMaxTopk);
  LLMK_CHECK(opts.k >= 1 && opts.k <= max_k,
             "k = {} must be from 1 to {} (the vocabulary {}, at "
             "most {})",
             opts.k, max_k, vocab, ops::kMaxTopk);
  LLMK_CHECK(opts.chunk >= 1, "chunk = {} must be at least 1", opts.chunk);
  LLMK_CHECK(!seqs.empty(), "no sequences to run");
  int64_t total = 0;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const auto n = static_cast<int64_t>(seqs[s].size());
    LLMK_CHECK(n > 0, "sequence {} is empty", s + 1);
    LLMK_CHECK(n <= model.context(), "sequence {} has {} tokens, more than the context of {}",
               s + 1, n, model.context());
    for (size_t i = 0; i < seqs[s].size(); ++i) {
      const int32_t id = seqs[s][i];
      LLMK_CHECK(id >= 0 && id < vocab,
                 "sequence {}: token {} ({}) is outside the model's vocabulary of {}", s + 1, i + 1,
                 id, vocab);
    }
    total += n;
  }
  const int64_t k = opts.k;
  std::vector<int64_t> offsets{0};
  for (const auto& s : seqs) offsets.push_back(offsets.back() + static_cast<int64_t>(s.size()));

  const auto S = static_cast<int64_t>(seqs.size());
  safetensors::Writer out(path,
                          {{"offsets", "I64", 8, {S + 1}},
                           {"ids", "I32", 4, {total, k}},
                           {"values", "F32", 4, {total, k}},
                           {"lse", "F32", 4, {total}},
                           {"tokens", "I32", 4, {total}}},
                          {{"format", "llmk-teacher-topk"},
                           {"version", "1"},
                           {"k", std::to_string(k)},
                           {"vocab_size", std::to_string(vocab)},
                           {"model", model.config().summary()}});
  out.write(0, 0, {reinterpret_cast<const char*>(offsets.data()), offsets.size() * 8});

  const Device dev = model.device();
  const int64_t chunk = std::min<int64_t>(opts.chunk, model.context());
  Tensor ids = Tensor::empty({chunk, k}, DType::I32, dev);
  Tensor values = Tensor::empty({chunk, k}, DType::F32, dev);
  Tensor lse = Tensor::empty({chunk}, DType::F32, dev);
  Tensor h_ids = Tensor::empty({chunk, k}, DType::I32),
         h_values = Tensor::empty({chunk, k}, DType::F32);
  Tensor h_lse = Tensor::empty({chunk}, DType::F32);
  for (size_t s = 0; s < seqs.size(); ++s) {
    const std::vector<int32_t>& seq = seqs[s];
    const auto n = static_cast<int64_t>(seq.size());
    out.write(4, static_cast<uint64_t>(offsets[s]) * 4,
              {reinterpret_cast<const char*>(seq.data()), seq.size() * 4});
    for (int64_t pos = 0; pos < n; pos += chunk) {
      const int64_t t = std::min(chunk, n - pos);
      const Tensor logits = model.forward({seq.data() + pos, static_cast<size_t>(t)}, pos, true);
      Tensor i_v = ids.slice(0, 0, t), v_v = values.slice(0, 0, t), l_v = lse.slice(0, 0, t);
      ops::topk_lse(i_v, v_v, l_v, logits);
      Tensor hi = h_ids.slice(0, 0, t), hv = h_values.slice(0, 0, t), hl = h_lse.slice(0, 0, t);
      ops::transfer(hi, i_v);
      ops::transfer(hv, v_v);
      ops::transfer(hl, l_v);
      const auto row = static_cast<uint64_t>(offsets[s] + pos);
      out.write(1, row * static_cast<uint64_t>(k) * 4, bytes_of(hi));
      out.write(2, row * static_cast<uint64_t>(k) * 4, bytes_of(hv));
      out.write(3, row * 4, bytes_of(hl));
    }
    if (opts.progress) opts.progress(static_cast<int64_t>(s) + 1, offsets[s + 1]);
  }
  out.close();
  TeacherTopkStats st;
  st.sequences = S;
  st.positions = total;
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return st;
}

}  // namespace llmk
