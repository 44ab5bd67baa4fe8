#include "ops/train.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

#include "kernels/cpu/attention_grad.h"
#include "kernels/cpu/attention_transfer.h"
#include "kernels/cpu/distill.h"
#include "kernels/cpu/diversity.h"
#include "kernels/cpu/grad.h"
#include "ops/check.h"

#ifdef LLMK_HAS_CUDA
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda/attention/attention.h"
#include "kernels/cuda/attention/backward.h"
#include "kernels/cuda/attention_transfer.h"
#include "kernels/cuda/distill.h"
#include "kernels/cuda/diversity.h"
#include "kernels/cuda/gemm/gemm_act.h"
#include "kernels/cuda/gemm/linear.h"
#include "kernels/cuda/grad.h"
#endif

namespace llmk::ops {

using namespace detail;

namespace {

// ---- stats ----

using StatKey = std::tuple<std::string, std::string, std::string>;  // op, kernel, reason
struct Stats {
  std::mutex mu;
  std::map<StatKey, uint64_t> calls;
};
Stats& stats() {
  static Stats s;
  return s;
}
void count(std::string_view op, std::string_view kernel, std::string_view reason = {}) {
  Stats& s = stats();
  std::lock_guard<std::mutex> lock(s.mu);
  ++s.calls[{std::string(op), std::string(kernel), std::string(reason)}];
}

// ---- checks ----

// Where an op runs and on what: every tensor defined, on one device, contiguous unless the op
// takes strides, and of the first one's dtype: f32 or f64 on the CPU, bf16, f16 or f32 on CUDA
// (where cuda_built says the op has CUDA kernels).
struct Where {
  DType dt;
  bool cuda;
};
Where check_float(std::string_view op, std::initializer_list<NamedTensor> tensors,
                  bool contiguous = true, bool cuda_built = false) {
  const bool cuda = on_cuda(op, tensors);
  LLMK_CHECK(!cuda || cuda_built,
             "ops::{}: CUDA tensors: this op's CUDA kernels are not built yet; use CPU tensors",
             op);
  const DType dt = tensors.begin()->second->dtype();
  if (cuda) {
    LLMK_CHECK(is_float_type(dt), "ops::{}: {} is {}; CUDA takes bf16, f16 or f32", op,
               tensors.begin()->first, tensors.begin()->second->str());
  } else {
    LLMK_CHECK(dt == DType::F32 || dt == DType::F64, "ops::{}: {} is {}; the CPU takes f32 or f64",
               op, tensors.begin()->first, tensors.begin()->second->str());
  }
  for (const auto& [name, t] : tensors) {
    require_dtype(op, name, *t, dt);
    if (contiguous) {
      LLMK_CHECK(t->is_contiguous(), "ops::{}: {} ({}) must be contiguous", op, name, t->str());
    }
  }
  return {dt, cuda};
}

// check_float for the ops that run on the CPU only (yet); returns the dtype.
DType check_float_cpu(std::string_view op, std::initializer_list<NamedTensor> tensors,
                      bool contiguous = true) {
  return check_float(op, tensors, contiguous).dt;
}

#ifdef LLMK_HAS_CUDA
// Calls f.template operator()<T>() with T the CUDA storage type of dt (bf16, f16 or f32).
template <class F>
void with_cuda_float(DType dt, F&& f) {
  if (dt == DType::BF16) {
    f.template operator()<__nv_bfloat16>();
  } else if (dt == DType::F16) {
    f.template operator()<__half>();
  } else {
    f.template operator()<float>();
  }
}
#endif

// Calls f.template operator()<T>() with T the C++ type of dt (f32 or f64).
template <class F>
void with_float(DType dt, F&& f) {
  if (dt == DType::F64) {
    f.template operator()<double>();
  } else {
    f.template operator()<float>();
  }
}

cpu::grad::Act cpu_act(Act a) {
  switch (a) {
    case Act::SiLU:
      return cpu::grad::Act::SiLU;
    case Act::GeluTanh:
      return cpu::grad::Act::GeluTanh;
    case Act::GeluErf:
      return cpu::grad::Act::GeluErf;
    case Act::None:
      break;
  }
  return cpu::grad::Act::None;
}

// The flash-attention arguments shared by forward and backward, and what they resolve to.
struct FlashCheck {
  double scale;          // resolved: 1/sqrt(D) where 0 was given
  int64_t max_seqlen_k;  // the most keys of a sequence (read on the host where cu_k is)
};
FlashCheck check_flash(std::string_view op, const Tensor& q, const Tensor& k, const Tensor& v,
                       const Tensor& cu_q, const Tensor& cu_k, const FlashParams& p, bool cuda) {
  for (const auto& [name, t] : {NamedTensor{"q", &q}, {"k", &k}, {"v", &v}}) {
    require_ndim(op, name, *t, 3);
  }
  const int64_t Hq = q.dim(1), Hkv = k.dim(1), D = q.dim(2);
  LLMK_CHECK(k.dim(2) == D, "ops::{}: q is {} but k is {}: head dims differ", op, q.str(), k.str());
  require_shape(op, "v", v, k.shape());
  LLMK_CHECK(Hq > 0 && Hkv > 0 && Hq % Hkv == 0,
             "ops::{}: q has {} heads, not a multiple of the {} heads of k", op, Hq, Hkv);
  for (const auto& [name, t] : {NamedTensor{"cu_seqlens_q", &cu_q}, {"cu_seqlens_k", &cu_k}}) {
    LLMK_CHECK(t->defined() && t->device() == q.device(), "ops::{}: {} must be on q's device", op,
               name);
    require_dtype(op, name, *t, DType::I32);
    require_ndim(op, name, *t, 1);
    LLMK_CHECK(t->is_contiguous() && t->dim(0) >= 2,
               "ops::{}: {} is {}; it needs batch + 1 >= 2 entries, contiguous", op, name,
               t->str());
  }
  LLMK_CHECK(cu_q.dim(0) == cu_k.dim(0),
             "ops::{}: cu_seqlens_q has {} entries but cu_seqlens_k {}: one per sequence + 1 each",
             op, cu_q.dim(0), cu_k.dim(0));
  LLMK_CHECK(std::isfinite(p.scale) && p.scale >= 0, "ops::{}: scale = {} must be finite, >= 0", op,
             p.scale);
  LLMK_CHECK(std::isfinite(p.softcap) && p.softcap >= 0,
             "ops::{}: softcap = {} must be finite, >= 0", op, p.softcap);
  LLMK_CHECK(p.window_left >= -1 && p.window_right >= -1,
             "ops::{}: window ({}, {}) needs sizes >= 0, or -1 for unbounded", op, p.window_left,
             p.window_right);
  FlashCheck fc{p.scale > 0 ? p.scale : 1.0 / std::sqrt(static_cast<double>(D)), p.max_seqlen_k};
  if (cuda) {
    // The offsets stay on the device (reading them would wait for the stream): the caller vouches
    // for them, and for max_seqlen_k.
    LLMK_CHECK(p.max_seqlen_k >= 0 && p.max_seqlen_k <= k.dim(0),
               "ops::{}: CUDA needs max_seqlen_k (0 .. {} keys), got {}", op, k.dim(0),
               p.max_seqlen_k);
    LLMK_CHECK(D % 8 == 0 && D <= 256,
               "ops::{}: head dim {} on CUDA must be a multiple of 8, at most 256", op, D);
    return fc;
  }
  // On the CPU the offsets are read: each list starts at 0, never decreases and ends at its
  // tensor's row count.
  int64_t max_k = 0;
  for (const auto& [name, cu, rows] :
       {std::tuple{"cu_seqlens_q", &cu_q, q.dim(0)}, std::tuple{"cu_seqlens_k", &cu_k, k.dim(0)}}) {
    const int32_t* c = cu->data<const int32_t>();
    LLMK_CHECK(c[0] == 0, "ops::{}: {}[0] is {}, not 0", op, name, c[0]);
    for (int64_t b = 1; b < cu->dim(0); ++b) {
      LLMK_CHECK(c[b] >= c[b - 1], "ops::{}: {} decreases at {}: {} then {}", op, name, b, c[b - 1],
                 c[b]);
      if (cu == &cu_k) max_k = std::max<int64_t>(max_k, c[b] - c[b - 1]);
    }
    LLMK_CHECK(c[cu->dim(0) - 1] == rows, "ops::{}: {} ends at {}, but its tensor has {} rows", op,
               name, c[cu->dim(0) - 1], rows);
  }
  fc.max_seqlen_k = max_k;
  return fc;
}

// The CPU kernels' shape (its cu pointers into cu_q and cu_k).
cpu::grad::FlashShape cpu_flash_shape(const Tensor& q, const Tensor& k, const Tensor& cu_q,
                                      const Tensor& cu_k, const FlashParams& p,
                                      const FlashCheck& fc) {
  cpu::grad::FlashShape s;
  s.batch = cu_q.dim(0) - 1;
  s.cu_q = cu_q.data<const int32_t>();
  s.cu_k = cu_k.data<const int32_t>();
  s.Hq = q.dim(1);
  s.Hkv = k.dim(1);
  s.D = q.dim(2);
  s.scale = fc.scale;
  s.causal = p.causal;
  s.window_left = p.window_left;
  s.window_right = p.causal ? 0 : p.window_right;
  s.softcap = p.softcap;
  return s;
}

}  // namespace

std::string_view act_name(Act a) {
  switch (a) {
    case Act::None:
      return "none";
    case Act::SiLU:
      return "silu";
    case Act::GeluTanh:
      return "gelu_tanh";
    case Act::GeluErf:
      return "gelu";
  }
  return "?";
}

// ---- RMSNorm ----

void rms_norm_forward(Tensor& y, Tensor& rstd, const Tensor& x, const Tensor& w, double eps,
                      const Tensor* residual, Tensor* sum) {
  constexpr std::string_view op = "rms_norm_forward";
  LLMK_CHECK((residual == nullptr) == (sum == nullptr),
             "ops::{}: residual and sum come together (the sum is x + residual)", op);
  const Where at =
      residual
          ? check_float(op, {{"x", &x}, {"y", &y}, {"w", &w}, {"residual", residual}, {"sum", sum}},
                        true, true)
          : check_float(op, {{"x", &x}, {"y", &y}, {"w", &w}}, true, true);
  const DType dt = at.dt;
  require_dtype(op, "rstd", rstd, at.cuda ? DType::F32 : dt);
  require_ndim(op, "x", x, 2);
  const int64_t rows = x.dim(0), D = x.dim(1);
  require_shape(op, "y", y, x.shape());
  require_shape(op, "w", w, {D});
  require_shape(op, "rstd", rstd, {rows});
  LLMK_CHECK(rstd.device() == x.device() && rstd.is_contiguous(),
             "ops::{}: rstd must be contiguous, on x's device", op);
  LLMK_CHECK(eps >= 0 && std::isfinite(eps), "ops::{}: eps = {} must be finite, >= 0", op, eps);
  require_disjoint(op, "y", y, "x", x);
  if (residual) {
    require_shape(op, "residual", *residual, x.shape());
    require_shape(op, "sum", *sum, x.shape());
    require_disjoint(op, "sum", *sum, "x", x);
    require_disjoint(op, "sum", *sum, "residual", *residual);
    require_disjoint(op, "y", y, "sum", *sum);
  }
  if (at.cuda) {
#ifdef LLMK_HAS_CUDA
    with_cuda_float(dt, [&]<class T>() {
      cuda::grad::rms_norm_fwd(y.data<T>(), rstd.data<float>(), x.data<const T>(),
                               residual ? residual->data<const T>() : nullptr,
                               sum ? sum->data<T>() : nullptr, w.data<const T>(), rows, D,
                               static_cast<float>(eps));
    });
    count(op, "cuda");
#endif
    return;
  }
  with_float(dt, [&]<class T>() {
    const T* in = x.data<const T>();
    if (residual) {
      cpu::grad::add(sum->data<T>(), x.data<const T>(), residual->data<const T>(), rows * D);
      in = sum->data<const T>();
    }
    cpu::grad::rms_norm_fwd(y.data<T>(), rstd.data<T>(), in, w.data<const T>(), rows, D, eps);
  });
  count(op, "cpu");
}

size_t rms_norm_backward_workspace(const Tensor& x) {
  require_ndim("rms_norm_backward_workspace", "x", x, 2);
#ifdef LLMK_HAS_CUDA
  if (x.device() == Device::CUDA) return cuda::grad::rms_norm_bwd_workspace(x.dim(0), x.dim(1));
#endif
  return 0;
}

void rms_norm_backward(Tensor& dx, Tensor* dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                       const Tensor& rstd, Tensor* workspace, const Tensor* dres) {
  constexpr std::string_view op = "rms_norm_backward";
  const Where at =
      dw ? check_float(op, {{"x", &x}, {"dx", &dx}, {"dw", dw}, {"dy", &dy}, {"w", &w}}, true, true)
         : check_float(op, {{"x", &x}, {"dx", &dx}, {"dy", &dy}, {"w", &w}}, true, true);
  const DType dt = at.dt;
  require_dtype(op, "rstd", rstd, at.cuda ? DType::F32 : dt);
  LLMK_CHECK(rstd.device() == x.device() && rstd.is_contiguous(),
             "ops::{}: rstd must be contiguous, on x's device", op);
  require_ndim(op, "x", x, 2);
  const int64_t rows = x.dim(0), D = x.dim(1);
  for (const auto& [name, t] : {NamedTensor{"dx", &dx}, {"dy", &dy}}) {
    require_shape(op, name, *t, x.shape());
  }
  require_shape(op, "w", w, {D});
  require_shape(op, "rstd", rstd, {rows});
  for (const auto& [name, t] : {NamedTensor{"dy", &dy}, {"x", &x}, {"w", &w}, {"rstd", &rstd}}) {
    require_disjoint(op, "dx", dx, name, *t);
  }
  if (dres) {
    require_dtype(op, "dres", *dres, dt);
    LLMK_CHECK(dres->device() == x.device() && dres->is_contiguous(),
               "ops::{}: dres ({}) must be contiguous, on x's device", op, dres->str());
    require_shape(op, "dres", *dres, x.shape());
    require_no_partial_overlap(op, "dx", dx, "dres", *dres);
  }
  if (dw) require_shape(op, "dw", *dw, {D});
  if (at.cuda) {
#ifdef LLMK_HAS_CUDA
    const size_t need = dw ? cuda::grad::rms_norm_bwd_workspace(rows, D) : 0;
    LLMK_CHECK(need == 0 ||
                   (workspace != nullptr && workspace->device() == Device::CUDA &&
                    workspace->is_contiguous() && static_cast<size_t>(workspace->nbytes()) >= need),
               "ops::{}: dw on CUDA needs a contiguous CUDA workspace of {} bytes", op, need);
    with_cuda_float(dt, [&]<class T>() {
      cuda::grad::rms_norm_bwd(dx.data<T>(), dw ? dw->data<T>() : nullptr,
                               need ? workspace->data() : nullptr, dy.data<const T>(),
                               x.data<const T>(), w.data<const T>(), rstd.data<const float>(), rows,
                               D, dres ? dres->data<const T>() : nullptr);
    });
    count(op, "cuda");
#endif
    return;
  }
  (void)workspace;
  with_float(dt, [&]<class T>() {
    cpu::grad::rms_norm_bwd(dx.data<T>(), dw ? dw->data<T>() : nullptr, dy.data<const T>(),
                            x.data<const T>(), w.data<const T>(), rstd.data<const T>(), rows, D,
                            dres ? dres->data<const T>() : nullptr);
  });
  count(op, "cpu");
}

// ---- gated activations ----

void gated_forward(Tensor& out, const Tensor& gate, const Tensor& up, Act act) {
  constexpr std::string_view op = "gated_forward";
  const Where at = check_float(op, {{"gate", &gate}, {"up", &up}, {"out", &out}}, true, true);
  const DType dt = at.dt;
  require_shape(op, "up", up, gate.shape());
  require_shape(op, "out", out, gate.shape());
  LLMK_CHECK(act != Act::None, "ops::{}: the gate needs an activation (none given)", op);
  const cpu::grad::Act g = cpu_act(act);
  if (at.cuda) {
#ifdef LLMK_HAS_CUDA
    with_cuda_float(dt, [&]<class T>() {
      cuda::grad::gated_fwd(out.data<T>(), gate.data<const T>(), up.data<const T>(), gate.numel(),
                            g);
    });
    count(op, "cuda");
#endif
    return;
  }
  with_float(dt, [&]<class T>() {
    cpu::grad::gated_fwd(out.data<T>(), gate.data<const T>(), up.data<const T>(), gate.numel(), g);
  });
  count(op, "cpu");
}

void gated_backward(Tensor& dgate, Tensor& dup, const Tensor& dout, const Tensor& gate,
                    const Tensor& up, Act act) {
  constexpr std::string_view op = "gated_backward";
  const Where at = check_float(
      op, {{"gate", &gate}, {"up", &up}, {"dout", &dout}, {"dgate", &dgate}, {"dup", &dup}}, true,
      true);
  const DType dt = at.dt;
  for (const auto& [name, t] :
       {NamedTensor{"up", &up}, {"dout", &dout}, {"dgate", &dgate}, {"dup", &dup}}) {
    require_shape(op, name, *t, gate.shape());
  }
  require_disjoint(op, "dgate", dgate, "dup", dup);
  LLMK_CHECK(act != Act::None, "ops::{}: the gate needs an activation (none given)", op);
  const cpu::grad::Act g = cpu_act(act);
  if (at.cuda) {
#ifdef LLMK_HAS_CUDA
    with_cuda_float(dt, [&]<class T>() {
      cuda::grad::gated_bwd(dgate.data<T>(), dup.data<T>(), dout.data<const T>(),
                            gate.data<const T>(), up.data<const T>(), gate.numel(), g);
    });
    count(op, "cuda");
#endif
    return;
  }
  with_float(dt, [&]<class T>() {
    cpu::grad::gated_bwd(dgate.data<T>(), dup.data<T>(), dout.data<const T>(), gate.data<const T>(),
                         up.data<const T>(), gate.numel(), g);
  });
  count(op, "cpu");
}

// ---- RoPE ----

void rope_table(Tensor& cos, Tensor& sin, const Tensor& positions, double theta, double freq_scale,
                const Tensor* factors) {
  constexpr std::string_view op = "rope_table";
  const DType dt = check_float_cpu(op, {{"cos", &cos}, {"sin", &sin}});
  require_cpu(op, "positions", positions);
  require_dtype(op, "positions", positions, DType::I64);
  require_ndim(op, "positions", positions, 1);
  LLMK_CHECK(positions.is_contiguous(), "ops::{}: positions must be contiguous", op);
  require_ndim(op, "cos", cos, 2);
  const int64_t rows = positions.dim(0), R = cos.dim(1);
  require_shape(op, "cos", cos, {rows, R});
  require_shape(op, "sin", sin, {rows, R});
  LLMK_CHECK(R > 0, "ops::{}: cos has no rotated pairs ({})", op, cos.str());
  LLMK_CHECK(std::isfinite(theta) && theta > 0, "ops::{}: theta = {} must be finite, > 0", op,
             theta);
  LLMK_CHECK(std::isfinite(freq_scale) && freq_scale > 0,
             "ops::{}: freq_scale = {} must be finite, > 0", op, freq_scale);
  if (factors) {
    require_cpu(op, "factors", *factors);
    require_dtype(op, "factors", *factors, DType::F64);
    require_shape(op, "factors", *factors, {R});
  }
  with_float(dt, [&]<class T>() {
    cpu::grad::rope_table(cos.data<T>(), sin.data<T>(), positions.data<const int64_t>(), rows,
                          static_cast<int>(2 * R), theta, freq_scale,
                          factors ? factors->data<const double>() : nullptr);
  });
  count(op, "cpu");
}

void rope_rotate(Tensor& y, const Tensor& x, const Tensor& cos, const Tensor& sin, bool half_split,
                 bool inverse) {
  constexpr std::string_view op = "rope_rotate";
  const Where at = check_float(op, {{"x", &x}, {"y", &y}}, false, true);
  const DType dt = at.dt;
  // The tables: x's dtype, or f32 on CUDA (the kernels read either).
  LLMK_CHECK(cos.device() == x.device() && sin.device() == x.device(),
             "ops::{}: cos and sin must be on x's device", op);
  LLMK_CHECK(
      cos.dtype() == sin.dtype() && (cos.dtype() == dt || (at.cuda && cos.dtype() == DType::F32)),
      "ops::{}: cos is {} and sin {}, x {}: the tables take x's dtype{}", op, cos.str(), sin.str(),
      x.str(), at.cuda ? " or f32" : "");
  require_ndim(op, "x", x, 4);
  require_shape(op, "y", y, x.shape());
  require_no_partial_overlap(op, "y", y, "x", x);
  require_ndim(op, "cos", cos, 3);
  const int64_t B = x.dim(0), S = x.dim(1), D = x.dim(3), R = cos.dim(2);
  LLMK_CHECK(cos.dim(0) == 1 || cos.dim(0) == B,
             "ops::{}: cos is {}; its first dim must be 1 or the batch {} of x ({})", op, cos.str(),
             B, x.str());
  LLMK_CHECK(cos.dim(1) == S, "ops::{}: cos is {} for {} positions, but x ({}) has {}", op,
             cos.str(), cos.dim(1), x.str(), S);
  require_shape(op, "sin", sin, cos.shape());
  LLMK_CHECK(R >= 1 && 2 * R <= D, "ops::{}: cos has {} pairs; x's head dim {} holds at most {}",
             op, R, D, D / 2);
  for (const auto& [name, t] : {NamedTensor{"cos", &cos}, {"sin", &sin}}) {
    require_last_dim_contiguous(op, name, *t);
  }
  LLMK_CHECK(cos.strides() == sin.strides(), "ops::{}: cos and sin must have the same strides", op);
  cpu::grad::RopeShape s{};
  s.B = B;
  s.S = S;
  s.H = x.dim(2);
  s.D = D;
  for (int i = 0; i < 4; ++i) {
    s.x_st[i] = x.stride(i);
    s.y_st[i] = y.stride(i);
  }
  s.cs_b = cos.dim(0) == 1 ? 0 : cos.stride(0);
  s.cs_s = cos.stride(1);
  s.rot_dim = static_cast<int>(2 * R);
  s.half_split = half_split;
  if (at.cuda) {
#ifdef LLMK_HAS_CUDA
    with_cuda_float(dt, [&]<class T>() {
      if (cos.dtype() == DType::F32) {
        cuda::grad::rope_rotate(y.data<T>(), x.data<const T>(), cos.data<const float>(),
                                sin.data<const float>(), s, inverse);
      } else {
        cuda::grad::rope_rotate(y.data<T>(), x.data<const T>(), cos.data<const T>(),
                                sin.data<const T>(), s, inverse);
      }
    });
    count(op, "cuda");
#endif
    return;
  }
  with_float(dt, [&]<class T>() {
    cpu::grad::rope_rotate(y.data<T>(), x.data<const T>(), cos.data<const T>(), sin.data<const T>(),
                           s, inverse);
  });
  count(op, "cpu");
}

// ---- flash attention ----

void flash_attention_forward(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k,
                             const Tensor& v, const Tensor& cu_q, const Tensor& cu_k,
                             const FlashParams& p) {
  constexpr std::string_view op = "flash_attention_forward";
  const Where at = check_float(op, {{"q", &q}, {"k", &k}, {"v", &v}, {"out", &out}}, true, true);
  LLMK_CHECK(!at.cuda || at.dt != DType::F32, "ops::{}: CUDA attention takes bf16 or f16, not f32",
             op);
  const DType lse_dt = at.cuda ? DType::F32 : at.dt;
  require_dtype(op, "lse", lse, lse_dt);
  LLMK_CHECK(lse.device() == q.device() && lse.is_contiguous(),
             "ops::{}: lse must be contiguous, on q's device", op);
  const FlashCheck fc = check_flash(op, q, k, v, cu_q, cu_k, p, at.cuda);
  require_shape(op, "out", out, q.shape());
  require_shape(op, "lse", lse, {q.dim(1), q.dim(0)});
  for (const auto& [name, t] : {NamedTensor{"q", &q}, {"k", &k}, {"v", &v}}) {
    require_disjoint(op, "out", out, name, *t);
    require_disjoint(op, "lse", lse, name, *t);
  }
  if (at.cuda) {
#ifdef LLMK_HAS_CUDA
    if (q.dim(0) == 0) return;
    LLMK_CHECK(p.causal || (p.window_left < 0 && p.window_right < 0),
               "ops::{}: a window without the causal mask has no CUDA kernel yet", op);
    const int64_t H = q.dim(1), Hkv = k.dim(1), D = q.dim(2);
    cuda::AttentionArgs a;
    a.out = out.data<__nv_bfloat16>();
    a.out_t = H * D;
    a.out_h = D;
    a.q = q.data<const __nv_bfloat16>();
    a.q_t = H * D;
    a.q_h = D;
    a.k = k.data<const __nv_bfloat16>();
    a.k_t = Hkv * D;
    a.k_h = D;
    a.v = v.data<const __nv_bfloat16>();
    a.v_t = Hkv * D;
    a.v_h = D;
    a.fp16 = at.dt == DType::F16;
    a.lse = lse.data<float>();
    a.T = static_cast<int>(q.dim(0));
    a.Hq = static_cast<int>(H);
    a.Hkv = static_cast<int>(Hkv);
    a.D = static_cast<int>(D);
    a.L = k.dim(0);
    a.B = static_cast<int>(cu_q.dim(0) - 1);
    a.cu_q = cu_q.data<const int32_t>();
    a.cu_k = cu_k.data<const int32_t>();
    a.scale = static_cast<float>(fc.scale);
    a.softcap = static_cast<float>(p.softcap);
    a.causal = p.causal;
    a.window = p.causal && p.window_left >= 0 ? static_cast<int>(p.window_left + 1) : 0;
    if (cuda::attention_head_dim_supported(a.D)) {
      cuda::attention_prefill(a);
      count(op, "cuda prefill");
    } else {
      cuda::attention_generic(a);
      count(op, "cuda generic", fmt::format("head dim {} has no tensor-core kernel", D));
    }
#endif
    return;
  }
  const cpu::grad::FlashShape s = cpu_flash_shape(q, k, cu_q, cu_k, p, fc);
  with_float(at.dt, [&]<class T>() {
    cpu::grad::flash_fwd(out.data<T>(), lse.data<T>(), q.data<const T>(), k.data<const T>(),
                         v.data<const T>(), s);
  });
  count(op, "cpu");
}

size_t flash_attention_backward_workspace(const Tensor& q, int64_t sequences) {
  require_ndim("flash_attention_backward_workspace", "q", q, 3);
  LLMK_CHECK(sequences >= 1, "ops::flash_attention_backward_workspace: sequences is {}, not >= 1",
             sequences);
#ifdef LLMK_HAS_CUDA
  if (q.device() == Device::CUDA) {
    return cuda::attention_backward_workspace(q.dim(0), q.dim(1), q.dim(2), sequences);
  }
#endif
  return 0;
}

void flash_attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout,
                              const Tensor* dlse, const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& out, const Tensor& lse, const Tensor& cu_q,
                              const Tensor& cu_k, const FlashParams& p, Tensor* workspace) {
  constexpr std::string_view op = "flash_attention_backward";
  const Where at = check_float(op,
                               {{"q", &q},
                                {"k", &k},
                                {"v", &v},
                                {"out", &out},
                                {"dout", &dout},
                                {"dq", &dq},
                                {"dk", &dk},
                                {"dv", &dv}},
                               true, true);
  const DType lse_dt = at.cuda ? DType::F32 : at.dt;
  const FlashCheck fc = check_flash(op, q, k, v, cu_q, cu_k, p, at.cuda);
  require_shape(op, "out", out, q.shape());
  require_shape(op, "dout", dout, q.shape());
  require_shape(op, "dq", dq, q.shape());
  require_shape(op, "dk", dk, k.shape());
  require_shape(op, "dv", dv, k.shape());
  for (const auto& [name, t] : {NamedTensor{"lse", &lse}, {"dlse", dlse}}) {
    if (t == nullptr) continue;
    require_dtype(op, name, *t, lse_dt);
    require_shape(op, name, *t, {q.dim(1), q.dim(0)});
    LLMK_CHECK(t->device() == q.device() && t->is_contiguous(),
               "ops::{}: {} must be contiguous, on q's device", op, name);
  }
  const NamedTensor inputs[] = {{"q", &q},     {"k", &k},     {"v", &v},
                                {"out", &out}, {"lse", &lse}, {"dout", &dout}};
  for (const auto& [gname, g] : {NamedTensor{"dq", &dq}, {"dk", &dk}, {"dv", &dv}}) {
    for (const auto& [name, t] : inputs) require_disjoint(op, gname, *g, name, *t);
    if (dlse) require_disjoint(op, gname, *g, "dlse", *dlse);
  }
  require_disjoint(op, "dq", dq, "dk", dk);
  require_disjoint(op, "dq", dq, "dv", dv);
  require_disjoint(op, "dk", dk, "dv", dv);
  if (at.cuda) {
#ifdef LLMK_HAS_CUDA
    const int64_t H = q.dim(1), Hkv = k.dim(1), D = q.dim(2);
    LLMK_CHECK(cuda::attention_backward_supported(static_cast<int>(D)),
               "ops::{}: head dim {} has no CUDA backward yet (64 to 128, multiples of 16)", op, D);
    const size_t need = cuda::attention_backward_workspace(q.dim(0), H, D, cu_q.dim(0) - 1);
    LLMK_CHECK(workspace != nullptr && workspace->device() == Device::CUDA &&
                   workspace->is_contiguous() && static_cast<size_t>(workspace->nbytes()) >= need,
               "ops::{}: the CUDA backward needs a contiguous CUDA workspace of {} bytes", op,
               need);
    cuda::AttentionBwdArgs b;
    // Each [rows, heads, D] tensor's pointer and its row and head strides.
    const auto rows = [](const Tensor& t, auto& ptr, int64_t& ld_t, int64_t& ld_h) {
      ptr = t.data();
      ld_t = t.stride(0);
      ld_h = t.stride(1);
    };
    rows(q, b.q, b.q_t, b.q_h);
    rows(k, b.k, b.k_t, b.k_h);
    rows(v, b.v, b.v_t, b.v_h);
    rows(out, b.out, b.out_t, b.out_h);
    rows(dout, b.dout, b.dout_t, b.dout_h);
    rows(dq, b.dq, b.dq_t, b.dq_h);
    rows(dk, b.dk, b.dk_t, b.dk_h);
    rows(dv, b.dv, b.dv_t, b.dv_h);
    b.fp16 = at.dt == DType::F16;
    b.lse = lse.data<const float>();
    b.dlse = dlse ? dlse->data<const float>() : nullptr;
    b.workspace = workspace->data();
    b.T = static_cast<int>(q.dim(0));
    b.Tk = static_cast<int>(k.dim(0));
    b.Hq = static_cast<int>(H);
    b.Hkv = static_cast<int>(Hkv);
    b.D = static_cast<int>(D);
    b.B = static_cast<int>(cu_q.dim(0) - 1);
    b.cu_q = cu_q.data<const int32_t>();
    b.cu_k = cu_k.data<const int32_t>();
    b.max_tk = static_cast<int>(fc.max_seqlen_k);
    b.scale = static_cast<float>(fc.scale);
    b.softcap = static_cast<float>(p.softcap);
    b.causal = p.causal;
    b.deterministic = p.deterministic;
    b.window_left = static_cast<int>(p.window_left);
    b.window_right = static_cast<int>(p.window_right);
    cuda::attention_backward(b);
    count(op, "cuda");
#endif
    return;
  }
  (void)workspace;  // the CPU kernels need none
  const cpu::grad::FlashShape s = cpu_flash_shape(q, k, cu_q, cu_k, p, fc);
  with_float(at.dt, [&]<class T>() {
    cpu::grad::flash_bwd(dq.data<T>(), dk.data<T>(), dv.data<T>(), dout.data<const T>(),
                         dlse ? dlse->data<const T>() : nullptr, q.data<const T>(),
                         k.data<const T>(), v.data<const T>(), out.data<const T>(),
                         lse.data<const T>(), s);
  });
  count(op, "cpu");
}

