// llmk._C.ops: the ops of src/ops/train.h over torch tensors (read directly) and other DLPack
// arrays (numpy), for python/llmk/ops.py. The caller allocates every output; arrays are borrowed,
// never copied.
// Errors are llmk.Error with the op's one-line message.
#include "ops/ops.h"

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "kernels/cpu/quantize.h"
#include "kernels/quant_layout.h"
#include "ops/train.h"

#ifdef LLMK_HAS_CUDA
#include "core/cuda/stream.h"
#include "kernels/cuda/attention/attention.h"
#include "kernels/cuda/attention_transfer.h"
#endif

namespace nb = nanobind;

namespace llmk::py {

// An array argument as it arrived: a torch tensor read through its attributes (data_ptr, shape,
// stride, dtype, is_cuda: about a microsecond each), anything else through DLPack (numpy). Going
// through DLPack made torch tensors cost tens of microseconds each per call (torch's __dlpack__
// builds stream objects for CUDA tensors), more than the work of the smaller ops.
struct Array {
  const void* data = nullptr;
  std::vector<int64_t> shape, strides;  // strides in elements
  std::optional<DType> dtype;           // nullopt: a type llmk does not take (named in `what`)
  std::string what;
  bool cuda = false, other_device = false;
  std::optional<nb::ndarray<>> dlpack;  // keeps a DLPack import alive for the call
};

}  // namespace llmk::py

namespace nanobind::detail {

template <>
struct type_caster<llmk::py::Array> {
  NB_TYPE_CASTER(llmk::py::Array, const_name("torch.Tensor | numpy.ndarray"))

  // torch's Tensor type and dtypes, looked up once torch is imported (never imported from here).
  struct Torch {
    PyObject* tensor = nullptr;
    PyObject *f32, *f64, *f16, *bf16, *i32, *i64, *i8, *u8;
  };
  static const Torch* torch() {
    static Torch t;
    static bool found = false;
    if (found) return &t;
    static PyObject* const name = PyUnicode_InternFromString("torch");
    PyObject* mod = PyImport_GetModule(name);  // only where already imported
    if (!mod) {
      PyErr_Clear();
      return nullptr;
    }
    auto get = [&](const char* name) {
      PyObject* o = PyObject_GetAttrString(mod, name);  // kept for the process
      if (!o) PyErr_Clear();
      return o;
    };
    t = {get("Tensor"), get("float32"), get("float64"), get("float16"), get("bfloat16"),
         get("int32"),  get("int64"),   get("int8"),    get("uint8")};
    Py_DECREF(mod);
    found = t.tensor != nullptr;
    return found ? &t : nullptr;
  }

  static bool ints(handle seq, std::vector<int64_t>& out) {
    if (!PyTuple_Check(seq.ptr())) return false;
    const Py_ssize_t n = PyTuple_GET_SIZE(seq.ptr());
    out.resize(static_cast<size_t>(n));
    for (Py_ssize_t i = 0; i < n; ++i) {
      out[static_cast<size_t>(i)] = PyLong_AsLongLong(PyTuple_GET_ITEM(seq.ptr(), i));
    }
    return !PyErr_Occurred();
  }

  bool from_torch(handle src, const Torch& t) noexcept {
    try {
      value.data = reinterpret_cast<const void*>(cast<uintptr_t>(src.attr("data_ptr")()));
      object shape = src.attr("shape"), strides = src.attr("stride")();
      if (!ints(shape, value.shape) || !ints(strides, value.strides)) return false;
      object dt = src.attr("dtype");
      const PyObject* d = dt.ptr();
      using llmk::DType;
      value.dtype = d == t.f32                 ? std::optional(DType::F32)
                    : d == t.f64               ? std::optional(DType::F64)
                    : d == t.f16               ? std::optional(DType::F16)
                    : d == t.bf16              ? std::optional(DType::BF16)
                    : d == t.i32               ? std::optional(DType::I32)
                    : d == t.i64               ? std::optional(DType::I64)
                    : (d == t.i8 || d == t.u8) ? std::optional(DType::I8)  // bytes
                                               : std::nullopt;
      if (!value.dtype) value.what = cast<std::string>(str(dt));
      value.cuda = cast<bool>(src.attr("is_cuda"));
      value.other_device = !value.cuda && !cast<bool>(src.attr("is_cpu"));
      if (value.other_device) value.what = cast<std::string>(str(src.attr("device")));
      return true;
    } catch (...) {
      PyErr_Clear();
      return false;
    }
  }

