// ops::attention_varlen: attention over a packed batch of variable-length sequences.
// CPU: each sequence through the CPU attention kernel (bottom-right causal: the sequence's
// queries sit at positions nk - nq ..; non-causal: one query at a time at the last position),
// the log-sum-exp in double beside it. CUDA: the prefill kernel with cu_q / cu_k.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/cpu/attention.h"
#include "ops/attention_common.h"
#include "ops/check.h"
#include "ops/ops.h"

#ifdef LLMK_HAS_CUDA
#include "kernels/cuda/attention/attention.h"
#endif

namespace llmk::ops {

using namespace detail;

namespace {

constexpr std::string_view kOp = "attention_varlen";

struct Dims {
  int64_t Tq, Hq, Hkv, D, Tk, B;
};

Dims check_shapes(const Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v,
                  const Tensor& cu_q, const Tensor& cu_k, const AttentionVarlenParams& p,
                  const Tensor* lse) {
  const NamedTensor all[] = {{"out", &out}, {"q", &q}, {"k", &k}, {"v", &v}};
  for (const auto& [name, t] : all) {
    require_ndim(kOp, name, *t, 3);
    require_last_dim_contiguous(kOp, name, *t);
  }
  const Dims d{q.dim(0), q.dim(1), k.dim(1),
               q.dim(2), k.dim(0), cu_q.ndim() == 1 ? cu_q.dim(0) - 1 : 0};
  LLMK_CHECK(k.dim(2) == d.D, "ops::attention_varlen: q is {} but k is {}: head dims differ",
             q.str(), k.str());
  require_shape(kOp, "v", v, k.shape());
  require_shape(kOp, "out", out, q.shape());
  LLMK_CHECK(d.Hkv > 0 && d.Hq % d.Hkv == 0,
             "ops::attention_varlen: q has {} heads, not a multiple of the {} KV heads of k ({})",
             d.Hq, d.Hkv, k.str());
  require_dtype(kOp, "cu_q", cu_q, DType::I32);
  require_dtype(kOp, "cu_k", cu_k, DType::I32);
  require_ndim(kOp, "cu_q", cu_q, 1);
  LLMK_CHECK(d.B >= 1, "ops::attention_varlen: cu_q ({}) must hold B + 1 >= 2 offsets", cu_q.str());
  require_shape(kOp, "cu_k", cu_k, {d.B + 1});
  LLMK_CHECK(p.window >= 0, "ops::attention_varlen: window = {} must be >= 0", p.window);
  LLMK_CHECK(p.causal || p.window == 0, "ops::attention_varlen: window = {} needs causal = true",
             p.window);
  LLMK_CHECK(p.softcap >= 0.0f && std::isfinite(p.softcap),
             "ops::attention_varlen: softcap = {} must be >= 0", p.softcap);
  LLMK_CHECK(std::isfinite(p.scale), "ops::attention_varlen: scale = {} must be finite", p.scale);
  if (lse != nullptr) {
    require_dtype(kOp, "lse", *lse, DType::F32);
    require_shape(kOp, "lse", *lse, {d.Hq, d.Tq});
    LLMK_CHECK(lse->is_contiguous(), "ops::attention_varlen: lse ({}) must be contiguous",
               lse->str());
    require_disjoint(kOp, "lse", *lse, "q", q);
    require_disjoint(kOp, "lse", *lse, "out", out);
  }
  require_disjoint(kOp, "out", out, "q", q);
  require_disjoint(kOp, "out", out, "k", k);
  require_disjoint(kOp, "out", out, "v", v);
  return d;
}

// CPU: offsets non-decreasing from 0, ending at the q rows and inside the k rows.
void check_offsets(const Tensor& cu, std::string_view name, int64_t B, int64_t end, bool exact,
                   const Tensor& rows_of) {
  const int32_t* c = cu.data<const int32_t>();
  const int64_t s = cu.stride(0);
  LLMK_CHECK(c[0] == 0, "ops::attention_varlen: {}[0] = {} must be 0", name, c[0]);
  for (int64_t b = 0; b < B; ++b) {
    LLMK_CHECK(c[(b + 1) * s] >= c[b * s],
               "ops::attention_varlen: {} must be non-decreasing: {}[{}] = {} < {}[{}] = {}", name,
               name, b + 1, c[(b + 1) * s], name, b, c[b * s]);
  }
  const int64_t last = c[B * s];
  LLMK_CHECK(exact ? last == end : last <= end,
             "ops::attention_varlen: {}[{}] = {} but {} has {} rows", name, B, last, rows_of.str(),
             end);
}

// log-sum-exp (natural log) of one query row's visible logits, in double.
double row_lse(const float* q, const float* k, int64_t k_t, int64_t first, int64_t last, int64_t D,
               float scale, float softcap) {
  if (last < first) return -INFINITY;
  std::vector<double> logits(static_cast<size_t>(last - first + 1));
  double mx = -INFINITY;
  for (int64_t j = first; j <= last; ++j) {
    double dot = 0;
    for (int64_t d = 0; d < D; ++d) dot += static_cast<double>(q[d]) * k[j * k_t + d];
    double s = dot * scale;
    if (softcap > 0.0f) s = softcap * std::tanh(s / softcap);
    logits[static_cast<size_t>(j - first)] = s;
    mx = std::max(mx, s);
  }
  double sum = 0;
  for (double s : logits) sum += std::exp(s - mx);
  return mx + std::log(sum);
}

void attention_varlen_cpu(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v,
                          const Tensor& cu_q, const Tensor& cu_k, const AttentionVarlenParams& p,
                          Tensor* lse, const Dims& d) {
  const NamedTensor all[] = {{"out", &out}, {"q", &q}, {"k", &k}, {"v", &v}};
  for (const auto& [name, t] : all) require_dtype(kOp, name, *t, DType::F32);
  check_offsets(cu_q, "cu_q", d.B, d.Tq, true, q);
  check_offsets(cu_k, "cu_k", d.B, d.Tk, false, k);
  const float scale = resolved_scale(p, d.D);
  const int32_t* cq = cu_q.data<const int32_t>();
  const int32_t* ck = cu_k.data<const int32_t>();
  const int64_t sq = cu_q.stride(0), sk = cu_k.stride(0);
  const int64_t group = d.Hq / d.Hkv;

  for (int64_t b = 0; b < d.B; ++b) {
    const int64_t q0 = cq[b * sq], nq = cq[(b + 1) * sq] - q0;
    const int64_t k0 = ck[b * sk], nk = ck[(b + 1) * sk] - k0;
    const int64_t offset = nk - nq;  // query i sits at position i + offset
    // Query rows [blind, nq) see at least one key; rows before see none (out 0, lse -inf).
    const int64_t blind = p.causal ? std::clamp<int64_t>(-offset, 0, nq) : (nk > 0 ? 0 : nq);
    for (int64_t t = q0; t < q0 + blind; ++t) {
      for (int64_t h = 0; h < d.Hq; ++h) {
        float* o = out.data<float>() + t * out.stride(0) + h * out.stride(1);
        std::fill(o, o + d.D, 0.0f);
      }
    }
    cpu::AttentionArgs a;
    a.out_t = out.stride(0);
    a.out_h = out.stride(1);
    a.q_t = q.stride(0);
    a.q_h = q.stride(1);
    a.k = k.data<const float>() + k0 * k.stride(0);
    a.k_t = k.stride(0);
    a.k_h = k.stride(1);
    a.v = v.data<const float>() + k0 * v.stride(0);
    a.v_t = v.stride(0);
    a.v_h = v.stride(1);
    a.Hq = d.Hq;
    a.Hkv = d.Hkv;
    a.D = d.D;
    a.scale = scale;
    a.window = p.window;
    a.softcap = p.softcap;
    if (d.Hq > 0 && d.D > 0 && blind < nq) {
      if (p.causal) {
        a.out = out.data<float>() + (q0 + blind) * out.stride(0);
        a.q = q.data<const float>() + (q0 + blind) * q.stride(0);
        a.T = nq - blind;
        a.pos0 = blind + offset;
        cpu::attention(a);
      } else {
        for (int64_t t = q0; t < q0 + nq; ++t) {  // each query alone, at the last key
          a.out = out.data<float>() + t * out.stride(0);
          a.q = q.data<const float>() + t * q.stride(0);
          a.T = 1;
          a.pos0 = nk - 1;
          cpu::attention(a);
        }
      }
    }
    if (lse != nullptr) {
      float* l = lse->data<float>();
      for (int64_t i = 0; i < nq; ++i) {
        const int64_t pos = i + offset;
        int64_t first = 0, last = nk - 1;
        if (p.causal) {
          last = std::min(pos, nk - 1);
          if (p.window > 0) first = std::max<int64_t>(0, pos - p.window + 1);
        }
        for (int64_t h = 0; h < d.Hq; ++h) {
          const float* qr = q.data<const float>() + (q0 + i) * q.stride(0) + h * q.stride(1);
          const float* kr = k.data<const float>() + k0 * k.stride(0) + (h / group) * k.stride(1);
          l[h * d.Tq + q0 + i] =
              static_cast<float>(row_lse(qr, kr, k.stride(0), first, last, d.D, scale, p.softcap));
        }
      }
    }
  }
}

#ifdef LLMK_HAS_CUDA
void attention_varlen_cuda(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v,
                           const Tensor& cu_q, const Tensor& cu_k, const AttentionVarlenParams& p,
                           Tensor* lse, const Dims& d) {
  const DType dt = q.dtype();
  LLMK_CHECK(dt == DType::BF16 || dt == DType::F16,
             "ops::attention_varlen: q is {}; the CUDA kernel takes bf16 or f16", q.str());
  const NamedTensor all[] = {{"out", &out}, {"q", &q}, {"k", &k}, {"v", &v}};
  for (const auto& [name, t] : all) {
    require_dtype(kOp, name, *t, dt);
    require_16_byte_rows(kOp, name, *t);
  }
  LLMK_CHECK(cu_q.stride(0) == 1 && cu_k.stride(0) == 1,
             "ops::attention_varlen: cu_q ({}) and cu_k ({}) must be contiguous on the GPU",
             cu_q.str(), cu_k.str());
  LLMK_CHECK(cuda::attention_head_dim_supported(static_cast<int>(d.D)),
             "ops::attention_varlen: head dim {} (q is {}) is not supported by the CUDA kernel "
             "({})",
             d.D, q.str(), cuda::attention_head_dims());
  constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();
  LLMK_CHECK(d.Tq <= kMaxInt && d.Tk <= kMaxInt && d.B <= kMaxInt / 2 &&
                 (d.Tq / 64 + d.B) * d.Hq <= kMaxInt,
             "ops::attention_varlen: q is {}, k is {}, {} sequences: too large for the CUDA kernel",
             q.str(), k.str(), d.B);
  if (d.Tq == 0 || d.Hq == 0) return;

  cuda::AttentionArgs a = cuda_attention_args(out, q, k, v, p);
  a.B = static_cast<int>(d.B);
  a.cu_q = cu_q.data<const int32_t>();
  a.cu_k = cu_k.data<const int32_t>();
  a.lse = lse != nullptr ? lse->data<float>() : nullptr;
  a.causal = p.causal;
  cuda::attention_prefill(a);
  count_attention(AttentionPath::kPrefill);
}
#endif

}  // namespace

void attention_varlen(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v,
                      const Tensor& cu_q, const Tensor& cu_k, const AttentionVarlenParams& p,
                      Tensor* lse) {
  const bool cuda =
      lse != nullptr
          ? on_cuda(kOp, {{"out", &out},
                          {"q", &q},
                          {"k", &k},
                          {"v", &v},
                          {"cu_q", &cu_q},
                          {"cu_k", &cu_k},
                          {"lse", lse}})
          : on_cuda(
                kOp,
                {{"out", &out}, {"q", &q}, {"k", &k}, {"v", &v}, {"cu_q", &cu_q}, {"cu_k", &cu_k}});
  const Dims d = check_shapes(out, q, k, v, cu_q, cu_k, p, lse);
  if (cuda) {
#ifdef LLMK_HAS_CUDA
    attention_varlen_cuda(out, q, k, v, cu_q, cu_k, p, lse, d);
#endif
    return;
  }
  attention_varlen_cpu(out, q, k, v, cu_q, cu_k, p, lse, d);
  count_attention(AttentionPath::kCpu);
}

}  // namespace llmk::ops