// ---- linear + activation ----

namespace {

#ifdef LLMK_HAS_CUDA
// cuda::linear's arguments for out [M, N] = x [M, K] @ w^T with the operands' storage described
// by x_trans (x stored [K, M]) and w_trans (w stored [K, N]); all bf16 and contiguous.
cuda::LinearArgs cuda_matmul_args(void* out, const void* x, bool x_trans, const void* w,
                                  bool w_trans, const void* bias, int64_t M, int64_t N, int64_t K) {
  cuda::LinearArgs a;
  a.out = out;
  a.ldo = N;
  a.x = x;
  a.x_trans = x_trans;
  a.ldx = x_trans ? M : K;
  a.w = w;
  a.w_trans = w_trans;
  a.ldw = w_trans ? N : K;
  a.bias = bias;
  a.M = M;
  a.N = N;
  a.K = K;
  return a;
}

void cuda_matmul(void* out, const void* x, bool x_trans, const void* w, bool w_trans,
                 const void* bias, int64_t M, int64_t N, int64_t K) {
  cuda::linear(cuda_matmul_args(out, x, x_trans, w, w_trans, bias, M, N, K));
}
#endif

}  // namespace

void linear_act_forward(Tensor& y, Tensor* z, const Tensor& x, const Tensor& w, const Tensor* bias,
                        Act act) {
  constexpr std::string_view op = "linear_act_forward";
  const Where at = check_float(op, {{"x", &x}, {"w", &w}, {"y", &y}}, true, true);
  if (bias) check_float(op, {{"x", &x}, {"bias", bias}}, true, true);
  if (z) check_float(op, {{"x", &x}, {"z", z}}, true, true);
  const DType dt = at.dt;
  LLMK_CHECK(!at.cuda || dt == DType::BF16, "ops::{}: CUDA takes bf16 here (cuBLASLt), not {}", op,
             dtype_name(dt));
  require_ndim(op, "x", x, 2);
  require_ndim(op, "w", w, 2);
  const int64_t M = x.dim(0), K = x.dim(1), N = w.dim(0);
  LLMK_CHECK(w.dim(1) == K, "ops::{}: x is {} but w is {}: w must be [out, {}]", op, x.str(),
             w.str(), K);
  if (bias) require_shape(op, "bias", *bias, {N});
  require_shape(op, "y", y, {M, N});
  if (z) {
    require_shape(op, "z", *z, {M, N});
    require_disjoint(op, "y", y, "z", *z);
  }
  for (const auto& [name, t] : {NamedTensor{"x", &x}, {"w", &w}}) {
    require_disjoint(op, "y", y, name, *t);
    if (z) require_disjoint(op, "z", *z, name, *t);
  }
  // Without z the pre-activation is formed in y and the activation applied there in place.
  Tensor& pre = z ? *z : y;
  if (at.cuda) {
#ifdef LLMK_HAS_CUDA
    // llmk's GEMM with the bias and the activation in its epilogue (Hopper), z written beside,
    // where gemm_act_preferred says it beats cuBLASLt's GELU epilogue (below).
    const cuda::GemmActArgs g{.y = y.data(),
                              .z = z ? z->data() : nullptr,
                              .x = x.data(),
                              .w = w.data(),
                              .bias = bias ? bias->data() : nullptr,
                              .M = M,
                              .N = N,
                              .K = K,
                              .act = cpu_act(act)};
    if (act != Act::None && cuda::gemm_act_preferred(g) && cuda::gemm_act(g)) {
      count(op, "cuda");
      return;
    }
    if (act == Act::GeluTanh) {  // GELU (and the bias, and z) in cuBLASLt's epilogue
      cuda::LinearArgs a = cuda_matmul_args(y.data(), x.data(), false, w.data(), false,
                                            bias ? bias->data() : nullptr, M, N, K);
      a.gelu = true;
      a.aux = z ? z->data() : nullptr;
      a.ld_aux = N;
      if (cuda::linear_gelu(a)) {
        count(op, "cuda");
        return;
      }
    }
    // pre = x w^T + bias (bias in cuBLASLt's epilogue), then y = act(pre).
    cuda::linear(cuda_matmul_args(pre.data(), x.data(), false, w.data(), false,
                                  bias ? bias->data() : nullptr, M, N, K));
    if (act != Act::None || z) {
      cuda::grad::act_fwd(y.data<__nv_bfloat16>(), pre.data<const __nv_bfloat16>(), M * N,
                          cpu_act(act));
    }
    count(op, "cuda",
          act == Act::GeluTanh ? "cuBLASLt has no GELU epilogue for these operands; the "
                                 "activation runs after the GEMM"
          : act == Act::None   ? ""
                               : "the activation runs after the GEMM (cuBLASLt's epilogues have "
                                 "GELU's tanh form only)");
#endif
    return;
  }
  with_float(dt, [&]<class T>() {
    cpu::grad::gemm<T>(pre.data<T>(), N, x.data<const T>(), K, false, w.data<const T>(), K, true, M,
                       N, K, T(1), T(0));
    cpu::grad::bias_act_fwd(y.data<T>(), pre.data<T>(), bias ? bias->data<const T>() : nullptr, M,
                            N, cpu_act(act));
  });
  count(op, "cpu");
}

