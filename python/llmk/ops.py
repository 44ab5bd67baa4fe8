"""llmk's kernels as PyTorch ops, with autograd.

    import torch, llmk.ops as L
    x = torch.randn(4, 4096, requires_grad=True)
    y = L.rms_norm(x, torch.ones(4096), eps=1e-6)
    y.sum().backward()

Each op is a `torch.library.custom_op` (namespace `llmk`) with a fake implementation, so
`torch.compile(fullgraph=True)` traces through it, and a registered backward (itself a custom
op). The CPU kernels take float32 and float64 (every tensor of a call the same dtype) and sum in
double; they are the reference for the CUDA kernels. This build's CUDA kernels are not wired to
these ops yet: CUDA tensors raise llmk.Error. `stats()` tells which kernel ran how often.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence, Union

import torch
from torch import Tensor

from llmk._C import Error
from llmk._C import ops as _C

__all__ = [
    "flash_attn",
    "rms_norm",
    "rope",
    "rope_cos_sin",
    "swiglu",
    "geglu",
    "linear_act",
    "pairwise_cosine_diversity",
    "pairwise_cosine_distance",
    "cosine_topk",
    "distill_loss",
    "fused_linear_distill_loss",
    "fused_linear_cross_entropy",
    "attention_transfer_loss",
    "load_teacher_topk",
    "stats",
    "reset_stats",
]


def _d(t: Optional[Tensor]) -> Optional[Tensor]:
    """t as the kernels take it: detached (DLPack refuses tensors that require grad)."""
    return None if t is None else t.detach()


def _c(t: Tensor) -> Tensor:
    """t contiguous and detached (gradients may arrive expanded or strided)."""
    return t.detach().contiguous()


def _stat_dtype(x: Tensor) -> torch.dtype:
    """float32 for the per-row statistics of 16-bit inputs, else x's own dtype."""
    return torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype


# torch's raw current-stream getter (what Triton and Inductor call): a microsecond where
# torch.cuda.current_stream() builds a Stream object.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _stream(t: Tensor) -> int:
    """The current CUDA stream of t's device as an integer (0 on the CPU)."""
    if not t.is_cuda:
        return 0
    if _raw_stream is not None:
        return _raw_stream(t.get_device())
    return torch.cuda.current_stream(t.device).cuda_stream


def _lse_dtype(q: Tensor) -> torch.dtype:
    """float32 for 16-bit inputs (the CUDA kernels' log-sum-exp), else q's own."""
    return torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype


class _Op:
    """One llmk op: a torch.library custom op (what torch.compile traces, with its fake and its
    registered backward) and the same function called directly in eager mode, where the custom
    op's dispatch would cost tens of microseconds a call (an autograd.Function when a gradient
    is wanted). Tensors of other types than plain tensors and parameters (fake, functional,
    subclasses) take the custom op."""

    def __init__(self, name: str, fn):
        self.raw = fn
        self.custom = torch.library.custom_op(f"llmk::{name}", mutates_args=())(fn)
        self.function = None

    def register_fake(self, fake):
        self.custom.register_fake(fake)
        return fake

    def register_autograd(self, user_backward, setup_context):
        def backward(ctx, *grads):
            # No gradient reaches any output: none leaves for any input.
            if all(g is None for g in grads):
                return (None,) * len(ctx.needs_input_grad)
            return user_backward(ctx, *grads)

        self.custom.register_autograd(backward, setup_context=setup_context)
        raw = self.raw

        def forward(ctx, *args):
            # Outputs the caller never uses (the saved statistics, linear_act's z, distill_loss's
            # gradient) get None in the backward instead of a materialised zero tensor.
            ctx.set_materialize_grads(False)
            out = raw(*args)
            setup_context(ctx, args, out)
            return out

        # The classic form (ctx first): the setup_context form binds default arguments through
        # inspect.signature on every call.
        self.function = type("LlmkOp", (torch.autograd.Function,),
                             {"forward": staticmethod(forward),
                              "backward": staticmethod(backward)})

    def __call__(self, *args):
        tensors = [a for a in args if isinstance(a, Tensor)]
        if _traced(*tensors):
            return self.custom(*args)
        if (self.function is not None and torch.is_grad_enabled()
                and any(t.requires_grad for t in tensors)):
            return self.function.apply(*args)
        return self.raw(*args)


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _traced(*tensors) -> bool:
    """Whether these tensors are being traced: under torch.compile, or tensor subclasses such as
    FunctionalTensor and FakeTensor (older torch releases trace a backward on those while
    is_compiling() is false). Traced, the ops run as torch.library custom ops, out of place."""
    return torch.compiler.is_compiling() or any(type(t) not in _PLAIN for t in tensors)


def _op(name: str):
    return lambda fn: _Op(name, fn)


def _check(cond: bool, msg) -> None:
    """Raises Error(msg) unless cond; msg a string, or a function giving it (so that an f-string
    message is formatted only on failure: the checks run on every call)."""
    if not cond:
        raise Error(msg() if callable(msg) else msg)


def _check_float(op: str, **tensors: Optional[Tensor]) -> None:
    """Same device, same floating dtype for every tensor given (None skipped). (Messages are
    formatted only on failure: this runs on every call.)"""
    first = None
    for name, t in tensors.items():
        if t is None:
            continue
        if not isinstance(t, Tensor):
            raise Error(f"llmk.ops.{op}: {name} must be a torch.Tensor")
        if first is None:
            first = (name, t)
            if not t.is_floating_point():
                raise Error(f"llmk.ops.{op}: {name} is {t.dtype}; a floating-point tensor is "
                            "needed")
            continue
        n0, t0 = first
        if t.device != t0.device:
            raise Error(f"llmk.ops.{op}: {name} is on {t.device} but {n0} on {t0.device}")
        if t.dtype != t0.dtype:
            raise Error(f"llmk.ops.{op}: {name} is {t.dtype} but {n0} is {t0.dtype}")


# ---------------------------------------------------------------------------------------------
# RMSNorm


