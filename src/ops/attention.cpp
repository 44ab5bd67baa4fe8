#include "kernels/cpu/attention.h"

#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/cpu/kv_cache.h"
#include "ops/attention_common.h"
#include "ops/check.h"
#include "ops/kv_append.h"
#include "ops/ops.h"

#ifdef LLMK_HAS_CUDA
#include "kernels/cuda/attention/attention.h"
#endif

namespace llmk::ops {

using namespace detail;

namespace {

constexpr std::string_view kOp = "attention";

struct Counters {
  std::atomic<uint64_t> prefill{0}, decode{0}, chunked{0}, fallback{0}, cpu{0};
};
Counters& counters() {
  static Counters c;
  return c;
}

struct Dims {
  int64_t T, Hq, Hkv, D, L;
};

// Everything that does not depend on the device or on the position values.
Dims check_shapes(const Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v,
                  const Tensor& positions, const AttentionParams& p) {
  const std::pair<std::string_view, const Tensor*> all[] = {
      {"out", &out}, {"q", &q}, {"k", &k}, {"v", &v}};
  for (const auto& [name, t] : all) {
    require_ndim(kOp, name, *t, 3);
    require_last_dim_contiguous(kOp, name, *t);
  }
  const Dims d{q.dim(0), q.dim(1), k.dim(1), q.dim(2), k.dim(0)};
  LLMK_CHECK(k.dim(2) == d.D, "ops::attention: q is {} but k is {}: head dims differ", q.str(),
             k.str());
  require_shape(kOp, "v", v, k.shape());
  require_shape(kOp, "out", out, q.shape());
  LLMK_CHECK(d.Hkv > 0 && d.Hq % d.Hkv == 0,
             "ops::attention: q has {} heads, not a multiple of the {} KV heads of k ({})", d.Hq,
             d.Hkv, k.str());
  require_dtype(kOp, "positions", positions, DType::I32);
  require_shape(kOp, "positions", positions, {d.T});
  LLMK_CHECK(p.window >= 0, "ops::attention: window = {} must be >= 0", p.window);
  LLMK_CHECK(p.softcap >= 0.0f && std::isfinite(p.softcap),
             "ops::attention: softcap = {} must be >= 0", p.softcap);
  LLMK_CHECK(std::isfinite(p.scale), "ops::attention: scale = {} must be finite", p.scale);
  require_disjoint(kOp, "out", out, "q", q);
  require_disjoint(kOp, "out", out, "k", k);
  require_disjoint(kOp, "out", out, "v", v);
  return d;
}

// CPU: positions must be consecutive and inside the cache; returns positions[0].
int64_t check_positions(const Tensor& positions, const Tensor& k, int64_t T, int64_t L) {
  const int32_t* pos = positions.data<const int32_t>();
  const int64_t stride = positions.stride(0);
  const int64_t pos0 = pos[0];
  LLMK_CHECK(pos0 >= 0, "ops::attention: positions[0] = {} must be >= 0", pos0);
  for (int64_t t = 1; t < T; ++t) {
    LLMK_CHECK(pos[t * stride] == pos0 + t,
               "ops::attention: positions must be consecutive: positions[0] = {} but "
               "positions[{}] = {} (expected {})",
               pos0, t, pos[t * stride], pos0 + t);
  }
  LLMK_CHECK(pos0 + T - 1 < L,
             "ops::attention: the KV cache holds {} positions (k is {}) but queries reach "
             "position {} (positions[{}])",
             L, k.str(), pos0 + T - 1, T - 1);
  return pos0;
}

#ifdef LLMK_HAS_CUDA
void attention_cuda(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v,
                    const Tensor& positions, const AttentionParams& p, const Dims& d) {
  const DType dt = require_activations(kOp, true, {{"out", &out}, {"q", &q}, {"k", &k}, {"v", &v}});
  for (const auto& [name, t] : {NamedTensor{"out", &out}, NamedTensor{"q", &q},
                                NamedTensor{"k", &k}, NamedTensor{"v", &v}}) {
    require_16_byte_rows(kOp, name, *t);
  }
  LLMK_CHECK(d.T <= 1 || positions.stride(0) == 1,
             "ops::attention: positions ({}) must be contiguous on the GPU", positions.str());
  const bool fast = cuda::attention_head_dim_supported(static_cast<int>(d.D));
  LLMK_CHECK(fast || (d.D % 2 == 0 && d.D <= cuda::kGenericMaxD),
             "ops::attention: head dim {} (q is {}) is not supported by the CUDA kernels ({}; "
             "the fallback kernel: even, at most {})",
             d.D, q.str(), cuda::attention_head_dims(), cuda::kGenericMaxD);
  constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();
  LLMK_CHECK(d.T <= kMaxInt && d.Hq <= 65535 && d.L <= kMaxInt,
             "ops::attention: q is {}, k is {}: too large for the CUDA kernels", q.str(), k.str());
  if (d.T == 0 || d.Hq == 0) return;

  cuda::AttentionArgs a = cuda_attention_args(out, q, k, v, p);
  a.positions = positions.data<const int32_t>();
  // The tensor-core kernels take bf16 and fp16; f32 falls back.
  if (!fast || dt == DType::F32) {
    cuda::attention_generic(a);
    count_attention(AttentionPath::kFallback);
  } else if (d.T <= cuda::kDecodeMaxQueries) {
    cuda::attention_decode(a);
    count_attention(AttentionPath::kDecode);
  } else {
    cuda::attention_prefill(a);
    count_attention(AttentionPath::kPrefill);
  }
}
#endif

}  // namespace

void attention(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v,
               const Tensor& positions, const AttentionParams& p) {
  const bool cuda =
      on_cuda(kOp, {{"out", &out}, {"q", &q}, {"k", &k}, {"v", &v}, {"positions", &positions}});
  const Dims d = check_shapes(out, q, k, v, positions, p);
  if (cuda) {
#ifdef LLMK_HAS_CUDA
    attention_cuda(out, q, k, v, positions, p, d);
#endif
    return;
  }

  const std::pair<std::string_view, const Tensor*> all[] = {
      {"out", &out}, {"q", &q}, {"k", &k}, {"v", &v}};
  for (const auto& [name, t] : all) require_dtype(kOp, name, *t, DType::F32);
  if (d.T == 0) return;
  const int64_t pos0 = check_positions(positions, k, d.T, d.L);
  cpu::AttentionArgs a;
  a.out = out.data<float>();
  a.out_t = out.stride(0);
  a.out_h = out.stride(1);
  a.q = q.data<const float>();
  a.q_t = q.stride(0);
  a.q_h = q.stride(1);
  a.k = k.data<const float>();
  a.k_t = k.stride(0);
  a.k_h = k.stride(1);
  a.v = v.data<const float>();
  a.v_t = v.stride(0);
  a.v_h = v.stride(1);
  a.T = d.T;
  a.Hq = d.Hq;
  a.Hkv = d.Hkv;
  a.D = d.D;
  a.pos0 = pos0;
  a.scale = resolved_scale(p, d.D);
  a.window = p.window;
  a.softcap = p.softcap;
  if (d.Hq == 0 || d.D == 0) return;
  cpu::attention(a);
  count_attention(AttentionPath::kCpu);
}

namespace detail {
void count_attention(AttentionPath path) {
  Counters& c = counters();
  switch (path) {
    case AttentionPath::kPrefill:
      ++c.prefill;
      break;
    case AttentionPath::kDecode:
      ++c.decode;
      break;
    case AttentionPath::kChunked:
      ++c.chunked;
      break;
    case AttentionPath::kFallback:
      ++c.fallback;
      break;
    case AttentionPath::kCpu:
      ++c.cpu;
      break;
  }
}
}  // namespace detail

AttentionStats attention_stats() {
  Counters& c = counters();
  return {c.prefill.load(), c.decode.load(), c.chunked.load(), c.fallback.load(), c.cpu.load()};
}

void reset_attention_stats() {
  Counters& c = counters();
  c.prefill = 0;
  c.decode = 0;
  c.chunked = 0;
  c.fallback = 0;
  c.cpu = 0;
}

namespace {

constexpr std::string_view kPagedOp = "attention_paged";

struct PagedDims {
  int64_t T, Hq, Hkv, D, B, P;
};

PagedDims check_paged_shapes(const Tensor& out, const Tensor& q, const Tensor& k_pool,
                             const Tensor& v_pool, const Tensor& page_table, int64_t page_size,
                             const Tensor& cu_q, const Tensor& positions, int64_t max_q,
                             const AttentionParams& p) {
  for (const auto& [name, t] : {NamedTensor{"out", &out}, NamedTensor{"q", &q},
                                NamedTensor{"k_pool", &k_pool}, NamedTensor{"v_pool", &v_pool}}) {
    require_ndim(kPagedOp, name, *t, 3);
    require_last_dim_contiguous(kPagedOp, name, *t);
  }
  const PagedDims d{q.dim(0),
                    q.dim(1),
                    k_pool.dim(1),
                    q.dim(2),
                    cu_q.defined() ? cu_q.numel() - 1 : 1,
                    page_table.ndim() == 2 ? page_table.dim(1) : 0};
  LLMK_CHECK(k_pool.dim(2) == d.D,
             "ops::attention_paged: q is {} but k_pool is {}: head dims differ", q.str(),
             k_pool.str());
  require_shape(kPagedOp, "v_pool", v_pool, k_pool.shape());
  require_shape(kPagedOp, "out", out, q.shape());
  LLMK_CHECK(
      d.Hkv > 0 && d.Hq % d.Hkv == 0,
      "ops::attention_paged: q has {} heads, not a multiple of the {} KV heads of k_pool ({})",
      d.Hq, d.Hkv, k_pool.str());
  if (cu_q.defined()) {
    require_dtype(kPagedOp, "cu_q", cu_q, DType::I32);
    require_ndim(kPagedOp, "cu_q", cu_q, 1);
    LLMK_CHECK(d.B >= 1, "ops::attention_paged: cu_q ({}) must hold B + 1 >= 2 offsets",
               cu_q.str());
  } else {
    LLMK_CHECK(max_q >= d.T,
               "ops::attention_paged: one sequence of {} rows (no cu_q) but "
               "max_q_per_seq = {}",
               d.T, max_q);
  }
  require_dtype(kPagedOp, "page_table", page_table, DType::I32);
  require_shape(kPagedOp, "page_table", page_table, {d.B, d.P});
  require_dtype(kPagedOp, "positions", positions, DType::I32);
  require_shape(kPagedOp, "positions", positions, {d.T});
  LLMK_CHECK(page_size >= 1 && d.P >= 1 && k_pool.dim(0) % page_size == 0,
             "ops::attention_paged: page_size {} must be >= 1 and divide the pool's {} rows ({}), "
             "with at least one page per sequence (page_table {})",
             page_size, k_pool.dim(0), k_pool.str(), page_table.str());
  LLMK_CHECK(max_q >= 1, "ops::attention_paged: max_q_per_seq = {} must be >= 1", max_q);
  LLMK_CHECK(p.window >= 0, "ops::attention_paged: window = {} must be >= 0", p.window);
  LLMK_CHECK(p.softcap >= 0.0f && std::isfinite(p.softcap),
             "ops::attention_paged: softcap = {} must be >= 0", p.softcap);
  LLMK_CHECK(std::isfinite(p.scale), "ops::attention_paged: scale = {} must be finite", p.scale);
  for (const auto& [name, t] :
       {NamedTensor{"q", &q}, NamedTensor{"k_pool", &k_pool}, NamedTensor{"v_pool", &v_pool},
        NamedTensor{"page_table", &page_table}, NamedTensor{"positions", &positions}}) {
    require_disjoint(kPagedOp, "out", out, name, *t);
  }
  return d;
}

// CPU: every index is checked; each sequence's keys are gathered into one contiguous block
// (or read in place when its pages are adjacent in the pool) for the CPU kernel.
void attention_paged_cpu(Tensor& out, const Tensor& q, const Tensor& k_pool, const Tensor& v_pool,
                         const Tensor& page_table, int64_t page_size, const Tensor& cu_q,
                         const Tensor& positions, int64_t max_q, const AttentionParams& p,
                         const PagedDims& d) {
  const KvScales* scales = p.kv_scales;
  const kvq::Format format = scales ? detail::kv_format(k_pool) : kvq::Format::I8;  // (8-bit only)
  for (const auto& [name, t] : {NamedTensor{"out", &out}, NamedTensor{"q", &q},
                                NamedTensor{"k_pool", &k_pool}, NamedTensor{"v_pool", &v_pool}}) {
    if (scales == nullptr || (t != &k_pool && t != &v_pool)) {
      require_dtype(kPagedOp, name, *t, DType::F32);
    }
  }
  const Tensor pt = page_table.contiguous();
  const int32_t* table = pt.data<const int32_t>();
  const int64_t pool_pages = k_pool.dim(0) / page_size;
  std::vector<float> kbuf, vbuf;
  for (int64_t b = 0; b < d.B; ++b) {
    const int64_t q0 = cu_q.defined() ? cu_q.data<const int32_t>()[b * cu_q.stride(0)] : 0;
    const int64_t q1 = cu_q.defined() ? cu_q.data<const int32_t>()[(b + 1) * cu_q.stride(0)] : d.T;
    LLMK_CHECK(q0 >= 0 && q0 <= q1 && q1 <= d.T && q1 - q0 <= max_q,
               "ops::attention_paged: cu_q[{}..{}] = {}..{} must be non-decreasing rows of q ({}) "
               "with at most max_q_per_seq = {} per sequence",
               b, b + 1, q0, q1, q.str(), max_q);
    if (q1 == q0) continue;
    Tensor pos_b = positions.slice(0, q0, q1);
    const int64_t n_keys = check_positions(pos_b, k_pool, q1 - q0, d.P * page_size) + (q1 - q0);
    const int64_t n_pages = (n_keys + page_size - 1) / page_size;
    bool adjacent = true;
    for (int64_t i = 0; i < n_pages; ++i) {
      const int32_t pg = table[b * d.P + i];
      LLMK_CHECK(pg >= 0 && pg < pool_pages,
                 "ops::attention_paged: page_table[{}, {}] = {} is outside the pool of {} pages", b,
                 i, pg, pool_pages);
      adjacent = adjacent && pg == table[b * d.P] + i;
    }
    adjacent = adjacent && scales == nullptr;  // 8-bit rows are decoded into the buffers
    const int64_t row_elems = d.Hkv * d.D;
    cpu::AttentionArgs a;
    if (adjacent) {
      const int64_t row0 = static_cast<int64_t>(table[b * d.P]) * page_size;
      a.k = k_pool.data<const float>() + row0 * k_pool.stride(0);
      a.v = v_pool.data<const float>() + row0 * v_pool.stride(0);
      a.k_t = k_pool.stride(0);
      a.k_h = k_pool.stride(1);
      a.v_t = v_pool.stride(0);
      a.v_h = v_pool.stride(1);
    } else {
      kbuf.resize(static_cast<size_t>(n_keys * row_elems));
      vbuf.resize(kbuf.size());
      for (int64_t j = 0; j < n_keys; ++j) {
        const int64_t row =
            static_cast<int64_t>(table[b * d.P + j / page_size]) * page_size + j % page_size;
        for (int64_t h = 0; h < d.Hkv; ++h) {
          float* kd = kbuf.data() + (j * d.Hkv + h) * d.D;
          float* vd = vbuf.data() + (j * d.Hkv + h) * d.D;
          if (scales != nullptr) {
            const auto* kb = static_cast<const uint8_t*>(k_pool.data()) + row * k_pool.stride(0) +
                             h * k_pool.stride(1);
            const auto* vb = static_cast<const uint8_t*>(v_pool.data()) + row * v_pool.stride(0) +
                             h * v_pool.stride(1);
            cpu::kv_decode(kd, kb, scales->k.data<const float>()[row * d.Hkv + h], d.D, format);
            cpu::kv_decode(vd, vb, scales->v.data<const float>()[row * d.Hkv + h], d.D, format);
            continue;
          }
          const float* ks =
              k_pool.data<const float>() + row * k_pool.stride(0) + h * k_pool.stride(1);
          const float* vs =
              v_pool.data<const float>() + row * v_pool.stride(0) + h * v_pool.stride(1);
          std::copy(ks, ks + d.D, kd);
          std::copy(vs, vs + d.D, vd);
        }
      }
      a.k = kbuf.data();
      a.v = vbuf.data();
      a.k_t = a.v_t = row_elems;
      a.k_h = a.v_h = d.D;
    }
    a.out = out.data<float>() + q0 * out.stride(0);
    a.out_t = out.stride(0);
    a.out_h = out.stride(1);
    a.q = q.data<const float>() + q0 * q.stride(0);
    a.q_t = q.stride(0);
    a.q_h = q.stride(1);
    a.T = q1 - q0;
    a.Hq = d.Hq;
    a.Hkv = d.Hkv;
    a.D = d.D;
    a.pos0 = n_keys - (q1 - q0);
    a.scale = resolved_scale(p, d.D);
    a.window = p.window;
    a.softcap = p.softcap;
    if (d.Hq > 0 && d.D > 0) cpu::attention(a);
  }
  count_attention(AttentionPath::kCpu);
}

#ifdef LLMK_HAS_CUDA
void attention_paged_cuda(Tensor& out, const Tensor& q, const Tensor& k_pool, const Tensor& v_pool,
                          const Tensor& page_table, int64_t page_size, const Tensor& cu_q,
                          const Tensor& positions, int64_t max_q, const AttentionParams& p,
                          const PagedDims& d) {
  const KvScales* scales = p.kv_scales;
  const DType dt = require_activations(kPagedOp, true, {{"out", &out}, {"q", &q}});
  if (scales == nullptr) {
    require_activations(kPagedOp, true, {{"q", &q}, {"k_pool", &k_pool}, {"v_pool", &v_pool}});
  }
  for (const auto& [name, t] : {NamedTensor{"out", &out}, NamedTensor{"q", &q},
                                NamedTensor{"k_pool", &k_pool}, NamedTensor{"v_pool", &v_pool}}) {
    if (scales != nullptr && (t == &k_pool || t == &v_pool)) continue;  // 8-bit pools
    require_16_byte_rows(kPagedOp, name, *t);
  }
  for (const auto& [name, t] : {NamedTensor{"page_table", &page_table},
                                NamedTensor{"positions", &positions}, NamedTensor{"cu_q", &cu_q}}) {
    if (!t->defined()) continue;
    LLMK_CHECK(t->is_contiguous(), "ops::attention_paged: {} ({}) must be contiguous on the GPU",
               name, t->str());
  }
  const bool fast = cuda::attention_head_dim_supported(static_cast<int>(d.D));
  LLMK_CHECK(fast || (d.D % 2 == 0 && d.D <= cuda::kGenericMaxD),
             "ops::attention_paged: head dim {} (q is {}) is not supported by the CUDA kernels "
             "({}; the fallback kernel: even, at most {})",
             d.D, q.str(), cuda::attention_head_dims(), cuda::kGenericMaxD);
  constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();
  LLMK_CHECK(
      d.T <= kMaxInt && d.B <= 65535 && d.P * page_size <= kMaxInt && k_pool.dim(0) <= kMaxInt,
      "ops::attention_paged: q is {}, k_pool is {}, page_table is {}: too large for the CUDA "
      "kernels",
      q.str(), k_pool.str(), page_table.str());
  if (d.T == 0 || d.Hq == 0) return;
  cuda::AttentionArgs a = cuda_attention_args(out, q, k_pool, v_pool, p);
  a.page_table = page_table.data<const int32_t>();
  a.page_size = static_cast<int>(page_size);
  a.pages_per_seq = static_cast<int>(d.P);
  if (scales != nullptr) {  // 8-bit pools: the fallback kernel decodes their rows
    a.kv_format = static_cast<int>(detail::cuda_kv_format(k_pool));
    a.k_scale = scales->k.data<const float>();
    a.v_scale = scales->v.data<const float>();
  }
  // The decode kernel takes bf16 and fp16 queries (over 8-bit caches at the head dims it is built
  // for); the rest go to the fallback kernel.
  if (!fast || dt == DType::F32 ||
      (scales != nullptr && !cuda::attention_decode_8bit_supported(static_cast<int>(d.D)))) {
    // One launch for the batch: the fallback kernel finds each row's sequence in cu_q and its
    // keys through the page table, up to the sequence's last position.
    a.positions = positions.data<const int32_t>();
    if (cu_q.defined()) {
      a.B = static_cast<int>(d.B);
      a.cu_q = cu_q.data<const int32_t>();
    }
    cuda::attention_generic(a);
    count_attention(AttentionPath::kFallback);
    return;
  }
  if (max_q <= cuda::kDecodeMaxQueries) {
    a.B = static_cast<int>(d.B);
    a.positions = positions.data<const int32_t>();
    if (cu_q.defined()) {  // else one sequence: its rows are all of q
      a.cu_q = cu_q.data<const int32_t>();
      a.max_q_per_seq = static_cast<int>(max_q);
    }
    cuda::attention_decode(a);
    count_attention(AttentionPath::kDecode);
    return;
  }
  // Neither kernel takes more than 8 queries of a paged sequence: chunks of 8 through the decode
  // kernel, one sequence (its rows are all of q), positions read on the device.
  LLMK_CHECK(d.B == 1,
             "ops::attention_paged: {} sequences with up to {} queries each: on CUDA only one "
             "sequence may have more than {} queries",
             d.B, max_q, cuda::kDecodeMaxQueries);
  for (int64_t t0 = 0; t0 < d.T; t0 += cuda::kDecodeMaxQueries) {
    const int64_t n = std::min<int64_t>(cuda::kDecodeMaxQueries, d.T - t0);
    cuda::AttentionArgs c = a;
    c.out = a.out + t0 * a.out_t;
    c.q = a.q + t0 * a.q_t;
    c.T = static_cast<int>(n);
    c.B = 1;
    c.positions = positions.data<const int32_t>() + t0;
    cuda::attention_decode(c);
  }
  count_attention(AttentionPath::kChunked);
}
#endif

}  // namespace

void attention_paged(Tensor& out, const Tensor& q, const Tensor& k_pool, const Tensor& v_pool,
                     const Tensor& page_table, int64_t page_size, const Tensor& cu_q,
                     const Tensor& positions, int64_t max_q_per_seq, const AttentionParams& p) {
  const Tensor& cu_or_q = cu_q.defined() ? cu_q : positions;  // undefined cu_q: one sequence
  const bool cuda = on_cuda(kPagedOp, {{"out", &out},
                                       {"q", &q},
                                       {"k_pool", &k_pool},
                                       {"v_pool", &v_pool},
                                       {"page_table", &page_table},
                                       {"cu_q", &cu_or_q},
                                       {"positions", &positions}});
  const PagedDims d = check_paged_shapes(out, q, k_pool, v_pool, page_table, page_size, cu_q,
                                         positions, max_q_per_seq, p);
  detail::check_kv_scales(kPagedOp, k_pool, v_pool, p.kv_scales);
  if (cuda) {
#ifdef LLMK_HAS_CUDA
    attention_paged_cuda(out, q, k_pool, v_pool, page_table, page_size, cu_q, positions,
                         max_q_per_seq, p, d);
#endif
    return;
  }
  attention_paged_cpu(out, q, k_pool, v_pool, page_table, page_size, cu_q, positions, max_q_per_seq,
                      p, d);
}

}  // namespace llmk::ops