void linear_act_backward(Tensor* dx, Tensor* dw, Tensor* db, const Tensor& dy, const Tensor& x,
                         const Tensor& w, const Tensor& z, Act act, Tensor* dz_buffer) {
  constexpr std::string_view op = "linear_act_backward";
  const Where at = check_float(op, {{"x", &x}, {"w", &w}, {"dy", &dy}, {"z", &z}}, true, true);
  const DType dt = at.dt;
  LLMK_CHECK(!at.cuda || dt == DType::BF16, "ops::{}: CUDA takes bf16 here (cuBLASLt), not {}", op,
             dtype_name(dt));
  require_ndim(op, "x", x, 2);
  require_ndim(op, "w", w, 2);
  const int64_t M = x.dim(0), K = x.dim(1), N = w.dim(0);
  LLMK_CHECK(w.dim(1) == K, "ops::{}: x is {} but w is {}: w must be [out, {}]", op, x.str(),
             w.str(), K);
  require_shape(op, "dy", dy, {M, N});
  require_shape(op, "z", z, {M, N});
  const std::pair<Tensor*, Shape> grads[] = {{dx, {M, K}}, {dw, {N, K}}, {db, {N}}};
  const char* names[] = {"dx", "dw", "db"};
  for (int i = 0; i < 3; ++i) {
    Tensor* g = grads[i].first;
    if (!g) continue;
    LLMK_CHECK(g->device() == x.device() && g->is_contiguous(),
               "ops::{}: {} must be contiguous, on x's device", op, names[i]);
    require_dtype(op, names[i], *g, dt);
    require_shape(op, names[i], *g, grads[i].second);
    for (const auto& [name, t] : {NamedTensor{"x", &x}, {"w", &w}, {"dy", &dy}, {"z", &z}}) {
      require_disjoint(op, names[i], *g, name, *t);
    }
  }
  if (at.cuda) {
#ifdef LLMK_HAS_CUDA
    LLMK_CHECK(dz_buffer != nullptr && dz_buffer->device() == Device::CUDA &&
                   dz_buffer->dtype() == dt && dz_buffer->is_contiguous() &&
                   dz_buffer->numel() >= M * N,
               "ops::{}: CUDA needs a contiguous bf16 buffer of {} elements for dz", op, M * N);
    for (const auto& [name, t] : {NamedTensor{"x", &x}, {"w", &w}, {"dy", &dy}, {"z", &z}}) {
      require_disjoint(op, "dz buffer", *dz_buffer, name, *t);
    }
    auto* dz = dz_buffer->data<__nv_bfloat16>();
    cuda::grad::act_bwd(dz, dy.data<const __nv_bfloat16>(), z.data<const __nv_bfloat16>(), M * N,
                        cpu_act(act));
    // dx [M, K] = dz [M, N] @ w [N, K]: w read as stored, transposed for the linear's form.
    if (dx) cuda_matmul(dx->data(), dz, false, w.data(), true, nullptr, M, K, N);
    // dw [N, K] = dz^T @ x: both read transposed.
    if (dw) cuda_matmul(dw->data(), dz, true, x.data(), true, nullptr, N, K, M);
    if (db) cuda::grad::col_sum(db->data<__nv_bfloat16>(), dz, M, N);
    count(op, "cuda");
#endif
    return;
  }
  (void)dz_buffer;
  with_float(dt, [&]<class T>() {
    // dz in a buffer of its own: dy belongs to the caller.
    Tensor dz = Tensor::empty({M, N}, dt);
    cpu::grad::bias_act_bwd(dz.data<T>(), db ? db->data<T>() : nullptr, dy.data<const T>(),
                            z.data<const T>(), M, N, cpu_act(act));
    if (dx) {
      cpu::grad::gemm<T>(dx->data<T>(), K, dz.data<const T>(), N, false, w.data<const T>(), K,
                         false, M, K, N, T(1), T(0));
    }
    if (dw) {
      cpu::grad::gemm<T>(dw->data<T>(), K, dz.data<const T>(), N, true, x.data<const T>(), K, false,
                         N, K, M, T(1), T(0));
    }
  });
  count(op, "cpu");
}