@_op("rms_norm")
def _rms_norm(x: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    x2 = _c(x).reshape(-1, x.shape[-1])
    y = torch.empty_like(x2)
    rstd = x2.new_empty(x2.shape[0], dtype=_stat_dtype(x))
    _C.rms_norm_forward(y, rstd, x2, _c(weight), eps, None, None, _stream(x))
    return y.view(x.shape), rstd


@_rms_norm.register_fake
def _(x, weight, eps):
    return torch.empty_like(x, memory_format=torch.contiguous_format), x.new_empty(
        x.numel() // x.shape[-1], dtype=_stat_dtype(x))


@_op("add_rms_norm")
def _add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor,
                  eps: float) -> tuple[Tensor, Tensor, Tensor]:
    x2 = _c(x).reshape(-1, x.shape[-1])
    y = torch.empty_like(x2)
    s = torch.empty_like(x2)
    rstd = x2.new_empty(x2.shape[0], dtype=_stat_dtype(x))
    _C.rms_norm_forward(y, rstd, x2, _c(weight), eps, _c(residual).reshape(x2.shape), s,
                        _stream(x))
    return y.view(x.shape), s.view(x.shape), rstd


@_add_rms_norm.register_fake
def _(x, residual, weight, eps):
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    return y, torch.empty_like(y), x.new_empty(x.numel() // x.shape[-1], dtype=_stat_dtype(x))


@_op("rms_norm_backward")
def _rms_norm_backward(dy: Tensor, x: Tensor, weight: Tensor, rstd: Tensor, need_dw: bool,
                       dres: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    # dres: a gradient reaching x by another path (the residual stream), added to dx in-kernel
    x2 = _c(x).reshape(-1, x.shape[-1])
    dx = torch.empty_like(x2)
    dw = torch.empty_like(weight, memory_format=torch.contiguous_format) if need_dw else \
        weight.new_empty(0)
    ws = None
    if need_dw and x.is_cuda:
        ws = torch.empty(_C.rms_norm_backward_workspace(x2), dtype=torch.uint8, device=x.device)
    _C.rms_norm_backward(dx, dw if need_dw else None, _c(dy).reshape(x2.shape), x2,
                         _c(weight), _c(rstd), ws,
                         None if dres is None else _c(dres).reshape(x2.shape), _stream(x))
    return dx.view(x.shape), dw


@_rms_norm_backward.register_fake
def _(dy, x, weight, rstd, need_dw, dres=None):
    dx = torch.empty_like(x, memory_format=torch.contiguous_format)
    return dx, (torch.empty_like(weight, memory_format=torch.contiguous_format)
                if need_dw else weight.new_empty(0))


def _rms_norm_setup(ctx, inputs, output):
    x, weight, _ = inputs
    _, rstd = output
    ctx.save_for_backward(x, weight, rstd)


def _rms_norm_bwd(ctx, dy, _drstd):
    x, weight, rstd = ctx.saved_tensors
    dy = torch.zeros_like(x) if dy is None else dy
    need_dw = ctx.needs_input_grad[1]
    dx, dw = _rms_norm_backward(dy, x, weight, rstd, need_dw)
    return dx, dw if need_dw else None, None


_rms_norm.register_autograd(_rms_norm_bwd, setup_context=_rms_norm_setup)


def _add_rms_norm_setup(ctx, inputs, output):
    _, _, weight, _ = inputs
    _, s, rstd = output
    ctx.save_for_backward(s, weight, rstd)


def _add_rms_norm_bwd(ctx, dy, ds, _drstd):
    s, weight, rstd = ctx.saved_tensors
    dy = torch.zeros_like(s) if dy is None else dy
    need_dw = ctx.needs_input_grad[2]
    dsum, dw = _rms_norm_backward(dy, s, weight, rstd, need_dw, ds)
    return dsum, dsum, dw if need_dw else None, None


_add_rms_norm.register_autograd(_add_rms_norm_bwd, setup_context=_add_rms_norm_setup)


def rms_norm(x: Tensor, weight: Tensor, eps: float = 1e-6,
             residual: Optional[Tensor] = None) -> Union[Tensor, tuple[Tensor, Tensor]]:
    """x / sqrt(mean(x^2, -1) + eps) * weight over the last dimension.

    With residual: the pre-norm residual step, s = x + residual, returning (rms_norm(s), s)
    (the normalised input of the next block and the new residual stream) from one op.
    """
    _check_float("rms_norm", x=x, weight=weight, residual=residual)
    _check(x.dim() >= 1 and weight.shape == (x.shape[-1],),
           lambda: f"llmk.ops.rms_norm: weight is {tuple(weight.shape)}; x {tuple(x.shape)} needs "
           f"({x.shape[-1] if x.dim() else '?'},)")
    _check(eps >= 0 and math.isfinite(eps), lambda: f"llmk.ops.rms_norm: eps = {eps} must be >= 0")
    if residual is None:
        return _rms_norm(x, weight, float(eps))[0]
    _check(residual.shape == x.shape,
           lambda: f"llmk.ops.rms_norm: residual is {tuple(residual.shape)} but x {tuple(x.shape)}")
    y, s, _ = _add_rms_norm(x, residual, weight, float(eps))
    return y, s


class _RmsNormTee(torch.autograd.Function):
    """(rms_norm(x), x): a pre-norm block's input and the residual stream that bypasses the
    block; the gradients of the two meet in the norm's backward kernel instead of an add."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        y, rstd = _rms_norm(x, weight, eps)
        ctx.save_for_backward(x, weight, rstd)
        return y, x.view_as(x)

    @staticmethod
    def backward(ctx, dy, dskip):
        x, weight, rstd = ctx.saved_tensors
        dy = torch.zeros_like(x) if dy is None else dy
        need_dw = ctx.needs_input_grad[1]
        dx, dw = _rms_norm_backward(dy, x, weight, rstd, need_dw, dskip)
        return dx, dw if need_dw else None, None


def _rms_norm_tee(x: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """(rms_norm(x, weight, eps), x), for a decoder layer's first norm (llmk.hf); eager only."""
    return _RmsNormTee.apply(x, weight, float(eps))


class _SharedInputLinears(torch.autograd.Function):
    """x W_i^T + b_i for weights that share one input (q|k|v, gate|up). The backward adds the
    input gradients in the GEMMs (beta = 1) rather than in separate adds."""

    @staticmethod
    def forward(ctx, x, *wb):
        ws, bs = wb[0::2], wb[1::2]
        ctx.save_for_backward(x, *ws)
        ctx.has_bias = [b is not None for b in bs]
        return tuple(torch.nn.functional.linear(x, w, b) for w, b in zip(ws, bs))

    @staticmethod
    def backward(ctx, *grads):
        x, *ws = ctx.saved_tensors
        x2 = x.reshape(-1, x.shape[-1])
        dx, out = None, []
        for i, (g, w) in enumerate(zip(grads, ws)):
            dw = db = None
            if g is not None:
                g2 = g.reshape(-1, g.shape[-1])
                if ctx.needs_input_grad[0]:
                    dx = g2.mm(w) if dx is None else dx.addmm_(g2, w)
                if ctx.needs_input_grad[1 + 2 * i]:
                    dw = g2.t().mm(x2)
                if ctx.has_bias[i] and ctx.needs_input_grad[2 + 2 * i]:
                    db = g2.sum(0)
            out += [dw, db]
        return (None if dx is None else dx.view(x.shape), *out)


def _linears(x: Tensor, weights: Sequence[Tensor],
             biases: Sequence[Optional[Tensor]]) -> tuple[Tensor, ...]:
    """F.linear(x, w_i, b_i) for each weight, with one autograd node (llmk.hf); eager only."""
    return _SharedInputLinears.apply(x, *[t for wb in zip(weights, biases) for t in wb])


# ---------------------------------------------------------------------------------------------
# Gated activations

_ACTS = ("silu", "gelu", "gelu_tanh")


@_op("gated")
def _gated(gate: Tensor, up: Tensor, act: str) -> Tensor:
    out = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    _C.gated_forward(out, _c(gate), _c(up), act, _stream(gate))
    return out


@_gated.register_fake
def _(gate, up, act):
    return torch.empty_like(gate, memory_format=torch.contiguous_format)


@_op("gated_backward")
def _gated_backward(dout: Tensor, gate: Tensor, up: Tensor, act: str) -> tuple[Tensor, Tensor]:
    dgate = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    dup = torch.empty_like(dgate)
    _C.gated_backward(dgate, dup, _c(dout), _c(gate), _c(up), act, _stream(gate))
    return dgate, dup


@_gated_backward.register_fake
def _(dout, gate, up, act):
    g = torch.empty_like(gate, memory_format=torch.contiguous_format)
    return g, torch.empty_like(g)


def _gated_setup(ctx, inputs, output):
    gate, up, act = inputs
    ctx.save_for_backward(gate, up)
    ctx.act = act


def _gated_bwd(ctx, dout):
    gate, up = ctx.saved_tensors
    dgate, dup = _gated_backward(dout, gate, up, ctx.act)
    return dgate, dup, None


_gated.register_autograd(_gated_bwd, setup_context=_gated_setup)


def _gated_checked(op: str, gate: Tensor, up: Tensor, act: str) -> Tensor:
    _check_float(op, gate=gate, up=up)
    _check(gate.shape == up.shape,
           lambda: f"llmk.ops.{op}: gate is {tuple(gate.shape)} but up {tuple(up.shape)}")
    return _gated(gate, up, act)


def swiglu(gate: Tensor, up: Tensor) -> Tensor:
    """silu(gate) * up (the gated MLP of Llama, Qwen2, Phi-3)."""
    return _gated_checked("swiglu", gate, up, "silu")


def geglu(gate: Tensor, up: Tensor, approximate: str = "tanh") -> Tensor:
    """gelu(gate) * up; approximate "tanh" (Gemma's gelu_pytorch_tanh) or "none" (erf)."""
    _check(approximate in ("tanh", "none"),
           lambda: f"llmk.ops.geglu: approximate = {approximate!r}; 'tanh' or 'none'")
    return _gated_checked("geglu", gate, up, "gelu_tanh" if approximate == "tanh" else "gelu")


# ---------------------------------------------------------------------------------------------
# RoPE


@_op("rope_table")
def _rope_table(positions: Tensor, pairs: int, theta: float, freq_scale: float,
                factors: Optional[Tensor], dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    # The tables are made on the CPU (positions on the GPU are read back: pass cos_sin to keep
    # the GPU from waiting), in float64 there when the inputs are 16-bit.
    p = _c(positions).reshape(-1).to(device="cpu", dtype=torch.int64)
    tdt = torch.float64 if dtype in (torch.float16, torch.bfloat16) else dtype
    cos = torch.empty(p.shape[0], pairs, dtype=tdt)
    sin = torch.empty_like(cos)
    _C.rope_table(cos, sin, p, theta, freq_scale,
                  None if factors is None else _c(factors).cpu())
    cos = cos.to(device=positions.device, dtype=dtype)
    sin = sin.to(device=positions.device, dtype=dtype)
    return cos.view(*positions.shape, pairs), sin.view(*positions.shape, pairs)


@_rope_table.register_fake
def _(positions, pairs, theta, freq_scale, factors, dtype):
    cos = positions.new_empty(*positions.shape, pairs, dtype=dtype)
    return cos, torch.empty_like(cos)


@_op("rope_rotate")
def _rope_rotate(x: Tensor, cos: Tensor, sin: Tensor, half_split: bool,
                 inverse: bool) -> Tensor:
    y = torch.empty_like(x)  # x's layout, permuted or not
    _C.rope_rotate(y, _d(x), _d(cos), _d(sin), half_split, inverse, _stream(x))
    return y


@_rope_rotate.register_fake
def _(x, cos, sin, half_split, inverse):
    return torch.empty_like(x)


def _rope_setup(ctx, inputs, output):
    _, cos, sin, half_split, inverse = inputs
    ctx.save_for_backward(cos, sin)
    ctx.half_split, ctx.inverse = half_split, inverse


def _rope_bwd(ctx, dy):
    cos, sin = ctx.saved_tensors
    # The rotation is orthogonal: its backward rotates by the negative angle.
    return _rope_rotate(dy, cos, sin, ctx.half_split, not ctx.inverse), None, None, None, None


_rope_rotate.register_autograd(_rope_bwd, setup_context=_rope_setup)


def _llama3_factors(pairs: int, rot_dim: int, theta: float, s: dict) -> list[float]:
    """inv_freq divisors of Llama 3's rope scaling (as transformers computes them)."""
    factor = float(s["factor"])
    low, high = float(s.get("low_freq_factor", 1.0)), float(s.get("high_freq_factor", 4.0))
    old = float(s["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old / low, old / high
    out = []
    for i in range(pairs):
        inv = theta ** (-2.0 * i / rot_dim)
        wavelen = 2 * math.pi / inv
        if wavelen < high_wavelen:
            new = inv
        elif wavelen > low_wavelen:
            new = inv / factor
        else:
            smooth = (old / wavelen - low) / (high - low)
            new = (1 - smooth) * inv / factor + smooth * inv
        out.append(inv / new)
    return out


def rope_cos_sin(positions: Tensor, rot_dim: int, theta: float = 10000.0,
                 scaling: Optional[dict] = None,
                 dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
    """cos and sin tables [..., rot_dim // 2] for integer positions [...] (angles in double):
    angle = position * theta^(-2i / rot_dim), with Hugging Face's rope_scaling dict applied
    ("linear": positions / factor; "llama3": per-frequency factors; None or "default": none)."""
    _check(isinstance(positions, Tensor) and not positions.is_floating_point()
           and not positions.is_complex(),
           "llmk.ops.rope_cos_sin: positions must be an integer tensor")
    _check(rot_dim > 0 and rot_dim % 2 == 0,
           lambda: f"llmk.ops.rope_cos_sin: rot_dim = {rot_dim} must be even and > 0")
    _check(theta > 0 and math.isfinite(theta), lambda: f"llmk.ops.rope_cos_sin: theta = {theta}")
    pairs = rot_dim // 2
    freq_scale, factors = 1.0, None
    kind = None if scaling is None else scaling.get("rope_type", scaling.get("type"))
    if kind in (None, "default"):
        pass
    elif kind == "linear":
        freq_scale = 1.0 / float(scaling["factor"])
    elif kind == "llama3":
        factors = torch.tensor(_llama3_factors(pairs, rot_dim, theta, scaling),
                               dtype=torch.float64, device=positions.device)
    else:
        raise Error(f"llmk.ops.rope_cos_sin: rope scaling {kind!r} is not supported "
                    "(linear, llama3)")
    return _rope_table(positions, pairs, float(theta), freq_scale, factors, dtype)


def rope(q: Tensor, k: Tensor, cos_sin: Optional[tuple[Tensor, Tensor]] = None,
         positions: Optional[Tensor] = None, *, style: str = "neox",
         theta: float = 10000.0, rot_dim: Optional[int] = None,
         scaling: Optional[dict] = None, heads_first: bool = False) -> tuple[Tensor, Tensor]:
    """q and k rotated by their positions; returns (q_rot, k_rot) in the inputs' layouts.

    q: [batch, seq, heads, dim] (flash-attn's layout) or [seq, heads, dim]; with
    heads_first=True, [batch, heads, seq, dim] (Hugging Face's). k likewise, with its own heads.
    Either cos_sin = (cos, sin), each [seq, rot_dim // 2] or [batch, seq, rot_dim // 2] (one
    value per rotated pair; Hugging Face's duplicated [.., dim] tables: take [..., :dim // 2]),
    or positions ([seq] or [batch, seq] integers) with theta and scaling (see rope_cos_sin).
    style "neox" rotates pairs (i, i + rot_dim/2) (Hugging Face Llama, Qwen2, Phi-3, Gemma),
    "interleaved" pairs (2i, 2i+1) (GPT-J, Meta's checkpoints). Dims past rot_dim (default:
    all) are passed through.
    """
    _check(style in ("neox", "interleaved"),
           lambda: f"llmk.ops.rope: style = {style!r}; 'neox' or 'interleaved'")
    _check_float("rope", q=q, k=k)
    _check(q.dim() in (3, 4) and k.dim() == q.dim(),
           lambda: f"llmk.ops.rope: q {tuple(q.shape)} and k {tuple(k.shape)} must both be "
           "3-D or 4-D")
    D = q.shape[-1]
    _check(k.shape[-1] == D, lambda: f"llmk.ops.rope: q's head dim {D} but k's {k.shape[-1]}")

    def as_bshd(t: Tensor) -> Tensor:
        if t.dim() == 3:
            return t.unsqueeze(0) if not heads_first else t.unsqueeze(0).transpose(1, 2)
        return t.transpose(1, 2) if heads_first else t

    q4, k4 = as_bshd(q), as_bshd(k)
    _check(q4.shape[:2] == k4.shape[:2],
           lambda: f"llmk.ops.rope: q {tuple(q.shape)} and k {tuple(k.shape)} differ in batch "
           "or seq")
    S = q4.shape[1]
    if cos_sin is not None:
        _check(positions is None, "llmk.ops.rope: give cos_sin or positions, not both")
        cos, sin = cos_sin
        _check_float("rope", q=q, cos=cos, sin=sin)
        R = cos.shape[-1]
        _check(rot_dim is None or rot_dim == 2 * R,
               lambda: f"llmk.ops.rope: rot_dim = {rot_dim} but cos has {R} pairs")
    else:
        _check(positions is not None, "llmk.ops.rope: give cos_sin or positions")
        rd = D if rot_dim is None else int(rot_dim)
        _check(0 < rd <= D and rd % 2 == 0,
               lambda: f"llmk.ops.rope: rot_dim = {rd} must be even, in (0, {D}]")
        cos, sin = rope_cos_sin(positions, rd, theta, scaling, q.dtype)
        R = rd // 2
    _check(2 * R <= D, lambda: f"llmk.ops.rope: cos has {R} pairs; head dim {D} holds {D // 2}")
    if cos.dim() == 2:
        cos, sin = cos.unsqueeze(0), sin.unsqueeze(0)
    _check(cos.dim() == 3 and cos.shape[1] == S and cos.shape[0] in (1, q4.shape[0])
           and sin.shape == cos.shape,
           lambda: f"llmk.ops.rope: cos {tuple(cos.shape)} does not fit {S} positions of batch "
           f"{q4.shape[0]} (expected [seq, {R}] or [batch, seq, {R}])")
    if cos.stride(-1) != 1:
        cos = cos.contiguous()
    if sin.stride() != cos.stride():
        cos, sin = cos.contiguous(), sin.contiguous()
    half = style == "neox"
    qr = _rope_rotate(q4, cos, sin, half, False)
    kr = _rope_rotate(k4, cos, sin, half, False)

    def back(t: Tensor, like: Tensor) -> Tensor:
        if like.dim() == 3:
            return t.squeeze(0) if not heads_first else t.transpose(1, 2).squeeze(0)
        return t.transpose(1, 2) if heads_first else t

    return back(qr, q), back(kr, k)


# ---------------------------------------------------------------------------------------------
# Flash attention


@_op("flash_attn")
def _flash_attn(q: Tensor, k: Tensor, v: Tensor, cu_q: Tensor, cu_k: Tensor, scale: float,
                causal: bool, window_left: int, window_right: int, softcap: float,
                max_seqlen_k: int, deterministic: bool) -> tuple[Tensor, Tensor]:
    # deterministic: for the backward (which takes the forward's arguments)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = q.new_empty(q.shape[1], q.shape[0], dtype=_lse_dtype(q))
    _C.flash_attention_forward(out, lse, _c(q), _c(k), _c(v), _c(cu_q), _c(cu_k), scale, causal,
                               window_left, window_right, softcap, max_seqlen_k, _stream(q))
    return out, lse


@_flash_attn.register_fake
def _(q, k, v, cu_q, cu_k, scale, causal, window_left, window_right, softcap, max_seqlen_k,
      deterministic):
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            q.new_empty(q.shape[1], q.shape[0], dtype=_lse_dtype(q)))


@_op("flash_attn_backward")
def _flash_attn_backward(dout: Tensor, dlse: Optional[Tensor], q: Tensor, k: Tensor, v: Tensor,
                         out: Tensor, lse: Tensor, cu_q: Tensor, cu_k: Tensor, scale: float,
                         causal: bool, window_left: int, window_right: int, softcap: float,
                         max_seqlen_k: int, deterministic: bool) -> tuple[Tensor, Tensor, Tensor]:
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty_like(dk)
    ws = None
    if q.is_cuda:
        ws = torch.empty(_C.flash_attention_backward_workspace(q, cu_q.shape[0] - 1),
                         dtype=torch.uint8, device=q.device)
    _C.flash_attention_backward(dq, dk, dv, _c(dout), None if dlse is None else _c(dlse), _c(q),
                                _c(k), _c(v), _c(out), _c(lse), _c(cu_q), _c(cu_k), scale,
                                causal, window_left, window_right, softcap, max_seqlen_k,
                                deterministic, ws, _stream(q))
    return dq, dk, dv


@_flash_attn_backward.register_fake
def _(dout, dlse, q, k, v, out, lse, cu_q, cu_k, scale, causal, window_left, window_right,
      softcap, max_seqlen_k, deterministic):
    dq = torch.empty_like(q, memory_format=torch.contiguous_format)
    dk = torch.empty_like(k, memory_format=torch.contiguous_format)
    return dq, dk, torch.empty_like(dk)


def _flash_setup(ctx, inputs, output):
    q, k, v, cu_q, cu_k, *params = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
    ctx.params = params


def _flash_bwd(ctx, dout, dlse):
    q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
    dout = torch.zeros_like(out) if dout is None else dout
    dq, dk, dv = _flash_attn_backward(dout, dlse, q, k, v, out, lse, cu_q, cu_k, *ctx.params)
    return dq, dk, dv, None, None, None, None, None, None, None, None, None


_flash_attn.register_autograd(_flash_bwd, setup_context=_flash_setup)


_offsets_cache: dict = {}


def _offsets(B: int, S: int, device: torch.device) -> Tensor:
    """[0, S, 2 S, ..., B S] as int32 on device: the offsets of B sequences of S tokens, made
    once per (B, S, device) outside torch.compile (a small cache: they are read-only)."""
    if torch.compiler.is_compiling():
        return torch.arange(B + 1, dtype=torch.int32, device=device) * S
    key = (B, S, device)
    t = _offsets_cache.get(key)
    if t is None:
        if len(_offsets_cache) >= 64:
            _offsets_cache.clear()
        t = _offsets_cache[key] = torch.arange(B + 1, dtype=torch.int32, device=device) * S
    return t


def _window(window, causal: bool) -> tuple[int, int]:
    if window is None:
        return -1, -1
    if isinstance(window, int):
        _check(window >= 1, lambda: f"llmk.ops.flash_attn: window = {window} must be >= 1")
        return window - 1, (0 if causal else window - 1)
    _check(isinstance(window, (tuple, list)) and len(window) == 2
           and all(isinstance(w, int) and w >= -1 for w in window),
           lambda: f"llmk.ops.flash_attn: window = {window!r}; an int, or (left, right) with -1 "
           "for unbounded")
    return int(window[0]), int(window[1])


def flash_attn(q: Tensor, k: Tensor, v: Tensor, causal: bool = False,
               window: Union[None, int, Sequence[int]] = None, softcap: Optional[float] = None,
               scale: Optional[float] = None, cu_seqlens_q: Optional[Tensor] = None,
               cu_seqlens_k: Optional[Tensor] = None, max_seqlen_q: Optional[int] = None,
               max_seqlen_k: Optional[int] = None, return_lse: bool = False,
               deterministic: bool = False) -> Union[Tensor, tuple[Tensor, Tensor]]:
    """Attention in flash-attn's layout: q [batch, seq_q, heads_q, dim], k and v [batch, seq_k,
    heads_kv, dim] (heads_q a multiple of heads_kv: grouped-query attention), or, with
    cu_seqlens_q/k ([batch + 1] int32 running offsets), packed [total, heads, dim] sequences of
    different lengths. Returns out like q, and with return_lse also the log-sum-exp of each
    query's scores (float; [batch, heads_q, seq_q], or [heads_q, total_q] packed), which may
    carry a gradient too.

    causal: query i of a sequence sees keys up to i + seq_k - seq_q (bottom-right aligned, as
    flash-attn). window: int W, each query sees the W keys ending at its aligned position (and,
    not causal, the W - 1 after it); or (left, right) as flash-attn's window_size, -1
    unbounded. softcap: scores = softcap * tanh(scores / softcap). scale: default
    1/sqrt(dim). A query that sees no key gets zeros (and lse -inf). The backward gives dq, dk,
    dv (dk, dv summed over each query group). The CPU kernels are always deterministic; the
    CUDA backward adds dq's parts in no fixed order (its last bits may change from run to run)
    unless deterministic=True, which makes it add them key block by key block, the same bits on
    every run, at some cost in speed. Under CUDA autocast, float32 CUDA inputs are cast to
    autocast's dtype first, as SDPA does.
    """
    if q.is_cuda and torch.is_autocast_enabled("cuda"):
        dt = torch.get_autocast_dtype("cuda")
        q, k, v = (t.to(dt) if t.dtype == torch.float32 else t for t in (q, k, v))
    _check_float("flash_attn", q=q, k=k, v=v)
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    nd = 3 if varlen else 4
    layout = "[total, heads, dim]" if varlen else "[batch, seq, heads, dim]"
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check(t.dim() == nd, lambda: f"llmk.ops.flash_attn: {name} is {tuple(t.shape)}; {layout} "
               f"expected{' (cu_seqlens given)' if varlen else ''}")
    _check(k.shape == v.shape,
           lambda: f"llmk.ops.flash_attn: k {tuple(k.shape)} but v {tuple(v.shape)}")
    D, Hq, Hkv = q.shape[-1], q.shape[-2], k.shape[-2]
    _check(k.shape[-1] == D, lambda: f"llmk.ops.flash_attn: q's head dim {D} but k's {k.shape[-1]}")
    _check(Hkv > 0 and Hq % Hkv == 0,
           lambda: f"llmk.ops.flash_attn: {Hq} query heads are not a multiple of {Hkv} key heads")
    if softcap is not None:
        _check(softcap >= 0 and math.isfinite(softcap),
               lambda: f"llmk.ops.flash_attn: softcap = {softcap} must be >= 0")
    if scale is not None:
        _check(scale > 0 and math.isfinite(scale),
               lambda: f"llmk.ops.flash_attn: scale = {scale} must be > 0")
    left, right = _window(window, causal)
    params = (float(scale or 1.0 / math.sqrt(D)), bool(causal), left, right, float(softcap or 0.0))
    det = bool(deterministic)
    if varlen:
        _check(cu_seqlens_q is not None and cu_seqlens_k is not None,
               "llmk.ops.flash_attn: give both cu_seqlens_q and cu_seqlens_k")
        for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
            _check(isinstance(cu, Tensor) and cu.dtype == torch.int32 and cu.dim() == 1,
                   lambda: f"llmk.ops.flash_attn: {name} must be a 1-D int32 tensor")
        _check(cu_seqlens_q.device == q.device and cu_seqlens_k.device == q.device,
               "llmk.ops.flash_attn: cu_seqlens_q/k must be on q's device")
        if not torch.compiler.is_compiling():
            # On the CPU the kernels check the offsets themselves; here the lengths are checked
            # against the maxima given (reading them waits for the GPU, as flash-attn's callers
            # know the maxima, they pass them).
            for name, m, cu in (("max_seqlen_q", max_seqlen_q, cu_seqlens_q),
                                ("max_seqlen_k", max_seqlen_k, cu_seqlens_k)):
                if m is not None and cu.numel() > 1 and not q.is_cuda:
                    _check(int(cu.diff().max()) <= m,
                           lambda: f"llmk.ops.flash_attn: a sequence is longer than {name} = {m}")
        if max_seqlen_k is None:
            _check(not torch.compiler.is_compiling() or not q.is_cuda,
                   "llmk.ops.flash_attn: give max_seqlen_k with cu_seqlens under torch.compile")
            max_seqlen_k = int(cu_seqlens_k.diff().max()) if cu_seqlens_k.numel() > 1 else 0
        out, lse = _flash_attn(q, k, v, cu_seqlens_q, cu_seqlens_k, *params, int(max_seqlen_k),
                               det)
        return (out, lse) if return_lse else out
    B, Sq, Sk = q.shape[0], q.shape[1], k.shape[1]
    _check(k.shape[0] == B, lambda: f"llmk.ops.flash_attn: q has batch {B} but k {k.shape[0]}")
    cu_q, cu_k = _offsets(B, Sq, q.device), _offsets(B, Sk, q.device)
    out, lse = _flash_attn(q.reshape(B * Sq, Hq, D), k.reshape(B * Sk, Hkv, D),
                           v.reshape(B * Sk, Hkv, D), cu_q, cu_k, *params, Sk, det)
    out = out.view(B, Sq, Hq, D)
    return (out, lse.view(Hq, B, Sq).transpose(0, 1)) if return_lse else out


# ---------------------------------------------------------------------------------------------
# Linear with its activation


@_op("linear_act")
def _linear_act(x: Tensor, weight: Tensor, bias: Optional[Tensor], act: str,
                keep_z: bool) -> tuple[Tensor, Tensor]:
    """(y, z): z the pre-activation the backward reads, or an empty tensor without keep_z."""
    x2 = _c(x).reshape(-1, x.shape[-1])
    N = weight.shape[0]
    y = x2.new_empty(x2.shape[0], N)
    z = torch.empty_like(y) if keep_z else y.new_empty(0)
    _C.linear_act_forward(y, z if keep_z else None, x2, _c(weight),
                          None if bias is None else _c(bias), act, _stream(x))
    return y.view(*x.shape[:-1], N), z


@_linear_act.register_fake
def _(x, weight, bias, act, keep_z):
    N = weight.shape[0]
    rows = x.numel() // x.shape[-1]
    return x.new_empty(*x.shape[:-1], N), x.new_empty(rows, N) if keep_z else x.new_empty(0)


@_op("linear_act_backward")
def _linear_act_backward(dy: Tensor, x: Tensor, weight: Tensor, z: Tensor, act: str,
                         need_dx: bool, need_dw: bool,
                         need_db: bool) -> tuple[Tensor, Tensor, Tensor]:
    x2 = _c(x).reshape(-1, x.shape[-1])
    N, K = weight.shape
    dx = torch.empty_like(x2) if need_dx else x2.new_empty(0)
    dw = torch.empty_like(weight, memory_format=torch.contiguous_format) if need_dw else \
        weight.new_empty(0)
    db = weight.new_empty(N) if need_db else weight.new_empty(0)
    dz = torch.empty_like(z) if x.is_cuda else None
    _C.linear_act_backward(dx if need_dx else None, dw if need_dw else None,
                           db if need_db else None, _c(dy).reshape(-1, N), x2, _c(weight), _c(z),
                           act, dz, _stream(x))
    return (dx.view(x.shape) if need_dx else dx), dw, db


@_linear_act_backward.register_fake
def _(dy, x, weight, z, act, need_dx, need_dw, need_db):
    N = weight.shape[0]
    return (torch.empty_like(x, memory_format=torch.contiguous_format) if need_dx
            else x.new_empty(0),
            torch.empty_like(weight, memory_format=torch.contiguous_format) if need_dw
            else weight.new_empty(0),
            weight.new_empty(N) if need_db else weight.new_empty(0))


def _linear_act_setup(ctx, inputs, output):
    x, weight, bias, act, _keep_z = inputs
    _, z = output
    ctx.save_for_backward(x, weight, z)
    ctx.act = act
    ctx.has_bias = bias is not None


def _linear_act_bwd(ctx, dy, _dz):
    x, weight, z = ctx.saved_tensors
    need = ctx.needs_input_grad
    need_db = ctx.has_bias and need[2]
    dx, dw, db = _linear_act_backward(dy, x, weight, z, ctx.act, need[0], need[1], need_db)
    return (dx if need[0] else None, dw if need[1] else None, db if need_db else None, None,
            None)


_linear_act.register_autograd(_linear_act_bwd, setup_context=_linear_act_setup)


def linear_act(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None,
               act: str = "gelu") -> Tensor:
    """act(x @ weight.T + bias), as torch.nn.functional.linear then the activation, in one op.

    x: [..., in]; weight: [out, in]; bias: optional [out]. act: "gelu" (erf), "gelu_tanh",
    "silu" or "none". The backward reads the pre-activation the forward kept.
    """
    if act not in _ACTS and act != "none":
        raise Error(f"llmk.ops.linear_act: act = {act!r}; one of gelu, gelu_tanh, silu, none")
    _check_float("linear_act", x=x, weight=weight, bias=bias)
    if not (weight.dim() == 2 and x.dim() >= 1 and weight.shape[1] == x.shape[-1]):
        raise Error(f"llmk.ops.linear_act: x is {tuple(x.shape)} but weight "
                    f"{tuple(weight.shape)}; weight must be [out, in]")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise Error(f"llmk.ops.linear_act: bias is {tuple(bias.shape)}, expected "
                    f"({weight.shape[0]},)")
    # The pre-activation is kept only where a backward may read it.
    keep_z = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (x, weight, bias))
    return _linear_act(x, weight, bias, act, keep_z)[0]


# ---------------------------------------------------------------------------------------------
# Diversity


def _diversity_workspace(x: Tensor) -> Optional[Tensor]:
    """The CUDA kernels' scratch (None on the CPU)."""
    if not x.is_cuda:
        return None
    return torch.empty(_C.cosine_diversity_workspace(x), dtype=torch.uint8, device=x.device)


@_op("cosine_diversity")
def _cosine_diversity(x: Tensor, rows: bool) -> Tensor:
    x = _c(x)
    out = x.new_empty(x.shape[0] if rows else 1, dtype=_stat_dtype(x))
    _C.cosine_diversity_forward(out, x, rows, _diversity_workspace(x), _stream(x))
    return out


@_cosine_diversity.register_fake
def _(x, rows):
    return x.new_empty(x.shape[0] if rows else 1, dtype=_stat_dtype(x))


@_op("cosine_diversity_backward")
def _cosine_diversity_backward(dout: Tensor, x: Tensor, rows: bool) -> Tensor:
    x = _c(x)
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _C.cosine_diversity_backward(dx, _c(dout).to(_stat_dtype(x)), x, rows,
                                 _diversity_workspace(x), _stream(x))
    return dx


@_cosine_diversity_backward.register_fake
def _(dout, x, rows):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _cosine_diversity_setup(ctx, inputs, output):
    x, rows = inputs
    ctx.save_for_backward(x)
    ctx.rows = rows


def _cosine_diversity_bwd(ctx, dout):
    (x,) = ctx.saved_tensors
    return _cosine_diversity_backward(dout, x, ctx.rows), None


_cosine_diversity.register_autograd(_cosine_diversity_bwd, setup_context=_cosine_diversity_setup)


def pairwise_cosine_diversity(embeddings: Tensor, reduction: str = "mean") -> Tensor:
    """Pairwise cosine diversity of N embeddings [N, d] in O(N d), exact (the sum of the
    normalised rows gives every pair's dot product in total): reduction "mean", a scalar, the
    mean over ordered pairs i != j of 1 - cos(e_i, e_j); "rows", [N], each row's mean distance
    to the others. A zero row has cosine 0 with every row (distance 1) and a zero gradient; with
    fewer than two rows there are no pairs and the result is 0. Forward and backward; float32 or
    float64 on the CPU, bf16, fp16 or float32 on CUDA (the result float32 for 16-bit rows)."""
    _check(reduction in ("mean", "rows"),
           lambda: f"llmk.ops.pairwise_cosine_diversity: reduction = {reduction!r}; 'mean' or "
           "'rows'")
    _check_float("pairwise_cosine_diversity", embeddings=embeddings)
    _check(embeddings.dim() == 2,
           lambda: f"llmk.ops.pairwise_cosine_diversity: embeddings is {tuple(embeddings.shape)}; "
           "[N, d] expected")
    out = _cosine_diversity(embeddings, reduction == "rows")
    return out if reduction == "rows" else out.reshape(())


def _unit_rows(x: Tensor) -> Tensor:
    """x's rows over their norms, in x's dtype (the norms and their reciprocals in float32 at
    least; zero rows stay zero: cosine 0 with every row)."""
    acc = torch.promote_types(x.dtype, torch.float32)
    n = torch.linalg.vector_norm(x, dim=1, keepdim=True, dtype=acc)
    r = torch.where(n > 0, 1 / torch.where(n > 0, n, torch.ones_like(n)), torch.zeros_like(n))
    return (x * r).to(x.dtype)


def _check_embeddings(op: str, embeddings: Tensor) -> None:
    _check_float(op, embeddings=embeddings)
    _check(embeddings.dim() == 2,
           lambda: f"llmk.ops.{op}: embeddings is {tuple(embeddings.shape)}; [N, d] expected")


def pairwise_cosine_distance(embeddings: Tensor) -> Tensor:
    """The N x N matrix of 1 - cos(e_i, e_j) for embeddings [N, d], in their dtype, as one matmul
    of the normalised rows whose epilogue adds the 1 (torch.addmm with a bias row, alpha -1:
    cuBLASLt's bias epilogue, on tensor cores, for 16-bit CUDA tensors), differentiable. A zero
    row has cosine 0 with every row, itself included (distance 1). Memory: N x N; for each
    row's nearest rows without it, cosine_topk."""
    _check_embeddings("pairwise_cosine_distance", embeddings)
    u = _unit_rows(embeddings)
    ones = torch.ones(u.shape[0], dtype=u.dtype, device=u.device)
    return torch.addmm(ones, u, u.T, alpha=-1)


def cosine_topk(embeddings: Tensor, k: int, chunk_rows: Optional[int] = None
                ) -> tuple[Tensor, Tensor]:
    """Each row's k nearest other rows by cosine distance, without the N x N matrix: (distances
    [N, k] ascending, indices [N, k] int64). Chunks of chunk_rows rows (default: 64 MiB of
    similarities at a time) are multiplied against all rows and reduced by torch.topk; the
    distances are differentiable. A row is never its own neighbour; k must be below N."""
    _check_embeddings("cosine_topk", embeddings)
    N = embeddings.shape[0]
    _check(isinstance(k, int) and 0 < k < N,
           lambda: f"llmk.ops.cosine_topk: k = {k!r}; an int in [1, {N - 1}] for {N} rows")
    u = _unit_rows(embeddings)
    step = chunk_rows or max(1, (64 << 20) // max(N * u.element_size(), 1))
    dist, idx = [], []
    for r0 in range(0, N, step):
        r1 = min(N, r0 + step)
        sim = u[r0:r1] @ u.T
        rows = torch.arange(r0, r1, device=u.device)
        sim = sim.index_put((rows - r0, rows), torch.tensor(-math.inf, dtype=sim.dtype,
                                                            device=sim.device))
        v, i = torch.topk(sim, k, dim=1)
        dist.append(1 - v)
        idx.append(i)
    return torch.cat(dist), torch.cat(idx)


# ---------------------------------------------------------------------------------------------
# Distillation losses

_DIVERGENCES = ("kl", "reverse_kl", "jsd")
_REDUCTIONS = ("batchmean", "sum", "mean", "none")


def _scale_dtype(t: Tensor) -> torch.dtype:
    """The dtype of the kernels' scale factors: float32 on CUDA, t's own on the CPU."""
    return torch.float32 if t.is_cuda else t.dtype


def _grad_scale(rows: int, V: int, labels: Optional[Tensor], ignore_index: int, reduction: str,
                like: Tensor) -> Optional[Tensor]:
    """The reduction's factor of each row's gradient, as one value on the device (no host
    synchronisation: the count of rows not ignored stays there); None for 1."""
    if reduction in ("sum", "none"):
        return None
    per_row = V if reduction == "mean" else 1
    dt = _scale_dtype(like)
    if labels is None:
        return torch.full((1,), 1.0 / max(rows * per_row, 1), dtype=dt, device=like.device)
    n = (labels != ignore_index).sum().to(dt) * per_row
    return (1.0 / n.clamp(min=1.0)).reshape(1)


@_op("distill_loss")
def _distill(student: Tensor, teacher: Tensor, labels: Optional[Tensor], loss: str, beta: float,
             temperature: float, alpha: float, ignore_index: int, reduction: str,
             want_grad: bool) -> tuple[Tensor, Tensor]:
    """(the reduced loss, d loss / d student formed alongside, or an empty tensor)."""
    V = student.shape[-1]
    s2, t2 = _c(student).reshape(-1, V), _c(teacher).reshape(-1, V)
    rows = s2.shape[0]
    lab = None if labels is None else _c(labels).reshape(-1)
    per_row = s2.new_empty(rows, dtype=_stat_dtype(s2))
    scale = _grad_scale(rows, V, lab, ignore_index, reduction, s2)
    grad = torch.empty_like(s2) if want_grad else s2.new_empty(0)
    _C.distill_forward(per_row, grad if want_grad else None, s2, t2, lab, loss, beta,
                       temperature, alpha, ignore_index, scale, _stream(student))
    if reduction == "none":
        out = per_row.view(student.shape[:-1])
    elif reduction == "sum":
        out = per_row.sum()
    else:
        out = (per_row.sum() * scale.to(per_row.dtype)).reshape(())
    return out, grad


@_distill.register_fake
def _(student, teacher, labels, loss, beta, temperature, alpha, ignore_index, reduction,
      want_grad):
    dt = _stat_dtype(student)
    out = (student.new_empty(student.shape[:-1], dtype=dt) if reduction == "none"
           else student.new_empty((), dtype=dt))
    V = student.shape[-1]
    grad = (student.new_empty(student.numel() // V, V) if want_grad else student.new_empty(0))
    return out, grad


def _distill_setup(ctx, inputs, output):
    student, teacher, labels = inputs[:3]
    ctx.save_for_backward(output[1], student, teacher, labels)
    ctx.args = inputs[3:9]  # loss, beta, temperature, alpha, ignore_index, reduction
    ctx.shape = student.shape
    ctx.per_row = inputs[8] == "none"
    ctx.used = False


def _distill_bwd(ctx, dout, _dgrad):
    grad, student, teacher, labels = ctx.saved_tensors
    s = dout.reshape(-1).to(_scale_dtype(grad))
    if _traced(grad):  # out of place
        g = grad * (s.unsqueeze(1) if ctx.per_row else s).to(grad.dtype)
    else:
        if ctx.used:
            # A second backward through this forward (retain_graph, gradcheck): the first scaled
            # the gradient in place, so it is formed again.
            grad = _distill.raw(student, teacher, labels, *ctx.args, True)[1]
        ctx.used = True
        # The gradient was formed in the forward; scaled in place by the incoming one (rows whose
        # factor is exactly 1, the usual loss.backward(), are not touched on CUDA).
        _C.scale_rows(grad, s.contiguous(), _stream(grad))
        g = grad
    return (g.view(ctx.shape),) + (None,) * 9


_distill.register_autograd(_distill_bwd, setup_context=_distill_setup)


def distill_loss(student_logits: Tensor, teacher_logits: Tensor, *, loss: str = "kl",
                 beta: float = 0.5, temperature: float = 1.0, labels: Optional[Tensor] = None,
                 alpha: float = 0.0, ignore_index: int = -100,
                 reduction: str = "batchmean") -> Tensor:
    """Distillation loss between a student's and a teacher's logits [..., V], forward and the
    student's gradient in one pass (the gradient is formed during the forward; the teacher gets
    none: pass it detached).

    With q = softmax(student / T) and p = softmax(teacher / T) (T = temperature): loss "kl" is
    KL(p || q), "reverse_kl" KL(q || p), "jsd" beta KL(p || m) + (1 - beta) KL(q || m) with
    m = beta p + (1 - beta) q (beta 0 and 1 give "kl" and "reverse_kl", as in Liger Kernel).
    Each row's loss is (1 - alpha) T^2 D + alpha CE, CE the cross-entropy of softmax(student)
    with labels (temperature 1); T^2 keeps the soft term's gradients of one size across
    temperatures. Rows whose label is ignore_index add nothing. reduction: "batchmean" (the
    summed row losses over the rows not ignored), "sum", "mean" (over rows not ignored times V,
    torch's KLDivLoss "mean"), "none" (one loss per row). The loss is float32 for 16-bit logits.
    CPU: float32/float64; CUDA: bf16, fp16, float32, each row read once (docs/perf.md).
    """
    _check(loss in _DIVERGENCES,
           lambda: f"llmk.ops.distill_loss: loss = {loss!r}; one of kl, reverse_kl, jsd")
    _check(reduction in _REDUCTIONS,
           lambda: f"llmk.ops.distill_loss: reduction = {reduction!r}; one of batchmean, sum, "
           "mean, none")
    _check_float("distill_loss", student_logits=student_logits, teacher_logits=teacher_logits)
    _check(student_logits.shape == teacher_logits.shape and student_logits.dim() >= 1
           and student_logits.shape[-1] > 0,
           lambda: f"llmk.ops.distill_loss: student_logits {tuple(student_logits.shape)} and "
           f"teacher_logits {tuple(teacher_logits.shape)} must have one shape [..., V], V > 0")
    _check(not teacher_logits.requires_grad or not torch.is_grad_enabled(),
           "llmk.ops.distill_loss: teacher_logits requires grad, but the teacher gets no "
           "gradient here; pass teacher_logits.detach()")
    _check(temperature > 0 and math.isfinite(temperature),
           lambda: f"llmk.ops.distill_loss: temperature = {temperature} must be positive")
    _check(0.0 <= beta <= 1.0, lambda: f"llmk.ops.distill_loss: beta = {beta} must be in [0, 1]")
    _check(0.0 <= alpha <= 1.0,
           lambda: f"llmk.ops.distill_loss: alpha = {alpha} must be in [0, 1]")
    _check(alpha == 0.0 or labels is not None,
           lambda: f"llmk.ops.distill_loss: alpha = {alpha} mixes in the hard labels: pass labels")
    if labels is not None:
        _check(isinstance(labels, Tensor) and not labels.is_floating_point()
               and labels.shape == student_logits.shape[:-1]
               and labels.device == student_logits.device,
               lambda: f"llmk.ops.distill_loss: labels must be an integer tensor of shape "
               f"{tuple(student_logits.shape[:-1])} on {student_logits.device}")
        if labels.dtype != torch.int64:
            labels = labels.to(torch.int64)
    want_grad = torch.is_grad_enabled() and student_logits.requires_grad
    return _distill(student_logits, teacher_logits, labels, loss, float(beta),
                    float(temperature), float(alpha), int(ignore_index), reduction, want_grad)[0]


def _chunk_rows(rows: int, V: int, itemsize: int, chunk_rows: Optional[int]) -> int:
    """Rows per chunk of the fused losses: the caller's, else as many as keep one chunk of logits
    at 512 MiB."""
    if chunk_rows is not None:
        return max(1, min(rows, int(chunk_rows)))
    return max(1, min(rows, (512 << 20) // max(V * itemsize, 1)))


def _fused_distill_forward(sh, sw, sb, th, tw, tb, tl, labels, loss, beta, temperature, alpha,
                           ignore_index, reduction, chunk_rows, need, topk=None):
    """The loss of student logits sh @ sw^T + sb against the teacher's (tl, or th @ tw^T + tb;
    neither: the student's own, for the hard label alone), chunk by chunk over rows, with the
    gradients for sh, sw and sb formed on the way (need: which of the three): (loss, dh, dw, db),
    the gradients for an incoming gradient of 1."""
    BT, H = sh.shape
    V = sw.shape[0]
    dh = torch.empty_like(sh) if need[0] else None
    dw = torch.zeros_like(sw) if need[1] else None
    db = torch.zeros(V, dtype=_stat_dtype(sh), device=sh.device) if need[2] else None
    lab = None if labels is None else labels.reshape(-1)
    scale = _grad_scale(BT, V, lab, ignore_index, reduction, sh)
    per_row = sh.new_empty(BT, dtype=_stat_dtype(sh))
    step = _chunk_rows(BT, V, sh.element_size(), chunk_rows)
    stream = _stream(sh)
    for r0 in range(0, BT, step):
        r1 = min(BT, r0 + step)
        h = sh[r0:r1]
        logits = h @ sw.t() if sb is None else torch.addmm(sb, h, sw.t())
        if tl is not None:
            t = _c(tl[r0:r1])
        elif topk is not None:  # the top k logits in place, -inf (probability 0) elsewhere
            t = torch.full_like(logits, -math.inf)
            t.scatter_(1, topk[1][r0:r1], topk[0][r0:r1].to(t.dtype))
        elif th is not None:
            t = th[r0:r1] @ tw.t() if tb is None else torch.addmm(tb, th[r0:r1], tw.t())
        else:
            t = logits
        # The gradient for these logits replaces them (scaled by the reduction's factor).
        _C.distill_forward(per_row[r0:r1], logits if any(need) else None, logits, t,
                           None if lab is None else lab[r0:r1], loss, beta, temperature, alpha,
                           ignore_index, scale, stream)
        if dh is not None:
            torch.mm(logits, sw, out=dh[r0:r1])
        if dw is not None:
            dw.addmm_(logits.t(), h)
        if db is not None:
            db += logits.sum(0, dtype=db.dtype)
    out = per_row.sum() if reduction == "sum" else (per_row.sum() * scale.to(per_row.dtype))
    return out.reshape(()), dh, dw, None if db is None else db.to(sb.dtype)


class _FusedDistill(torch.autograd.Function):
    """The fused linear losses: everything is formed in the forward; the backward scales the
    gradients by the incoming one (a single value: reductions to a scalar only)."""

    @staticmethod
    def forward(ctx, sh, sw, sb, th, tw, tb, tl, labels, loss, beta, temperature, alpha,
                ignore_index, reduction, chunk_rows, need, topk):
        ctx.set_materialize_grads(False)
        out, dh, dw, db = _fused_distill_forward(
            sh.detach(), sw.detach(), None if sb is None else sb.detach(), th, tw, tb, tl, labels,
            loss, beta, temperature, alpha, ignore_index, reduction, chunk_rows, need, topk)
        ctx.save_for_backward(dh, dw, db)
        return out

    @staticmethod
    def backward(ctx, dout):
        dh, dw, db = ctx.saved_tensors
        if dout is None:
            return (None,) * 17

        def scaled(g):
            return None if g is None else g * dout.to(g.dtype)
        return (scaled(dh), scaled(dw), scaled(db)) + (None,) * 14


def _check_fused_inputs(op: str, hidden: Tensor, weight: Tensor, bias: Optional[Tensor]):
    _check_float(op, hidden=hidden, weight=weight, bias=bias)
    _check(hidden.dim() >= 1 and weight.dim() == 2 and hidden.shape[-1] == weight.shape[1],
           lambda: f"llmk.ops.{op}: hidden is {tuple(hidden.shape)} but weight "
           f"{tuple(weight.shape)}; weight must be [V, hidden's last dimension]")
    _check(bias is None or bias.shape == (weight.shape[0],),
           lambda: f"llmk.ops.{op}: bias must be [{weight.shape[0]}]")


def fused_linear_distill_loss(student_hidden: Tensor, student_weight: Tensor,
                              student_bias: Optional[Tensor] = None, *,
                              teacher_logits: Optional[Tensor] = None,
                              teacher_hidden: Optional[Tensor] = None,
                              teacher_weight: Optional[Tensor] = None,
                              teacher_bias: Optional[Tensor] = None,
                              teacher_topk=None, loss: str = "kl", beta: float = 0.5,
                              temperature: float = 1.0, labels: Optional[Tensor] = None,
                              alpha: float = 0.0, ignore_index: int = -100,
                              reduction: str = "batchmean",
                              chunk_rows: Optional[int] = None) -> Tensor:
    """distill_loss of the student's logits student_hidden @ student_weight^T (+ bias) against
    the teacher's (teacher_logits, or teacher_hidden @ teacher_weight^T + teacher_bias), without
    forming the logits of more than chunk_rows rows at a time (default: 512 MiB of logits): each
    chunk's logits come from a matmul (torch's, cuBLAS on CUDA), llmk's row kernel replaces them
    by their gradient, and two more matmuls add the chunk's share of the gradients for
    student_hidden, student_weight (accumulated in its dtype) and the bias. All of it happens in
    the forward; the backward scales them. Losses, temperature, labels, alpha and ignore_index as
    distill_loss; reduction "batchmean", "sum" or "mean" (a scalar). The teacher gets no
    gradient. teacher_topk = (values, indices), each [..., k]: a teacher known by its k largest
    logits only (as exported for offline distillation); its distribution is the softmax over
    those k (the tail gets probability 0), so "reverse_kl", infinite there, is refused. The values
    may be of any floating dtype (float32 as `llmk teacher-topk` writes them): each chunk rounds
    them to the student's dtype, as it does teacher logits.
    """
    op = "fused_linear_distill_loss"
    _check(loss in _DIVERGENCES,
           lambda: f"llmk.ops.{op}: loss = {loss!r}; one of kl, reverse_kl, jsd")
    _check(reduction in ("batchmean", "sum", "mean"),
           lambda: f"llmk.ops.{op}: reduction = {reduction!r}; one of batchmean, sum, mean "
           "(the gradients are formed for a scalar loss)")
    _check_fused_inputs(op, student_hidden, student_weight, student_bias)
    V = student_weight.shape[0]
    rows_shape = student_hidden.shape[:-1]
    topk = None
    if teacher_topk is not None:
        _check(teacher_logits is None and teacher_hidden is None and teacher_weight is None,
               f"llmk.ops.{op}: give the teacher one way: teacher_topk, teacher_logits, or "
               "teacher_hidden and teacher_weight")
        _check(isinstance(teacher_topk, (tuple, list)) and len(teacher_topk) == 2,
               f"llmk.ops.{op}: teacher_topk must be (values, indices)")
        vals, idx = teacher_topk
        _check(isinstance(vals, Tensor) and vals.is_floating_point()
               and vals.device == student_hidden.device,
               lambda: f"llmk.ops.{op}: teacher_topk values must be a floating-point tensor on "
               f"{student_hidden.device}")
        _check(isinstance(idx, Tensor) and idx.dtype == torch.int64 and idx.shape == vals.shape
               and vals.shape[:-1] == rows_shape and 1 <= vals.shape[-1] <= V
               and idx.device == vals.device,
               lambda: f"llmk.ops.{op}: teacher_topk must be values and int64 indices of one "
               f"shape {(*rows_shape, 'k')} with 1 <= k <= {V}")
        _check(loss != "reverse_kl",
               f"llmk.ops.{op}: reverse_kl with teacher_topk is infinite (the teacher's tail has "
               "probability 0); use kl or jsd")
        # One host synchronisation: an index outside [0, V) would fault the device's scatter.
        _check(idx.numel() == 0 or (int(idx.min()) >= 0 and int(idx.max()) < V),
               lambda: f"llmk.ops.{op}: teacher_topk indices must lie in [0, {V})")
        k = vals.shape[-1]
        topk = (_c(vals).reshape(-1, k), _c(idx).reshape(-1, k))
        tl = th = tw = tb = None
    elif teacher_logits is not None:
        _check(teacher_hidden is None and teacher_weight is None,
               f"llmk.ops.{op}: give the teacher as teacher_logits or as teacher_hidden and "
               "teacher_weight, not both")
        _check_float(op, student_hidden=student_hidden, teacher_logits=teacher_logits)
        _check(teacher_logits.shape == (*rows_shape, V),
               lambda: f"llmk.ops.{op}: teacher_logits is {tuple(teacher_logits.shape)}, "
               f"expected {(*rows_shape, V)}")
        tl = _c(teacher_logits).reshape(-1, V)
        th = tw = tb = None
    else:
        _check(teacher_hidden is not None and teacher_weight is not None,
               f"llmk.ops.{op}: the teacher is missing: teacher_logits, or teacher_hidden and "
               "teacher_weight")
        _check_fused_inputs(op, teacher_hidden, teacher_weight, teacher_bias)
        _check_float(op, student_hidden=student_hidden, teacher_hidden=teacher_hidden)
        _check(teacher_hidden.shape[:-1] == rows_shape and teacher_weight.shape[0] == V,
               lambda: f"llmk.ops.{op}: teacher_hidden {tuple(teacher_hidden.shape)} and "
               f"teacher_weight {tuple(teacher_weight.shape)} must give {(*rows_shape, V)} logits")
        tl = None
        th = _c(teacher_hidden).reshape(-1, teacher_hidden.shape[-1])
        tw, tb = _c(teacher_weight), None if teacher_bias is None else _c(teacher_bias)
    for name, t in (("teacher_logits", teacher_logits), ("teacher_hidden", teacher_hidden),
                    ("teacher_weight", teacher_weight), ("teacher_bias", teacher_bias),
                    ("teacher_topk values", teacher_topk[0] if topk is not None else None)):
        _check(t is None or not t.requires_grad or not torch.is_grad_enabled(),
               lambda: f"llmk.ops.{op}: {name} requires grad, but the teacher gets no gradient "
               f"here; pass {name}.detach()")
    _check(temperature > 0 and math.isfinite(temperature),
           lambda: f"llmk.ops.{op}: temperature = {temperature} must be positive")
    _check(0.0 <= beta <= 1.0 and 0.0 <= alpha <= 1.0,
           lambda: f"llmk.ops.{op}: beta = {beta} and alpha = {alpha} must be in [0, 1]")
    _check(alpha == 0.0 or labels is not None,
           lambda: f"llmk.ops.{op}: alpha = {alpha} mixes in the hard labels: pass labels")
    if labels is not None:
        _check(isinstance(labels, Tensor) and not labels.is_floating_point()
               and labels.shape == rows_shape and labels.device == student_hidden.device,
               lambda: f"llmk.ops.{op}: labels must be an integer tensor of shape "
               f"{tuple(rows_shape)} on {student_hidden.device}")
        labels = _c(labels).to(torch.int64)
    return _fused_linear(op, student_hidden, student_weight, student_bias, th, tw, tb, tl, labels,
                         loss, beta, temperature, alpha, ignore_index, reduction, chunk_rows, topk)


# The chunk loop is Python over matmuls and llmk's kernel: torch.compile runs it eagerly (a graph
# break; fullgraph=True refuses it).
@torch.compiler.disable
def _fused_linear(op, hidden, weight, bias, th, tw, tb, tl, labels, loss, beta, temperature, alpha,
                  ignore_index, reduction, chunk_rows, topk=None):
    grad_on = torch.is_grad_enabled()
    need = tuple(bool(grad_on and t is not None and t.requires_grad)
                 for t in (hidden, weight, bias))
    sh = _c(hidden).reshape(-1, hidden.shape[-1]) if not need[0] else \
        hidden.reshape(-1, hidden.shape[-1])
    return _FusedDistill.apply(sh.contiguous(), weight.contiguous(), bias, th, tw, tb, tl, labels,
                               loss, float(beta), float(temperature), float(alpha),
                               int(ignore_index), reduction, chunk_rows, need, topk)


def fused_linear_cross_entropy(hidden: Tensor, weight: Tensor, labels: Tensor,
                               bias: Optional[Tensor] = None, *, ignore_index: int = -100,
                               reduction: str = "mean",
                               chunk_rows: Optional[int] = None) -> Tensor:
    """Cross-entropy of the logits hidden @ weight^T (+ bias) with labels, chunked as
    fused_linear_distill_loss (which it is with alpha = 1): the logits of at most chunk_rows rows
    exist at once and the gradients are formed in the forward. reduction "mean" (over the rows
    not ignored, as torch's cross_entropy) or "sum"."""
    _check(reduction in ("mean", "sum"),
           lambda: f"llmk.ops.fused_linear_cross_entropy: reduction = {reduction!r}; 'mean' "
           "or 'sum'")
    _check(isinstance(labels, Tensor),
           "llmk.ops.fused_linear_cross_entropy: labels must be a tensor")
    op = "fused_linear_cross_entropy"
    _check_fused_inputs(op, hidden, weight, bias)
    _check(not labels.is_floating_point() and labels.shape == hidden.shape[:-1]
           and labels.device == hidden.device,
           lambda: f"llmk.ops.{op}: labels must be an integer tensor of shape "
           f"{tuple(hidden.shape[:-1])} on {hidden.device}")
    # The hard label alone (alpha = 1): the student's own logits stand in for the teacher's.
    return _fused_linear(op, hidden, weight, bias, None, None, None, None,
                         _c(labels).to(torch.int64), "kl", 0.5, 1.0, 1.0, ignore_index,
                         "batchmean" if reduction == "mean" else "sum", chunk_rows)


# ---------------------------------------------------------------------------------------------
# Attention transfer (MiniLM-style)


def _relations(q: Tensor, R: int) -> Tensor:
    """[B, S, H, D] -> [B, R, S, H D / R]: the heads concatenated and split into R relation heads
    (MiniLM v2), so that teacher and student may differ in head count and head dim."""
    B, S, H, D = q.shape
    return q.reshape(B, S, R, H * D // R).transpose(1, 2)


def _key_blocks(S: int, block: int):
    return [(j0, min(S, j0 + block)) for j0 in range(0, S, block)]


def _scores(q, k, scale, j0, j1, causal):
    """q [B, R, S, d] against keys j0..j1: scaled scores [B, R, S, j1 - j0], -inf above the
    causal diagonal."""
    a = (q @ k[:, :, j0:j1].transpose(-1, -2)) * scale
    if causal:
        i = torch.arange(q.shape[2], device=q.device).unsqueeze(1)
        j = torch.arange(j0, j1, device=q.device).unsqueeze(0)
        a = a.masked_fill(j > i, -math.inf)
    return a


def _finite(m: Tensor) -> Tensor:
    """m with -inf (a row with no key yet) as 0, to subtract from scores without NaN."""
    return torch.where(torch.isinf(m), torch.zeros_like(m), m)


def _rescale(m: Tensor, a: Tensor) -> tuple[Tensor, Tensor]:
    """The running maximum after the block a, and the factor the sums so far take."""
    new = torch.maximum(m, a.amax(-1))
    return new, torch.exp(m - _finite(new))


class _AttentionTransfer(torch.autograd.Function):
    """The torch path (where llmk's kernels do not apply): KL(teacher || student) of each query
    row's attention distribution, averaged over batch, relation heads and rows; keys in blocks,
    so no S x S matrix exists (forward: online log-sum-exps and the KL's weighted sum; backward:
    the blocks again)."""

    @staticmethod
    def forward(ctx, tq, tk, sq, sk, st, ss, causal, block):
        ctx.set_materialize_grads(False)
        shape = sq.shape[:3]
        m_t = torch.full(shape, -math.inf, dtype=sq.dtype, device=sq.device)
        z_t, w, m_s, z_s = (torch.zeros(shape, dtype=sq.dtype, device=sq.device),
                            torch.zeros(shape, dtype=sq.dtype, device=sq.device),
                            m_t.clone(), torch.zeros(shape, dtype=sq.dtype, device=sq.device))
        for j0, j1 in _key_blocks(sq.shape[2], block):
            a_t, a_s = _scores(tq, tk, st, j0, j1, causal), _scores(sq, sk, ss, j0, j1, causal)
            # Teacher: z = sum e^(a - m), w = sum e^(a - m) (a_t - a_s) (masked terms add 0).
            m_t, c = _rescale(m_t, a_t)
            e = torch.exp(a_t - _finite(m_t).unsqueeze(-1))
            diff = torch.where(e > 0, a_t - a_s, torch.zeros_like(a_t))
            z_t = z_t * c + e.sum(-1)
            w = w * c + (e * diff).sum(-1)
            m_s, c = _rescale(m_s, a_s)
            z_s = z_s * c + torch.exp(a_s - _finite(m_s).unsqueeze(-1)).sum(-1)
        lse_t, lse_s = m_t + z_t.log(), m_s + z_s.log()
        kl = w / z_t - lse_t + lse_s  # per row
        ctx.save_for_backward(tq, tk, sq, sk, lse_t, lse_s)
        ctx.params = (st, ss, causal, block)
        return kl.mean()

    @staticmethod
    def backward(ctx, dout):
        if dout is None:
            return (None,) * 8
        tq, tk, sq, sk, lse_t, lse_s = ctx.saved_tensors
        st, ss, causal, block = ctx.params
        g = dout / lse_s.numel()
        dq, dk = torch.zeros_like(sq), torch.zeros_like(sk)
        for j0, j1 in _key_blocks(sq.shape[2], block):
            p_t = torch.exp(_scores(tq, tk, st, j0, j1, causal) - lse_t.unsqueeze(-1))
            p_s = torch.exp(_scores(sq, sk, ss, j0, j1, causal) - lse_s.unsqueeze(-1))
            da = (p_s - p_t) * (g * ss)  # d loss / d (q k^T) of the student
            dq += da @ sk[:, :, j0:j1]
            dk[:, :, j0:j1] += da.transpose(-1, -2) @ sq
        return None, None, dq, dk, None, None, None, None


@_op("attention_transfer")
def _attention_transfer(tq: Tensor, tk: Tensor, sq: Tensor, sk: Tensor, relation_heads: int,
                        temperature: float, causal: bool) -> tuple[Tensor, Tensor, Tensor]:
    """llmk's kernels on [B, S, W] rows (the heads concatenated): (the mean KL over the B R S
    rows, lse_t, lse_s [B, R, S]); float32 statistics for 16-bit inputs."""
    B, S = sq.shape[:2]
    kl, lse_t, lse_s = (sq.new_empty((B, relation_heads, S), dtype=_stat_dtype(sq))
                        for _ in range(3))
    _C.attention_transfer_forward(kl, lse_t, lse_s, _c(tq), _c(tk), _c(sq), _c(sk),
                                  relation_heads, temperature, causal, _stream(sq))
    return kl.mean(), lse_t, lse_s


@_attention_transfer.register_fake
def _(tq, tk, sq, sk, relation_heads, temperature, causal):
    dt = _stat_dtype(sq)
    rows = (sq.shape[0], relation_heads, sq.shape[1])
    return sq.new_empty((), dtype=dt), sq.new_empty(rows, dtype=dt), sq.new_empty(rows, dtype=dt)


@_op("attention_transfer_backward")
def _attention_transfer_backward(dout: Tensor, tq: Tensor, tk: Tensor, sq: Tensor, sk: Tensor,
                                 lse_t: Tensor, lse_s: Tensor, relation_heads: int,
                                 temperature: float, causal: bool, want_dq: bool,
                                 want_dk: bool) -> tuple[Tensor, Tensor]:
    """(dq, dk) of the student's rows for the mean's gradient dout; an empty tensor for one not
    wanted."""
    dq, dk = (torch.empty(sq.shape, dtype=sq.dtype, device=sq.device) if want
              else sq.new_empty(0) for want in (want_dq, want_dk))
    _C.attention_transfer_backward(dq if want_dq else None, dk if want_dk else None,
                                   _c(dout).reshape(1).to(_stat_dtype(sq)), _c(tq), _c(tk),
                                   _c(sq), _c(sk), _c(lse_t), _c(lse_s), relation_heads,
                                   temperature, causal, _stream(sq))
    return dq, dk


@_attention_transfer_backward.register_fake
def _(dout, tq, tk, sq, sk, lse_t, lse_s, relation_heads, temperature, causal, want_dq, want_dk):
    return tuple(torch.empty_like(sq, memory_format=torch.contiguous_format) if want
                 else sq.new_empty(0) for want in (want_dq, want_dk))


def _attention_transfer_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:4], output[1], output[2])
    ctx.args = inputs[4:]  # relation_heads, temperature, causal


def _attention_transfer_bwd(ctx, dout, _dlse_t, _dlse_s):
    tq, tk, sq, sk, lse_t, lse_s = ctx.saved_tensors
    want_dq, want_dk = ctx.needs_input_grad[2], ctx.needs_input_grad[3]
    if dout is None or not (want_dq or want_dk):
        return (None,) * 7
    dq, dk = _attention_transfer_backward(dout, tq, tk, sq, sk, lse_t, lse_s, *ctx.args, want_dq,
                                          want_dk)
    return None, None, dq if want_dq else None, dk if want_dk else None, None, None, None


_attention_transfer.register_autograd(_attention_transfer_bwd,
                                      setup_context=_attention_transfer_setup)


def _transfer_unsupported(rows: Sequence[Tensor], R: int) -> str:
    """Why llmk's kernels do not take these contiguous [B, S, W] rows (teacher q, k, student q,
    k), or "" where they do: ops::attention_transfer_unsupported's conditions, from the tensors'
    metadata, which torch.compile can trace (a traced tensor's alignment from its storage
    offset)."""
    t0 = rows[0]
    if t0.shape[0] * t0.shape[1] == 0:
        return "no rows (B S = 0)"
    if t0.device.type == "cpu":
        return ("" if t0.dtype in (torch.float32, torch.float64)
                else f"the CPU kernel takes float32 or float64, not {t0.dtype}")
    if t0.device.type != "cuda":
        return f"llmk's kernels take CPU or CUDA tensors, not {t0.device.type}"
    if _C.attention_transfer_limits is None:
        return "llmk was built without CUDA kernels"
    if t0.dtype not in (torch.bfloat16, torch.float16):
        return f"the CUDA kernel takes bf16 or fp16, not {t0.dtype}"
    multiple, max_dt, max_ds = _C.attention_transfer_limits
    dt, ds = rows[0].shape[2] // R, rows[2].shape[2] // R
    if dt % multiple or ds % multiple:
        return (f"relation head dims {dt} (teacher) and {ds} (student): the CUDA kernel takes "
                f"multiples of {multiple}")
    if dt > max_dt or ds > max_ds:
        return (f"relation head dims {dt} (teacher) and {ds} (student): the CUDA kernel takes at "
                f"most {max_dt} and {max_ds}")
    for name, t in zip(("teacher_q", "teacher_k", "student_q", "student_k"), rows):
        at = t.storage_offset() * t.element_size() if _traced(t) else t.data_ptr()
        if at % 16:
            return f"{name} is not 16-byte aligned"
    return ""


def attention_transfer_loss(teacher_q: Tensor, teacher_k: Tensor, student_q: Tensor,
                            student_k: Tensor, temperature: float = 1.0, causal: bool = True,
                            relation_heads: Optional[int] = None, block: int = 256) -> Tensor:
    """Teacher-student attention transfer (MiniLM): the KL divergence KL(teacher || student)
    between each query's attention distributions softmax(q k^T / (sqrt(d) T)), averaged over
    batch, relation heads and query rows, with its gradient into student_q and student_k (the
    teacher gets none). Inputs [B, S, H, D] as flash_attn's (teacher and student share B and S).
    The heads of each side are concatenated and split into relation_heads heads (MiniLM v2;
    default: the smaller head count), which both sides' H D must divide: so teacher and student
    may differ in head count and head dim. No S x S matrix is formed, forward or backward. Causal
    masks are bottom-right aligned as flash_attn's (S x S here). The loss is float32 for 16-bit
    inputs.

    Kernels: float32/float64 CPU tensors run llmk's CPU kernel (sums in double); bf16/fp16 CUDA
    tensors its fused tensor-core kernel (fp32 accumulation; the gradient's dS rounded to the
    inputs' dtype) where the relation head dims H D / relation_heads are multiples of 8 and at
    most 256 and the data 16-byte aligned. Anything else (float32 CUDA tensors, other dims)
    runs torch ops with keys in blocks of `block` (which only that path reads), counted in
    stats() with the reason."""
    op = "attention_transfer_loss"
    _check_float(op, teacher_q=teacher_q, teacher_k=teacher_k, student_q=student_q,
                 student_k=student_k)
    for name, t in (("teacher_q", teacher_q), ("teacher_k", teacher_k),
                    ("student_q", student_q), ("student_k", student_k)):
        _check(t.dim() == 4, lambda: f"llmk.ops.{op}: {name} is {tuple(t.shape)}; "
               "[B, S, H, D] expected")
    _check(teacher_q.shape == teacher_k.shape and student_q.shape == student_k.shape
           and teacher_q.shape[:2] == student_q.shape[:2],
           lambda: f"llmk.ops.{op}: q and k of each side must match, and both sides share B and "
           f"S: teacher {tuple(teacher_q.shape)} / {tuple(teacher_k.shape)}, student "
           f"{tuple(student_q.shape)} / {tuple(student_k.shape)}")
    for name, t in (("teacher_q", teacher_q), ("teacher_k", teacher_k)):
        _check(not t.requires_grad or not torch.is_grad_enabled(),
               lambda: f"llmk.ops.{op}: {name} requires grad, but the teacher gets no gradient "
               f"here; pass {name}.detach()")
    _check(temperature > 0 and math.isfinite(temperature),
           lambda: f"llmk.ops.{op}: temperature = {temperature} must be positive")
    Ht, Hs = teacher_q.shape[2], student_q.shape[2]
    R = relation_heads if relation_heads is not None else min(Ht, Hs)
    wt, ws = Ht * teacher_q.shape[3], Hs * student_q.shape[3]
    _check(isinstance(R, int) and R > 0 and wt % R == 0 and ws % R == 0,
           lambda: f"llmk.ops.{op}: relation_heads = {R!r} must divide both sides' H D "
           f"({wt} and {ws})")
    _check(isinstance(block, int) and block > 0,
           lambda: f"llmk.ops.{op}: block = {block!r} must be a positive int")
    B, S = student_q.shape[:2]
    # [B, S, H D] rows (views where contiguous); the student's keep their autograd history.
    rows = [t.contiguous().reshape(B, S, t.shape[2] * t.shape[3])
            for t in (teacher_q.detach(), teacher_k.detach(), student_q, student_k)]
    reason = _transfer_unsupported(rows, R)
    if not reason:
        return _attention_transfer(*rows, R, float(temperature), bool(causal))[0]
    _count_python(op, "torch", reason)
    tq, tk = _relations(teacher_q.detach(), R), _relations(teacher_k.detach(), R)
    sq, sk = _relations(student_q, R), _relations(student_k, R)
    st = 1.0 / (math.sqrt(wt // R) * temperature)
    ss = 1.0 / (math.sqrt(ws // R) * temperature)
    loss = _AttentionTransfer.apply(tq, tk, sq, sk, st, ss, bool(causal), block)
    return loss.to(_stat_dtype(loss))


# ---------------------------------------------------------------------------------------------
# Teacher top-k files (llmk teacher-topk, llmk.LLM.teacher_topk)

_TOPK_DTYPES = {"I64": torch.int64, "I32": torch.int32, "F32": torch.float32}


def load_teacher_topk(path: str, device: Union[str, torch.device, None] = None) -> dict:
    """A teacher top-k file written by `llmk teacher-topk` or llmk.LLM.teacher_topk, as torch
    tensors: {"offsets" int64 [S + 1], "ids" int64 [P, k], "values" float32 [P, k], "lse"
    float32 [P], "tokens" int32 [P], "k", "vocab_size", "model"}. Sequence s holds rows
    offsets[s] .. offsets[s+1] - 1; row i of a sequence holds the teacher's logits after its
    token i (predicting token i + 1), descending; exp(values - lse) are their probabilities
    under the teacher's full softmax. (values[rows], ids[rows]) is the teacher_topk argument of
    fused_linear_distill_loss for the student's hidden states at those rows. The file is mapped,
    not read whole, when device is None (the CPU)."""
    import json
    import mmap
    with open(path, "rb") as f:
        head = f.read(8)
        _check(len(head) == 8, lambda: f"llmk.ops.load_teacher_topk: {path}: not a safetensors "
               "file (shorter than 8 bytes)")
        n = int.from_bytes(head, "little")
        _check(n <= 100_000_000, lambda: f"llmk.ops.load_teacher_topk: {path}: header of {n} "
               "bytes: not a safetensors file")
        try:
            header = json.loads(f.read(n))
        except ValueError as e:
            raise Error(f"llmk.ops.load_teacher_topk: {path}: malformed header ({e})") from None
        meta = header.pop("__metadata__", {}) if isinstance(header, dict) else {}
        _check(meta.get("format") == "llmk-teacher-topk",
               lambda: f"llmk.ops.load_teacher_topk: {path}: not a teacher top-k file (its "
               "metadata has no format = llmk-teacher-topk)")
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    out = {}
    for name in ("offsets", "ids", "values", "lse", "tokens"):
        info = header.get(name)
        _check(isinstance(info, dict) and info.get("dtype") in _TOPK_DTYPES,
               lambda: f"llmk.ops.load_teacher_topk: {path}: tensor {name!r} missing or of an "
               "unexpected dtype")
        dt = _TOPK_DTYPES[info["dtype"]]
        b, e = info["data_offsets"]
        count = (e - b) // torch.tensor([], dtype=dt).element_size()
        _check(8 + n + e <= len(mm) and math.prod(info["shape"]) == count,
               lambda: f"llmk.ops.load_teacher_topk: {path}: tensor {name!r} does not match its "
               "shape or lies past the end of the file")
        t = torch.frombuffer(mm, dtype=dt, count=count, offset=8 + n + b).reshape(info["shape"])
        out[name] = t if device is None else t.to(device)
    out["ids"] = out["ids"].to(torch.int64)
    out["k"] = int(meta.get("k", out["ids"].shape[-1]))
    out["vocab_size"] = int(meta.get("vocab_size", 0))
    out["model"] = meta.get("model", "")
    return out


# ---------------------------------------------------------------------------------------------
# Stats


_python_counts: dict[tuple[str, str, str], int] = {}


def _count_python(op: str, kernel: str, reason: str = "") -> None:
    """Counts a path chosen in Python (llmk.nn, llmk.hf) beside the C++ ops' counts."""
    key = (op, kernel, reason)
    _python_counts[key] = _python_counts.get(key, 0) + 1


def stats() -> list[dict]:
    """Which kernel ran how often per op since the last reset_stats() (process-wide): a list of
    {"op", "kernel", "calls", "reason"}, reason naming why a fallback or reference path ran
    ("" otherwise)."""
    rows = [{"op": op, "kernel": kernel, "calls": calls, "reason": reason}
            for op, kernel, reason, calls in _C.stats()]
    rows += [{"op": op, "kernel": kernel, "calls": calls, "reason": reason}
             for (op, kernel, reason), calls in sorted(_python_counts.items())]
    return rows


def reset_stats() -> None:
    _C.reset_stats()
    _python_counts.clear()