  bool from_python(handle src, uint8_t flags, cleanup_list* cleanup) noexcept {
    if (const Torch* t = torch(); t && PyObject_TypeCheck(src.ptr(), (PyTypeObject*)t->tensor)) {
      return from_torch(src, *t);
    }
    make_caster<nb::ndarray<>> c;
    if (!c.from_python(src, flags, cleanup)) return false;
    const nb::ndarray<>& a = c.value;
    value.dlpack = a;
    value.data = a.data();
    value.shape.resize(a.ndim());
    value.strides.resize(a.ndim());
    for (size_t i = 0; i < a.ndim(); ++i) {
      value.shape[i] = static_cast<int64_t>(a.shape(i));
      value.strides[i] = a.stride(i);
    }
    value.cuda = a.device_type() == nb::device::cuda::value;
    value.other_device = !value.cuda && a.device_type() != nb::device::cpu::value;
    if (value.other_device) value.what = "DLPack device type " + std::to_string(a.device_type());
    const nb::dlpack::dtype dt = a.dtype();
    using Code = nb::dlpack::dtype_code;
    const auto code = static_cast<Code>(dt.code);
    using llmk::DType;
    if (dt.lanes == 1) {
      if (code == Code::Float && dt.bits == 32) value.dtype = DType::F32;
      if (code == Code::Float && dt.bits == 64) value.dtype = DType::F64;
      if (code == Code::Float && dt.bits == 16) value.dtype = DType::F16;
      if (code == Code::Bfloat && dt.bits == 16) value.dtype = DType::BF16;
      if (code == Code::Int && dt.bits == 32) value.dtype = DType::I32;
      if (code == Code::Int && dt.bits == 64) value.dtype = DType::I64;
      if ((code == Code::Int || code == Code::UInt) && dt.bits == 8) value.dtype = DType::I8;
    }
    if (!value.dtype) {
      value.what = "DLPack code " + std::to_string(dt.code) + ", " + std::to_string(dt.bits) +
                   " bits, " + std::to_string(dt.lanes) + " lanes";
    }
    return true;
  }

  static handle from_cpp(const llmk::py::Array&, rv_policy, cleanup_list*) noexcept {
    return none().release();
  }
};

}  // namespace nanobind::detail

namespace llmk {
namespace {

using py::Array;
using OptArray = std::optional<Array>;

// A borrowed view of a; contiguous (in the sense of torch, where a dimension of size 1 may have
// any stride) arrays get contiguous strides, so that llmk's checks see them as such.
Tensor tensor_of(const Array& a, const char* name) {
  if (a.other_device) {
    throw Error(fmt::format("{}: arrays on {} are not supported (CPU or CUDA)", name, a.what));
  }
  if (!a.dtype) throw Error(fmt::format("{}: unsupported element type ({})", name, a.what));
  const Device device = a.cuda ? Device::CUDA : Device::CPU;
  const Shape shape(a.shape.begin(), a.shape.end());
  for (const int64_t st : a.strides) {
    if (st < 0) throw Error(fmt::format("{}: negative strides are not supported", name));
  }
  bool contiguous = true;
  int64_t expect = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] != 1 && a.strides[i] != expect) contiguous = false;
    expect *= shape[i];
  }
  void* data = const_cast<void*>(a.data);
  if (contiguous || shape_numel(shape) == 0) return Tensor::borrow(data, shape, *a.dtype, device);
  return Tensor::borrow_strided(data, shape, a.strides, *a.dtype, device);
}

std::optional<Tensor> opt_tensor(const OptArray& a, const char* name) {
  if (!a) return std::nullopt;
  return tensor_of(*a, name);
}