// ---- pairwise cosine diversity ----

namespace {

// The checks both directions share; returns where the op runs and the CUDA scratch it needs.
Where check_diversity(std::string_view op, const Tensor& x, const Tensor& result,
                      std::string_view result_name, const Tensor* workspace) {
  const Where at = check_float(op, {{"x", &x}}, true, true);
  require_ndim(op, "x", x, 2);
  LLMK_CHECK(result.device() == x.device() && result.is_contiguous(),
             "ops::{}: {} must be contiguous, on x's device", op, result_name);
  if (at.cuda) {
#ifdef LLMK_HAS_CUDA
    LLMK_CHECK(x.dim(1) <= cuda::grad::cosine_diversity_max_dim(),
               "ops::{}: x is {}: CUDA takes rows of at most {} values", op, x.str(),
               cuda::grad::cosine_diversity_max_dim());
    const size_t need = cuda::grad::cosine_diversity_workspace(x.dim(0), x.dim(1));
    LLMK_CHECK(workspace && workspace->device() == Device::CUDA && workspace->is_contiguous() &&
                   static_cast<size_t>(workspace->nbytes()) >= need,
               "ops::{}: CUDA needs a contiguous workspace of {} bytes", op, need);
#endif
  }
  (void)workspace;  // the CPU kernels need none
  return at;
}

}  // namespace

