"""torch.nn modules over llmk.ops.

    import llmk.nn
    norm = llmk.nn.RMSNorm(4096, eps=1e-5)
    mlp_up = llmk.nn.LinearSiLU(4096, 14336, bias=False)      # silu(x @ W^T) in one op
    attn = llmk.nn.FlashAttention(causal=True, window=4096)    # q, k, v: [batch, seq, heads, dim]
    llmk.nn.replace_linear_with_quantized(model, bits=8)       # forward-only int8 weights
    kd = llmk.nn.FusedLinearDistillLoss(loss="jsd", temperature=2.0)  # chunked, no full logits

Each module keeps its parameters like its torch counterpart (RMSNorm.weight, Linear.weight and
.bias), so state dicts load unchanged.
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

import torch
from torch import Tensor, nn

import llmk.ops as L

__all__ = ["RMSNorm", "FlashAttention", "LinearGELU", "LinearSiLU", "QuantizedLinear",
           "replace_linear_with_quantized", "DistillLoss", "FusedLinearDistillLoss",
           "FusedLinearCrossEntropyLoss"]


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * (offset + weight) over the last dimension; offset 1 is Gemma's
    form (weight stored as a difference from 1). forward(x, residual=None): with a residual, the
    pre-norm step: returns (norm(x + residual), x + residual)."""

    def __init__(self, dim: int, eps: float = 1e-6, offset: float = 0.0, device=None, dtype=None):
        super().__init__()
        init = torch.zeros if offset else torch.ones
        self.weight = nn.Parameter(init(dim, device=device, dtype=dtype))
        self.eps, self.offset = float(eps), float(offset)

    def forward(self, x: Tensor, residual: Optional[Tensor] = None):
        w = self.weight + self.offset if self.offset else self.weight
        return L.rms_norm(x, w.to(x.dtype), self.eps, residual=residual)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}" + (
            f", offset={self.offset}" if self.offset else "")


class FlashAttention(nn.Module):
    """llmk.ops.flash_attn with fixed settings: forward(q, k, v, cu_seqlens_q=None,
    cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None)."""

    def __init__(self, causal: bool = True, window: Union[None, int, Sequence[int]] = None,
                 softcap: Optional[float] = None, scale: Optional[float] = None,
                 deterministic: bool = False):
        super().__init__()
        self.causal, self.window, self.softcap, self.scale = causal, window, softcap, scale
        self.deterministic = deterministic

    def forward(self, q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Optional[Tensor] = None,
                cu_seqlens_k: Optional[Tensor] = None, max_seqlen_q: Optional[int] = None,
                max_seqlen_k: Optional[int] = None) -> Tensor:
        return L.flash_attn(q, k, v, causal=self.causal, window=self.window,
                            softcap=self.softcap, scale=self.scale, cu_seqlens_q=cu_seqlens_q,
                            cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                            max_seqlen_k=max_seqlen_k, deterministic=self.deterministic)

    def extra_repr(self) -> str:
        return (f"causal={self.causal}, window={self.window}, softcap={self.softcap}, "
                f"scale={self.scale}" + (", deterministic=True" if self.deterministic else ""))


class _LinearAct(nn.Linear):
    act = "none"

    def forward(self, x: Tensor) -> Tensor:
        return L.linear_act(x, self.weight, self.bias, self.act)


class LinearGELU(_LinearAct):
    """gelu(x @ W^T + b) as one op; approximate "none" (erf) or "tanh", as torch's GELU."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 approximate: str = "none", device=None, dtype=None):
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        if approximate not in ("none", "tanh"):
            raise ValueError(f"LinearGELU: approximate = {approximate!r}; 'none' or 'tanh'")
        self.act = "gelu" if approximate == "none" else "gelu_tanh"


class LinearSiLU(_LinearAct):
    """silu(x @ W^T + b) as one op."""

    act = "silu"


class QuantizedLinear(nn.Module):
    """A forward-only linear with weights stored as signed integers of `bits` (8 or 4) and one
    scale per group of `group_size` input columns (symmetric: scale = max|w| / (2^(bits-1) - 1)
    per group). Built from a weight with from_float(), or by replace_linear_with_quantized().

    The weight is dequantized for each call and the product runs on llmk.ops.linear_act: the
    reference path (llmk.ops.stats() lists it); GPU kernels reading the integers directly are
    not built yet. 4-bit values are kept one per int8 (not packed)."""

    def __init__(self, in_features: int, out_features: int, bits: int = 8,
                 group_size: int = 128, bias: bool = True, device=None,
                 dtype: torch.dtype = torch.float32):
        super().__init__()
        if bits not in (4, 8):
            raise ValueError(f"QuantizedLinear: bits = {bits}; 4 or 8")
        if group_size < 1:
            raise ValueError(f"QuantizedLinear: group_size = {group_size} must be >= 1")
        self.in_features, self.out_features = in_features, out_features
        self.bits, self.group_size = bits, group_size
        groups = -(-in_features // group_size)
        self.register_buffer("qweight", torch.zeros(out_features, in_features, dtype=torch.int8,
                                                    device=device))
        self.register_buffer("scales", torch.ones(out_features, groups, dtype=dtype,
                                                  device=device))
        self.bias = nn.Parameter(torch.zeros(out_features, dtype=dtype, device=device),
                                 requires_grad=False) if bias else None

    @classmethod
    def from_float(cls, linear: nn.Linear, bits: int = 8, group_size: int = 128):
        w = linear.weight.detach()
        q = cls(linear.in_features, linear.out_features, bits, group_size,
                linear.bias is not None, w.device, w.dtype)
        qmax = 2 ** (bits - 1) - 1
        pad = q.scales.shape[1] * group_size - linear.in_features
        wg = torch.nn.functional.pad(w.float(), (0, pad)).view(w.shape[0], -1, group_size)
        scale = wg.abs().amax(-1).clamp_min(torch.finfo(torch.float32).tiny) / qmax
        qw = torch.round(wg / scale.unsqueeze(-1)).clamp(-qmax, qmax).to(torch.int8)
        q.qweight.copy_(qw.view(w.shape[0], -1)[:, :linear.in_features])
        q.scales.copy_(scale.to(q.scales.dtype))
        if linear.bias is not None:
            q.bias.data.copy_(linear.bias.detach())
        return q

    def dequantize(self) -> Tensor:
        """The weight as the scales' dtype, [out, in]."""
        s = self.scales.repeat_interleave(self.group_size, dim=1)[:, :self.in_features]
        return self.qweight.to(s.dtype) * s

    def forward(self, x: Tensor) -> Tensor:
        L._count_python("QuantizedLinear", "reference",
                        "dequantized weights on llmk.ops.linear_act; no integer kernels yet")
        w = self.dequantize().to(x.dtype)
        b = None if self.bias is None else self.bias.to(x.dtype)
        return L.linear_act(x, w, b, "none")

    def extra_repr(self) -> str:
        return (f"{self.in_features}, {self.out_features}, bits={self.bits}, "
                f"group_size={self.group_size}, bias={self.bias is not None}")