ops::Act act_of(const std::string& name) {
  if (name == "silu") return ops::Act::SiLU;
  if (name == "gelu_tanh") return ops::Act::GeluTanh;
  if (name == "gelu") return ops::Act::GeluErf;
  if (name == "none") return ops::Act::None;
  throw Error(fmt::format("unknown activation '{}' (silu, gelu, gelu_tanh or none)", name));
}

ops::FlashParams flash_params(double scale, bool causal, int64_t left, int64_t right,
                              double softcap, int64_t max_seqlen_k) {
  return {.scale = scale,
          .causal = causal,
          .window_left = left,
          .window_right = right,
          .softcap = softcap,
          .max_seqlen_k = max_seqlen_k};
}

// Runs f with llmk's current stream set to the caller's (a cudaStream_t as an integer, such as
// torch.cuda.current_stream().cuda_stream; 0 is the legacy default stream), without the GIL.
template <class F>
void on_stream(uintptr_t stream, F&& f) {
  nb::gil_scoped_release released;
#ifdef LLMK_HAS_CUDA
  cuda::StreamGuard guard(stream == 0 ? cudaStreamLegacy : reinterpret_cast<cudaStream_t>(stream));
#else
  (void)stream;
#endif
  f();
}

// "q8_0", "q5_0" or "q4_0": the symmetric block types QuantizedLinear packs into.
DType symmetric_type(const std::string& name) {
  if (name == "q8_0") return DType::Q8_0;
  if (name == "q5_0") return DType::Q5_0;
  if (name == "q4_0") return DType::Q4_0;
  throw Error(fmt::format("unknown block type '{}' (q8_0, q5_0 or q4_0)", name));
}

// a as a borrowed contiguous tensor of element type t: its checks named after `name`.
const Array& require(const Array& a, const char* name, DType t, bool cpu) {
  const Tensor v = tensor_of(a, name);
  LLMK_CHECK(v.dtype() == t, "{}: {} where {} is needed", name, v.str(), dtype_name(t));
  LLMK_CHECK(v.is_contiguous(), "{}: {} is not contiguous", name, v.str());
  LLMK_CHECK(!cpu || v.device() == Device::CPU, "{}: {} must be on the CPU", name, v.str());
  return a;
}

}  // namespace