size_t cosine_diversity_workspace(const Tensor& x) {
#ifdef LLMK_HAS_CUDA
  if (x.device() == Device::CUDA && x.ndim() == 2) {
    return cuda::grad::cosine_diversity_workspace(x.dim(0), x.dim(1));
  }
#endif
  (void)x;
  return 0;
}

void cosine_diversity_forward(Tensor& out, const Tensor& x, bool rows, Tensor* workspace) {
  constexpr std::string_view op = "cosine_diversity_forward";
  const Where at = check_diversity(op, x, out, "out", workspace);
  const int64_t N = x.dim(0), d = x.dim(1);
  require_shape(op, "out", out, rows ? Shape{N} : Shape{1});
  require_dtype(op, "out", out, at.cuda ? DType::F32 : at.dt);
  require_disjoint(op, "out", out, "x", x);
  if (at.cuda) {
#ifdef LLMK_HAS_CUDA
    with_cuda_float(at.dt, [&]<class T>() {
      cuda::grad::cosine_diversity_fwd(out.data<float>(), x.data<const T>(), N, d, rows,
                                       workspace->data());
    });
    count(op, "cuda");
#endif
    return;
  }
  with_float(at.dt, [&]<class T>() {
    cpu::grad::cosine_diversity_fwd(out.data<T>(), x.data<const T>(), N, d, rows);
  });
  count(op, "cpu");
}