def replace_linear_with_quantized(model: nn.Module, bits: int = 8, group_size: int = 128,
                                  skip: Sequence[str] = ("lm_head",)) -> nn.Module:
    """Replaces every nn.Linear in model (in place) by a QuantizedLinear of its weights, except
    modules whose qualified name ends with a name in skip; returns the model."""
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if isinstance(child, nn.Linear) and not any(full.endswith(s) for s in skip):
                setattr(module, child_name, QuantizedLinear.from_float(child, bits, group_size))
    return model


class DistillLoss(nn.Module):
    """llmk.ops.distill_loss with its options fixed: forward(student_logits, teacher_logits,
    labels=None)."""

    def __init__(self, loss: str = "kl", beta: float = 0.5, temperature: float = 1.0,
                 alpha: float = 0.0, ignore_index: int = -100, reduction: str = "batchmean"):
        super().__init__()
        self.options = dict(loss=loss, beta=beta, temperature=temperature, alpha=alpha,
                            ignore_index=ignore_index, reduction=reduction)

    def forward(self, student_logits: Tensor, teacher_logits: Tensor,
                labels: Optional[Tensor] = None) -> Tensor:
        return L.distill_loss(student_logits, teacher_logits, labels=labels, **self.options)


class FusedLinearDistillLoss(DistillLoss):
    """llmk.ops.fused_linear_distill_loss with its options fixed: forward(student_hidden,
    student_weight, teacher_hidden=None, teacher_weight=None, teacher_logits=None, labels=None,
    student_bias=None, teacher_bias=None); the logits of at most chunk_rows rows exist at once."""

    def __init__(self, loss: str = "kl", beta: float = 0.5, temperature: float = 1.0,
                 alpha: float = 0.0, ignore_index: int = -100, reduction: str = "batchmean",
                 chunk_rows: Optional[int] = None):
        super().__init__(loss, beta, temperature, alpha, ignore_index, reduction)
        self.chunk_rows = chunk_rows

    def forward(self, student_hidden: Tensor, student_weight: Tensor,
                teacher_hidden: Optional[Tensor] = None, teacher_weight: Optional[Tensor] = None,
                teacher_logits: Optional[Tensor] = None, labels: Optional[Tensor] = None,
                student_bias: Optional[Tensor] = None,
                teacher_bias: Optional[Tensor] = None) -> Tensor:
        return L.fused_linear_distill_loss(
            student_hidden, student_weight, student_bias, teacher_logits=teacher_logits,
            teacher_hidden=teacher_hidden, teacher_weight=teacher_weight,
            teacher_bias=teacher_bias, labels=labels, chunk_rows=self.chunk_rows, **self.options)


class FusedLinearCrossEntropyLoss(nn.Module):
    """llmk.ops.fused_linear_cross_entropy: forward(hidden, weight, labels, bias=None), the
    logits of at most chunk_rows rows at once."""

    def __init__(self, ignore_index: int = -100, reduction: str = "mean",
                 chunk_rows: Optional[int] = None):
        super().__init__()
        self.ignore_index, self.reduction, self.chunk_rows = ignore_index, reduction, chunk_rows

    def forward(self, hidden: Tensor, weight: Tensor, labels: Tensor,
                bias: Optional[Tensor] = None) -> Tensor:
        return L.fused_linear_cross_entropy(hidden, weight, labels, bias,
                                            ignore_index=self.ignore_index,
                                            reduction=self.reduction, chunk_rows=self.chunk_rows)