void register_ops(nb::module_& parent) {
  nb::module_ m =
      parent.def_submodule("ops", "llmk's training ops over torch tensors and DLPack arrays");

  m.def(
      "rms_norm_forward",
      [](Array y, Array rstd, Array x, Array w, double eps, OptArray residual, OptArray sum,
         uintptr_t stream) {
        Tensor ty = tensor_of(y, "y"), tr = tensor_of(rstd, "rstd");
        std::optional<Tensor> res = opt_tensor(residual, "residual"), s = opt_tensor(sum, "sum");
        on_stream(stream, [&] {
          ops::rms_norm_forward(ty, tr, tensor_of(x, "x"), tensor_of(w, "w"), eps,
                                res ? &*res : nullptr, s ? &*s : nullptr);
        });
      },
      nb::arg("y"), nb::arg("rstd"), nb::arg("x"), nb::arg("w"), nb::arg("eps"),
      nb::arg("residual").none(), nb::arg("sum").none(), nb::arg("stream"));
  m.def(
      "rms_norm_backward",
      [](Array dx, OptArray dw, Array dy, Array x, Array w, Array rstd, OptArray workspace,
         OptArray dres, uintptr_t stream) {
        Tensor tdx = tensor_of(dx, "dx");
        std::optional<Tensor> tdw = opt_tensor(dw, "dw"), ws = opt_tensor(workspace, "workspace"),
                              tres = opt_tensor(dres, "dres");
        on_stream(stream, [&] {
          ops::rms_norm_backward(tdx, tdw ? &*tdw : nullptr, tensor_of(dy, "dy"), tensor_of(x, "x"),
                                 tensor_of(w, "w"), tensor_of(rstd, "rstd"), ws ? &*ws : nullptr,
                                 tres ? &*tres : nullptr);
        });
      },
      nb::arg("dx"), nb::arg("dw").none(), nb::arg("dy"), nb::arg("x"), nb::arg("w"),
      nb::arg("rstd"), nb::arg("workspace").none(), nb::arg("dres").none(), nb::arg("stream"));
  m.def(
      "rms_norm_backward_workspace",
      [](Array x) { return ops::rms_norm_backward_workspace(tensor_of(x, "x")); }, nb::arg("x"));
  m.def(
      "gated_forward",
      [](Array out, Array gate, Array up, const std::string& act, uintptr_t stream) {
        Tensor t = tensor_of(out, "out");
        const ops::Act a = act_of(act);
        on_stream(stream,
                  [&] { ops::gated_forward(t, tensor_of(gate, "gate"), tensor_of(up, "up"), a); });
      },
      nb::arg("out"), nb::arg("gate"), nb::arg("up"), nb::arg("act"), nb::arg("stream"));
  m.def(
      "gated_backward",
      [](Array dgate, Array dup, Array dout, Array gate, Array up, const std::string& act,
         uintptr_t stream) {
        Tensor tg = tensor_of(dgate, "dgate"), tu = tensor_of(dup, "dup");
        const ops::Act a = act_of(act);
        on_stream(stream, [&] {
          ops::gated_backward(tg, tu, tensor_of(dout, "dout"), tensor_of(gate, "gate"),
                              tensor_of(up, "up"), a);
        });
      },
      nb::arg("dgate"), nb::arg("dup"), nb::arg("dout"), nb::arg("gate"), nb::arg("up"),
      nb::arg("act"), nb::arg("stream"));
  m.def(
      "rope_table",
      [](Array cos, Array sin, Array positions, double theta, double freq_scale, OptArray factors) {
        Tensor tc = tensor_of(cos, "cos"), ts = tensor_of(sin, "sin");
        std::optional<Tensor> f = opt_tensor(factors, "factors");
        nb::gil_scoped_release released;
        ops::rope_table(tc, ts, tensor_of(positions, "positions"), theta, freq_scale,
                        f ? &*f : nullptr);
      },
      nb::arg("cos"), nb::arg("sin"), nb::arg("positions"), nb::arg("theta"), nb::arg("freq_scale"),
      nb::arg("factors").none());
  m.def(
      "rope_rotate",
      [](Array y, Array x, Array cos, Array sin, bool half_split, bool inverse, uintptr_t stream) {
        Tensor ty = tensor_of(y, "y");
        on_stream(stream, [&] {
          ops::rope_rotate(ty, tensor_of(x, "x"), tensor_of(cos, "cos"), tensor_of(sin, "sin"),
                           half_split, inverse);
        });
      },
      nb::arg("y"), nb::arg("x"), nb::arg("cos"), nb::arg("sin"), nb::arg("half_split"),
      nb::arg("inverse"), nb::arg("stream"));
  m.def(
      "flash_attention_forward",
      [](Array out, Array lse, Array q, Array k, Array v, Array cu_q, Array cu_k, double scale,
         bool causal, int64_t left, int64_t right, double softcap, int64_t max_seqlen_k,
         uintptr_t stream) {
        Tensor to = tensor_of(out, "out"), tl = tensor_of(lse, "lse");
        on_stream(stream, [&] {
          ops::flash_attention_forward(
              to, tl, tensor_of(q, "q"), tensor_of(k, "k"), tensor_of(v, "v"),
              tensor_of(cu_q, "cu_seqlens_q"), tensor_of(cu_k, "cu_seqlens_k"),
              flash_params(scale, causal, left, right, softcap, max_seqlen_k));
        });
      },
      nb::arg("out"), nb::arg("lse"), nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("cu_q"),
      nb::arg("cu_k"), nb::arg("scale"), nb::arg("causal"), nb::arg("window_left"),
      nb::arg("window_right"), nb::arg("softcap"), nb::arg("max_seqlen_k"), nb::arg("stream"));
  m.def(
      "flash_attention_backward",
      [](Array dq, Array dk, Array dv, Array dout, OptArray dlse, Array q, Array k, Array v,
         Array out, Array lse, Array cu_q, Array cu_k, double scale, bool causal, int64_t left,
         int64_t right, double softcap, int64_t max_seqlen_k, bool deterministic,
         OptArray workspace, uintptr_t stream) {
        Tensor tq = tensor_of(dq, "dq"), tk = tensor_of(dk, "dk"), tv = tensor_of(dv, "dv");
        ops::FlashParams p = flash_params(scale, causal, left, right, softcap, max_seqlen_k);
        p.deterministic = deterministic;
        std::optional<Tensor> tdl = opt_tensor(dlse, "dlse"),
                              ws = opt_tensor(workspace, "workspace");
        on_stream(stream, [&] {
          ops::flash_attention_backward(tq, tk, tv, tensor_of(dout, "dout"), tdl ? &*tdl : nullptr,
                                        tensor_of(q, "q"), tensor_of(k, "k"), tensor_of(v, "v"),
                                        tensor_of(out, "out"), tensor_of(lse, "lse"),
                                        tensor_of(cu_q, "cu_seqlens_q"),
                                        tensor_of(cu_k, "cu_seqlens_k"), p, ws ? &*ws : nullptr);
        });
      },
      nb::arg("dq"), nb::arg("dk"), nb::arg("dv"), nb::arg("dout"), nb::arg("dlse").none(),
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse"), nb::arg("cu_q"),
      nb::arg("cu_k"), nb::arg("scale"), nb::arg("causal"), nb::arg("window_left"),
      nb::arg("window_right"), nb::arg("softcap"), nb::arg("max_seqlen_k"),
      nb::arg("deterministic"), nb::arg("workspace").none(), nb::arg("stream"));
  m.def(
      "flash_attention_backward_workspace",
      [](Array q, int64_t sequences) {
        return ops::flash_attention_backward_workspace(tensor_of(q, "q"), sequences);
      },
      nb::arg("q"), nb::arg("sequences"));
  m.attr("cuda") =
#ifdef LLMK_HAS_CUDA
      true;
#else
      false;
#endif
  m.def(
      "linear_act_forward",
      [](Array y, OptArray z, Array x, Array w, OptArray bias, const std::string& act,
         uintptr_t stream) {
        Tensor ty = tensor_of(y, "y");
        std::optional<Tensor> tz = opt_tensor(z, "z"), b = opt_tensor(bias, "bias");
        const ops::Act a = act_of(act);
        on_stream(stream, [&] {
          ops::linear_act_forward(ty, tz ? &*tz : nullptr, tensor_of(x, "x"), tensor_of(w, "w"),
                                  b ? &*b : nullptr, a);
        });
      },
      nb::arg("y"), nb::arg("z").none(), nb::arg("x"), nb::arg("w"), nb::arg("bias").none(),
      nb::arg("act"), nb::arg("stream"));
  m.def(
      "linear_act_backward",
      [](OptArray dx, OptArray dw, OptArray db, Array dy, Array x, Array w, Array z,
         const std::string& act, OptArray dz_buffer, uintptr_t stream) {
        std::optional<Tensor> tdx = opt_tensor(dx, "dx"), tdw = opt_tensor(dw, "dw"),
                              tdb = opt_tensor(db, "db"), tdz = opt_tensor(dz_buffer, "dz_buffer");
        const ops::Act a = act_of(act);
        on_stream(stream, [&] {
          ops::linear_act_backward(tdx ? &*tdx : nullptr, tdw ? &*tdw : nullptr,
                                   tdb ? &*tdb : nullptr, tensor_of(dy, "dy"), tensor_of(x, "x"),
                                   tensor_of(w, "w"), tensor_of(z, "z"), a, tdz ? &*tdz : nullptr);
        });
      },
      nb::arg("dx").none(), nb::arg("dw").none(), nb::arg("db").none(), nb::arg("dy"), nb::arg("x"),
      nb::arg("w"), nb::arg("z"), nb::arg("act"), nb::arg("dz_buffer").none(), nb::arg("stream"));
  m.def(
      "cosine_diversity_forward",
      [](Array out, Array x, bool rows, OptArray workspace, uintptr_t stream) {
        Tensor t = tensor_of(out, "out");
        std::optional<Tensor> ws = opt_tensor(workspace, "workspace");
        on_stream(stream, [&] {
          ops::cosine_diversity_forward(t, tensor_of(x, "x"), rows, ws ? &*ws : nullptr);
        });
      },
      nb::arg("out"), nb::arg("x"), nb::arg("rows"), nb::arg("workspace").none(),
      nb::arg("stream"));
  m.def(
      "cosine_diversity_backward",
      [](Array dx, Array dout, Array x, bool rows, OptArray workspace, uintptr_t stream) {
        Tensor t = tensor_of(dx, "dx");
        std::optional<Tensor> ws = opt_tensor(workspace, "workspace");
        on_stream(stream, [&] {
          ops::cosine_diversity_backward(t, tensor_of(dout, "dout"), tensor_of(x, "x"), rows,
                                         ws ? &*ws : nullptr);
        });
      },
      nb::arg("dx"), nb::arg("dout"), nb::arg("x"), nb::arg("rows"), nb::arg("workspace").none(),
      nb::arg("stream"));
  m.def(
      "cosine_diversity_workspace",
      [](Array x) { return ops::cosine_diversity_workspace(tensor_of(x, "x")); }, nb::arg("x"));
  m.def(
      "distill_forward",
      [](Array loss, OptArray grad, Array student, Array teacher, OptArray labels,
         const std::string& kind, double beta, double temperature, double alpha,
         int64_t ignore_index, OptArray grad_scale, uintptr_t stream) {
        Tensor tl = tensor_of(loss, "loss");
        std::optional<Tensor> tg = opt_tensor(grad, "grad"), tlab = opt_tensor(labels, "labels"),
                              ts = opt_tensor(grad_scale, "grad_scale");
        ops::DistillParams p;
        if (kind == "kl") {
          p.kind = ops::Divergence::KL;
        } else if (kind == "reverse_kl") {
          p.kind = ops::Divergence::ReverseKL;
        } else if (kind == "jsd") {
          p.kind = ops::Divergence::JSD;
        } else {
          throw Error(fmt::format("distill_forward: loss '{}' is not kl, reverse_kl or jsd", kind));
        }
        p.beta = beta;
        p.temperature = temperature;
        p.alpha = alpha;
        p.ignore_index = ignore_index;
        on_stream(stream, [&] {
          ops::distill_forward(tl, tg ? &*tg : nullptr, tensor_of(student, "student"),
                               tensor_of(teacher, "teacher"), tlab ? &*tlab : nullptr, p,
                               ts ? &*ts : nullptr);
        });
      },
      nb::arg("loss"), nb::arg("grad").none(), nb::arg("student"), nb::arg("teacher"),
      nb::arg("labels").none(), nb::arg("kind"), nb::arg("beta"), nb::arg("temperature"),
      nb::arg("alpha"), nb::arg("ignore_index"), nb::arg("grad_scale").none(), nb::arg("stream"));
  m.def(
      "scale_rows",
      [](Array x, Array s, uintptr_t stream) {
        Tensor t = tensor_of(x, "x");
        on_stream(stream, [&] { ops::scale_rows(t, tensor_of(s, "s")); });
      },
      nb::arg("x"), nb::arg("s"), nb::arg("stream"));
  m.def(
      "attention_transfer_forward",
      [](Array kl, Array lse_t, Array lse_s, Array tq, Array tk, Array sq, Array sk,
         int64_t relation_heads, double temperature, bool causal, uintptr_t stream) {
        Tensor tkl = tensor_of(kl, "kl"), tlt = tensor_of(lse_t, "lse_t"),
               tls = tensor_of(lse_s, "lse_s");
        const ops::AttentionTransferOptions o{relation_heads, temperature, causal};
        on_stream(stream, [&] {
          ops::attention_transfer_forward(tkl, tlt, tls, tensor_of(tq, "tq"), tensor_of(tk, "tk"),
                                          tensor_of(sq, "sq"), tensor_of(sk, "sk"), o);
        });
      },
      nb::arg("kl"), nb::arg("lse_t"), nb::arg("lse_s"), nb::arg("tq"), nb::arg("tk"),
      nb::arg("sq"), nb::arg("sk"), nb::arg("relation_heads"), nb::arg("temperature"),
      nb::arg("causal"), nb::arg("stream"));
  m.def(
      "attention_transfer_backward",
      [](OptArray dq, OptArray dk, Array dout, Array tq, Array tk, Array sq, Array sk, Array lse_t,
         Array lse_s, int64_t relation_heads, double temperature, bool causal, uintptr_t stream) {
        std::optional<Tensor> tdq = opt_tensor(dq, "dq"), tdk = opt_tensor(dk, "dk");
        const ops::AttentionTransferOptions o{relation_heads, temperature, causal};
        on_stream(stream, [&] {
          ops::attention_transfer_backward(
              tdq ? &*tdq : nullptr, tdk ? &*tdk : nullptr, tensor_of(dout, "dout"),
              tensor_of(tq, "tq"), tensor_of(tk, "tk"), tensor_of(sq, "sq"), tensor_of(sk, "sk"),
              tensor_of(lse_t, "lse_t"), tensor_of(lse_s, "lse_s"), o);
        });
      },
      nb::arg("dq").none(), nb::arg("dk").none(), nb::arg("dout"), nb::arg("tq"), nb::arg("tk"),
      nb::arg("sq"), nb::arg("sk"), nb::arg("lse_t"), nb::arg("lse_s"), nb::arg("relation_heads"),
      nb::arg("temperature"), nb::arg("causal"), nb::arg("stream"));
  // The CUDA kernels' limits (llmk.ops decides from them and the tensors' metadata, which
  // torch.compile can trace): (dim multiple, largest teacher dim, largest student dim).
  m.attr("attention_transfer_limits") =
#ifdef LLMK_HAS_CUDA
      nb::make_tuple(cuda::grad::kAttentionTransferDimMultiple, cuda::grad::kAttentionTransferMaxDt,
                     cuda::grad::kAttentionTransferMaxDs);
#else
      nb::none();
#endif
  // "" where a kernel of llmk takes these [B, S, R d] inputs, else why not (llmk.ops then runs
  // torch code and counts the reason).
  m.def(
      "attention_transfer_unsupported",
      [](Array tq, Array tk, Array sq, Array sk, int64_t relation_heads) {
        return ops::attention_transfer_unsupported(tensor_of(tq, "tq"), tensor_of(tk, "tk"),
                                                   tensor_of(sq, "sq"), tensor_of(sk, "sk"),
                                                   relation_heads);
      },
      nb::arg("tq"), nb::arg("tk"), nb::arg("sq"), nb::arg("sk"), nb::arg("relation_heads"));
  // Bytes a row of K weights takes as blocks of `type` ("q8_0", "q5_0" or "q4_0"): what
  // pack_symmetric's dst holds a row.
  m.def(
      "packed_row_bytes",
      [](const std::string& type, int64_t K) {
        LLMK_CHECK(K >= 0 && K % 32 == 0, "K = {} is not whole blocks of 32", K);
        return bytes_for(symmetric_type(type), K);
      },
      nb::arg("type"), nb::arg("K"));
  // Integer weights q ([N, K] int8, CPU) with one f32 scale a block of 32 ([N, K / 32], each an
  // f16 value) as blocks of `type` ("q8_0", "q5_0" or "q4_0") in dst (uint8, CPU, the blocks'
  // bytes): the GGUF layout the CPU linear reads, or with gpu_layout the CUDA kernels'
  // (kernels/quant_layout.h). For llmk.nn.QuantizedLinear.
  m.def(
      "pack_symmetric",
      [](Array dst, Array q, Array scales, const std::string& type, bool gpu_layout) {
        const DType t = symmetric_type(type);
        const Tensor tq = tensor_of(require(q, "q", DType::I8, true), "q");
        const Tensor ts = tensor_of(require(scales, "scales", DType::F32, true), "scales");
        const Tensor td = tensor_of(require(dst, "dst", DType::I8, true), "dst");
        LLMK_CHECK(tq.ndim() == 2, "q: {} must be [N, K]", tq.str());
        const int64_t N = tq.dim(0), K = tq.dim(1);
        LLMK_CHECK(K % 32 == 0, "q: {} holds rows of {}, not whole blocks of 32", tq.str(), K);
        const Shape want_scales{N, K / 32};
        LLMK_CHECK(ts.shape() == want_scales, "scales: {} where [{}, {}] is needed", ts.str(), N,
                   K / 32);
        const int64_t row = bytes_for(t, K);
        LLMK_CHECK(td.numel() == N * row, "dst: {} where {} bytes are needed", td.str(), N * row);
        nb::gil_scoped_release released;
        auto* out = static_cast<uint8_t*>(td.data());
        std::vector<uint8_t> gguf(gpu_layout ? static_cast<size_t>(N * row) : 0);
        uint8_t* rows = gpu_layout ? gguf.data() : out;
        for (int64_t n = 0; n < N; ++n) {
          try {
            cpu::pack_symmetric_row(t, tq.data<const int8_t>() + n * K,
                                    ts.data<const float>() + n * (K / 32), rows + n * row, K);
          } catch (const Error& e) {
            throw Error(fmt::format("row {}: {}", n, e.what()));
          }
        }
        if (gpu_layout) qlayout::repack(t, gguf.data(), out, N, K);
      },
      nb::arg("dst"), nb::arg("q"), nb::arg("scales"), nb::arg("type"), nb::arg("gpu_layout"));
  // out [M, N] = x [M, K] @ w^T (+ bias), w the bytes pack_symmetric wrote for [N, K] blocks of
  // `type`, on x's device in that device's layout: ops::linear (CPU: f32 x and out; CUDA: bf16 x,
  // bf16 out, bias bf16 or f32).
  m.def(
      "quantized_linear",
      [](Array out, Array x, Array w, const std::string& type, int64_t N, int64_t K, OptArray bias,
         uintptr_t stream) {
        const DType t = symmetric_type(type);
        Tensor to = tensor_of(out, "out");
        const Tensor tx = tensor_of(x, "x");
        const Tensor raw = tensor_of(require(w, "w", DType::I8, false), "w");
        LLMK_CHECK(N > 0 && K > 0 && K % 32 == 0 && raw.numel() == N * bytes_for(t, K),
                   "w: {} does not hold [{}, {}] {} weights", raw.str(), N, K, dtype_name(t));
        const Tensor tw = Tensor::borrow(const_cast<void*>(raw.data()), {N, K}, t, raw.device());
        std::optional<Tensor> b = opt_tensor(bias, "bias");
        on_stream(stream, [&] { ops::linear(to, tx, tw, b ? &*b : nullptr); });
      },
      nb::arg("out"), nb::arg("x"), nb::arg("w"), nb::arg("type"), nb::arg("N"), nb::arg("K"),
      nb::arg("bias").none(), nb::arg("stream"));
  m.def("stats", [] {
    std::vector<std::tuple<std::string, std::string, std::string, uint64_t>> out;
    for (const ops::KernelCount& c : ops::train_op_stats()) {
      out.emplace_back(c.op, c.kernel, c.reason, c.calls);
    }
    return out;
  });
  m.def("reset_stats", [] { ops::reset_train_op_stats(); });
  // Which attention kernels run on an sm_90 GPU, forward and backward: "auto" (warpgroup MMA,
  // the forward warp-specialised at head dims 96 and 128), "wgmma" (the forward's warpgroup-MMA
  // kernel without warp specialisation at every head dim) or "mma-sync" (the portable build,
  // which every other GPU runs); for tests and benchmarks.
  m.def(
      "set_attention_kernel",
      [](const std::string& kernel) {
        LLMK_CHECK(kernel == "auto" || kernel == "wgmma" || kernel == "mma-sync",
                   "set_attention_kernel: \"{}\" is not \"auto\", \"wgmma\" or \"mma-sync\"",
                   kernel);
#ifdef LLMK_HAS_CUDA
        cuda::set_prefill_kernel(kernel == "auto"    ? cuda::PrefillKernel::kAuto
                                 : kernel == "wgmma" ? cuda::PrefillKernel::kWgmma
                                                     : cuda::PrefillKernel::kMmaSync);
#endif
      },
      nb::arg("kernel"));
}

}  // namespace llmk