void cosine_diversity_backward(Tensor& dx, const Tensor& dout, const Tensor& x, bool rows,
                               Tensor* workspace) {
  constexpr std::string_view op = "cosine_diversity_backward";
  const Where at = check_diversity(op, x, dx, "dx", workspace);
  const int64_t N = x.dim(0), d = x.dim(1);
  require_shape(op, "dout", dout, rows ? Shape{N} : Shape{1});
  require_dtype(op, "dout", dout, at.cuda ? DType::F32 : at.dt);
  LLMK_CHECK(dout.device() == x.device() && dout.is_contiguous(),
             "ops::{}: dout must be contiguous, on x's device", op);
  require_shape(op, "dx", dx, x.shape());
  require_dtype(op, "dx", dx, at.dt);
  require_disjoint(op, "dx", dx, "x", x);
  require_disjoint(op, "dx", dx, "dout", dout);
  if (at.cuda) {
#ifdef LLMK_HAS_CUDA
    with_cuda_float(at.dt, [&]<class T>() {
      cuda::grad::cosine_diversity_bwd(dx.data<T>(), dout.data<const float>(), x.data<const T>(), N,
                                       d, rows, workspace->data());
    });
    count(op, "cuda");
#endif
    return;
  }
  with_float(at.dt, [&]<class T>() {
    cpu::grad::cosine_diversity_bwd(dx.data<T>(), dout.data<const T>(), x.data<const T>(), N, d,
                                    rows);
  });
  count(op, "cpu");
}

// ---- distillation losses ----

void distill_forward(Tensor& loss, Tensor* grad, const Tensor& student, const Tensor& teacher,
                     const Tensor* labels, const DistillParams& p, const Tensor* grad_scale) {
  constexpr std::string_view op = "distill_forward";
  const Where at = check_float(op, {{"student", &student}, {"teacher", &teacher}}, true, true);
  const DType dt = at.dt;
  require_ndim(op, "student", student, 2);
  require_shape(op, "teacher", teacher, student.shape());
  const int64_t rows = student.dim(0), V = student.dim(1);
  LLMK_CHECK(V > 0, "ops::{}: student is {}: rows of no logits", op, student.str());
  LLMK_CHECK(p.temperature > 0 && std::isfinite(p.temperature),
             "ops::{}: temperature {} must be positive", op, p.temperature);
  LLMK_CHECK(p.beta >= 0 && p.beta <= 1, "ops::{}: beta {} must be in [0, 1]", op, p.beta);
  LLMK_CHECK(p.alpha >= 0 && p.alpha <= 1, "ops::{}: alpha {} must be in [0, 1]", op, p.alpha);
  LLMK_CHECK(p.alpha == 0 || labels, "ops::{}: alpha {} mixes in the hard label: labels needed", op,
             p.alpha);
  const DType loss_dt = at.cuda ? DType::F32 : dt;
  LLMK_CHECK(loss.device() == student.device() && loss.is_contiguous(),
             "ops::{}: loss must be contiguous, on student's device", op);
  require_dtype(op, "loss", loss, loss_dt);
  require_shape(op, "loss", loss, {rows});
  if (labels) {
    LLMK_CHECK(labels->device() == student.device() && labels->is_contiguous(),
               "ops::{}: labels must be contiguous, on student's device", op);
    require_dtype(op, "labels", *labels, DType::I64);
    require_shape(op, "labels", *labels, {rows});
  }
  if (grad) {
    LLMK_CHECK(grad->device() == student.device() && grad->is_contiguous(),
               "ops::{}: grad must be contiguous, on student's device", op);
    require_dtype(op, "grad", *grad, dt);
    require_shape(op, "grad", *grad, student.shape());
    // grad may be student itself (in place), else apart from it.
    if (grad->data() != student.data()) require_disjoint(op, "grad", *grad, "student", student);
    if (grad->data() != teacher.data()) require_disjoint(op, "grad", *grad, "teacher", teacher);
  }
  // grad_scale: f32 on CUDA; on the CPU in the logits' dtype (f64 keeps 1/n exact enough).
  const DType scale_dt = at.cuda ? DType::F32 : dt;
  if (grad_scale) {
    LLMK_CHECK(grad_scale->device() == student.device() && grad_scale->dtype() == scale_dt &&
                   grad_scale->numel() == 1,
               "ops::{}: grad_scale must be one {} on student's device", op, dtype_name(scale_dt));
  }
  if (at.cuda) {
#ifdef LLMK_HAS_CUDA
    const char* kernel = "cuda";
    with_cuda_float(dt, [&]<class T>() {
      kernel = cuda::grad::distill_rows(loss.data<float>(), grad ? grad->data<T>() : nullptr,
                                        student.data<const T>(), teacher.data<const T>(),
                                        labels ? labels->data<const int64_t>() : nullptr, rows, V,
                                        p, grad_scale ? grad_scale->data<const float>() : nullptr);
    });
    count(op, kernel);
#endif
    return;
  }
  with_float(dt, [&]<class T>() {
    const double scale = grad_scale ? static_cast<double>(grad_scale->data<const T>()[0]) : 1.0;
    cpu::grad::distill_rows(loss.data<T>(), grad ? grad->data<T>() : nullptr,
                            student.data<const T>(), teacher.data<const T>(),
                            labels ? labels->data<const int64_t>() : nullptr, rows, V, p, scale);
  });
  count(op, "cpu");
}

void scale_rows(Tensor& x, const Tensor& s) {
  constexpr std::string_view op = "scale_rows";
  const Where at = check_float(op, {{"x", &x}}, true, true);
  require_ndim(op, "x", x, 2);
  const int64_t rows = x.dim(0), cols = x.dim(1);
  const DType s_dt = at.cuda ? DType::F32 : at.dt;  // f32 on CUDA, x's dtype on the CPU
  LLMK_CHECK(s.device() == x.device() && s.dtype() == s_dt && s.is_contiguous() &&
                 (s.numel() == rows || s.numel() == 1),
             "ops::{}: s must be {} on x's device with 1 or {} values, not {}", op,
             dtype_name(s_dt), rows, s.str());
  const int64_t stride = s.numel() == 1 ? 0 : 1;
  if (at.cuda) {
#ifdef LLMK_HAS_CUDA
    with_cuda_float(at.dt, [&]<class T>() {
      cuda::grad::scale_rows(x.data<T>(), s.data<const float>(), stride, rows, cols);
    });
    count(op, "cuda");
#endif
    return;
  }
  with_float(at.dt, [&]<class T>() {
    T* p = x.data<T>();
    const T* f = s.data<const T>();
    for (int64_t r = 0; r < rows; ++r) {
      const T v = f[r * stride];
      if (v == T(1)) continue;
      for (int64_t c = 0; c < cols; ++c) p[r * cols + c] *= v;
    }
  });
  count(op, "cpu");
}

// ---- attention transfer ----

namespace {

using TransferParams = cpu::grad::AttentionTransferParams;

// The checks forward and backward share (inputs: shapes, one dtype and device, contiguity; the
// options; on CUDA the kernels' limits); returns where the op runs and the kernels' sizes.
// What both directions need of checked inputs: where they are, the kernels' parameters, and the
// statistics' dtype and shape ([B, R, S]; f32 on CUDA, the inputs' dtype on the CPU).
struct CheckedTransfer {
  Where at;
  TransferParams p;
  DType stat_dt;
  Shape rows;
};
CheckedTransfer check_transfer(std::string_view op, const Tensor& tq, const Tensor& tk,
                               const Tensor& sq, const Tensor& sk,
                               const AttentionTransferOptions& o) {
  const Where at =
      check_float(op, {{"tq", &tq}, {"tk", &tk}, {"sq", &sq}, {"sk", &sk}}, true, true);
  for (const auto& [name, t] : {NamedTensor{"tq", &tq}, {"tk", &tk}, {"sq", &sq}, {"sk", &sk}}) {
    require_ndim(op, name, *t, 3);
  }
  require_shape(op, "tk", tk, tq.shape());
  require_shape(op, "sk", sk, sq.shape());
  LLMK_CHECK(sq.dim(0) == tq.dim(0) && sq.dim(1) == tq.dim(1),
             "ops::{}: tq is {} but sq is {}: teacher and student must share B and S", op, tq.str(),
             sq.str());
  const int64_t R = o.relation_heads, wt = tq.dim(2), ws = sq.dim(2);
  LLMK_CHECK(R > 0 && wt > 0 && ws > 0 && wt % R == 0 && ws % R == 0,
             "ops::{}: relation_heads {} must divide both sides' widths ({} and {})", op, R, wt,
             ws);
  LLMK_CHECK(o.temperature > 0 && std::isfinite(o.temperature),
             "ops::{}: temperature {} must be positive", op, o.temperature);
  if (at.cuda) {
    const std::string why = attention_transfer_unsupported(tq, tk, sq, sk, R);
    LLMK_CHECK(why.empty(), "ops::{}: {}", op, why);
  }
  TransferParams p;
  p.B = tq.dim(0);
  p.S = tq.dim(1);
  p.R = R;
  p.dt = wt / R;
  p.ds = ws / R;
  p.temperature = o.temperature;
  p.causal = o.causal;
  return {at, p, at.cuda ? DType::F32 : at.dt, Shape{p.B, p.R, p.S}};
}

// An output: contiguous, on the inputs' device, of dtype dt and shape `shape`, sharing no bytes
// with any of `others`.
void check_transfer_output(std::string_view op, std::string_view name, const Tensor& out,
                           const Tensor& like, DType dt, const Shape& shape,
                           std::initializer_list<NamedTensor> others) {
  LLMK_CHECK(out.device() == like.device() && out.is_contiguous(),
             "ops::{}: {} must be contiguous, on the inputs' device", op, name);
  require_dtype(op, name, out, dt);
  require_shape(op, name, out, shape);
  for (const auto& [other, t] : others) require_disjoint(op, name, out, other, *t);
}

}  // namespace

std::string attention_transfer_unsupported(const Tensor& tq, const Tensor& tk, const Tensor& sq,
                                           const Tensor& sk, int64_t relation_heads) {
  const DType dt = tq.dtype();
  if (tq.device() == Device::CPU) {
    if (dt == DType::F32 || dt == DType::F64) return "";
    return fmt::format("the CPU kernel takes f32 or f64, not {}", dtype_name(dt));
  }
#ifndef LLMK_HAS_CUDA
  (void)tk;
  (void)sq;
  (void)sk;
  (void)relation_heads;
  return "llmk was built without CUDA kernels";
#else
  if (dt != DType::BF16 && dt != DType::F16) {
    return fmt::format("the CUDA kernel takes bf16 or f16, not {}", dtype_name(dt));
  }
  if (tq.ndim() != 3 || sq.ndim() != 3 || relation_heads <= 0) {
    return fmt::format("tq {} and sq {} are not [B, S, R d] for {} relation heads", tq.str(),
                       sq.str(), relation_heads);
  }
  const int64_t d_t = tq.dim(2) / relation_heads, d_s = sq.dim(2) / relation_heads;
  constexpr int64_t kMul = cuda::grad::kAttentionTransferDimMultiple;
  if (d_t % kMul != 0 || d_s % kMul != 0) {
    return fmt::format(
        "relation head dims {} (teacher) and {} (student): the CUDA kernel takes "
        "multiples of {}",
        d_t, d_s, kMul);
  }
  if (d_t > cuda::grad::kAttentionTransferMaxDt || d_s > cuda::grad::kAttentionTransferMaxDs) {
    return fmt::format(
        "relation head dims {} (teacher) and {} (student): the CUDA kernel takes "
        "at most {} and {}",
        d_t, d_s, cuda::grad::kAttentionTransferMaxDt, cuda::grad::kAttentionTransferMaxDs);
  }
  for (const auto& [name, t] : {NamedTensor{"tq", &tq}, {"tk", &tk}, {"sq", &sq}, {"sk", &sk}}) {
    if (reinterpret_cast<uintptr_t>(t->data()) % 16 != 0) {
      return fmt::format("{} is not 16-byte aligned", name);
    }
  }
  // 32-bit sizes in the kernels: S, and the grid's blocks (64-row tiles x B x R).
  constexpr int64_t kMax = 0x7fffffff;
  const int64_t S = tq.dim(1), tiles = (S + 63) / 64;
  if (S > kMax || tq.dim(0) * relation_heads * tiles > kMax) {
    return fmt::format("{} rows of {} relation heads are more than the CUDA kernel's grid takes",
                       tq.dim(0) * S, relation_heads);
  }
  return "";
#endif
}

void attention_transfer_forward(Tensor& kl, Tensor& lse_t, Tensor& lse_s, const Tensor& tq,
                                const Tensor& tk, const Tensor& sq, const Tensor& sk,
                                const AttentionTransferOptions& o) {
  constexpr std::string_view op = "attention_transfer_forward";
  const CheckedTransfer c = check_transfer(op, tq, tk, sq, sk, o);
  const Where at = c.at;
  const TransferParams& p = c.p;
  const DType stat_dt = c.stat_dt;
  const Shape& rows = c.rows;
  const std::initializer_list<NamedTensor> inputs = {
      {"tq", &tq}, {"tk", &tk}, {"sq", &sq}, {"sk", &sk}};
  check_transfer_output(op, "kl", kl, tq, stat_dt, rows, inputs);
  check_transfer_output(op, "lse_t", lse_t, tq, stat_dt, rows, inputs);
  check_transfer_output(op, "lse_s", lse_s, tq, stat_dt, rows, inputs);
  require_disjoint(op, "kl", kl, "lse_t", lse_t);
  require_disjoint(op, "kl", kl, "lse_s", lse_s);
  require_disjoint(op, "lse_t", lse_t, "lse_s", lse_s);
  if (at.cuda) {
#ifdef LLMK_HAS_CUDA
    with_cuda_float(at.dt, [&]<class T>() {
      if constexpr (!std::is_same_v<T, float>) {  // f32 was refused by the checks
        cuda::grad::attention_transfer_fwd(
            kl.data<float>(), lse_t.data<float>(), lse_s.data<float>(), tq.data<const T>(),
            tk.data<const T>(), sq.data<const T>(), sk.data<const T>(), p);
      }
    });
    count(op, "cuda");
#endif
    return;
  }
  with_float(at.dt, [&]<class T>() {
    cpu::grad::attention_transfer_fwd(kl.data<T>(), lse_t.data<T>(), lse_s.data<T>(),
                                      tq.data<const T>(), tk.data<const T>(), sq.data<const T>(),
                                      sk.data<const T>(), p);
  });
  count(op, "cpu");
}

void attention_transfer_backward(Tensor* dq, Tensor* dk, const Tensor& dout, const Tensor& tq,
                                 const Tensor& tk, const Tensor& sq, const Tensor& sk,
                                 const Tensor& lse_t, const Tensor& lse_s,
                                 const AttentionTransferOptions& o) {
  constexpr std::string_view op = "attention_transfer_backward";
  const CheckedTransfer c = check_transfer(op, tq, tk, sq, sk, o);
  const Where at = c.at;
  const TransferParams& p = c.p;
  const DType stat_dt = c.stat_dt;
  const Shape& rows = c.rows;
  for (const auto& [name, t] : {NamedTensor{"lse_t", &lse_t}, {"lse_s", &lse_s}}) {
    LLMK_CHECK(t->device() == tq.device() && t->is_contiguous(),
               "ops::{}: {} must be contiguous, on the inputs' device", op, name);
    require_dtype(op, name, *t, stat_dt);
    require_shape(op, name, *t, rows);
  }
  LLMK_CHECK(dout.device() == tq.device() && dout.dtype() == stat_dt && dout.numel() == 1,
             "ops::{}: dout must be one {} on the inputs' device, not {}", op, dtype_name(stat_dt),
             dout.str());
  const std::initializer_list<NamedTensor> inputs = {
      {"tq", &tq},       {"tk", &tk},       {"sq", &sq},    {"sk", &sk},
      {"lse_t", &lse_t}, {"lse_s", &lse_s}, {"dout", &dout}};
  if (dq) check_transfer_output(op, "dq", *dq, tq, at.dt, sq.shape(), inputs);
  if (dk) check_transfer_output(op, "dk", *dk, tq, at.dt, sq.shape(), inputs);
  if (dq && dk) require_disjoint(op, "dq", *dq, "dk", *dk);
  if (at.cuda) {
#ifdef LLMK_HAS_CUDA
    for (const auto& [name, t] : {NamedTensor{"dq", dq}, {"dk", dk}}) {
      LLMK_CHECK(!t || reinterpret_cast<uintptr_t>(t->data()) % 4 == 0,
                 "ops::{}: {} is not 4-byte aligned", op, name);
    }
    with_cuda_float(at.dt, [&]<class T>() {
      if constexpr (!std::is_same_v<T, float>) {  // f32 was refused by the checks
        cuda::grad::attention_transfer_bwd(
            dq ? dq->data<T>() : nullptr, dk ? dk->data<T>() : nullptr, tq.data<const T>(),
            tk.data<const T>(), sq.data<const T>(), sk.data<const T>(), lse_t.data<const float>(),
            lse_s.data<const float>(), dout.data<const float>(), p);
      }
    });
    count(op, "cuda");
#endif
    return;
  }
  with_float(at.dt, [&]<class T>() {
    const double grad =
        p.rows() > 0 ? static_cast<double>(dout.data<const T>()[0]) / static_cast<double>(p.rows())
                     : 0.0;
    cpu::grad::attention_transfer_bwd(dq ? dq->data<T>() : nullptr, dk ? dk->data<T>() : nullptr,
                                      tq.data<const T>(), tk.data<const T>(), sq.data<const T>(),
                                      sk.data<const T>(), lse_t.data<const T>(),
                                      lse_s.data<const T>(), grad, p);
  });
  count(op, "cpu");
}

// ---- stats ----

std::vector<KernelCount> train_op_stats() {
  Stats& s = stats();
  std::lock_guard<std::mutex> lock(s.mu);
  std::vector<KernelCount> out;
  for (const auto& [key, n] : s.calls) {
    out.push_back({std::get<0>(key), std::get<1>(key), std::get<2>(key), n});
  }
  return out;
}

void reset_train_op_stats() {
  Stats& s = stats();
  std::lock_guard<std::mutex> lock(s.mu);
  s.calls.clear();
}

}  // namespace llmk::ops
