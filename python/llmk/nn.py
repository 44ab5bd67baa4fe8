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
    per group, rounded to a float16 value). Built from a weight with from_float(), or by
    replace_linear_with_quantized().

    forward runs llmk's block kernels, the ones that read quantised GGUF weights (Q8_0 blocks for
    8 bits, Q4_0 for 4: one scale a block of 32, each block taking its group's scale, so the
    product is over exactly these integers and scales): on CUDA with bfloat16 x (one-row
    streaming kernels up to 16 rows, tensor-core GEMMs above), on the CPU with float32 x. The
    blocks are packed from qweight and scales on the first call on a device and again whenever
    either changes. Elsewhere it dequantizes the weight and runs llmk.ops.linear_act (the
    reference path): group_size or in_features not a multiple of 32, another x dtype, scales
    that are not float16 values, or an x that requires grad (the kernels have no backward).
    llmk.ops.stats() counts each call under the path it took, with the reason. qweight keeps one
    integer per int8 (4-bit values are not packed there)."""

    _TYPES = {8: "q8_0", 4: "q4_0"}

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
        self._blocks = None  # (what they were packed from, bytes or None, reason)

    @classmethod
    def from_float(cls, linear: nn.Linear, bits: int = 8, group_size: int = 128):
        w = linear.weight.detach()
        q = cls(linear.in_features, linear.out_features, bits, group_size,
                linear.bias is not None, w.device, w.dtype)
        qmax = 2 ** (bits - 1) - 1
        pad = q.scales.shape[1] * group_size - linear.in_features
        wg = torch.nn.functional.pad(w.float(), (0, pad)).view(w.shape[0], -1, group_size)
        # float16 scales (what the block formats store), at least its smallest subnormal.
        scale = (wg.abs().amax(-1) / qmax).clamp_min(2.0 ** -24).half().float()
        scale = scale.to(q.scales.dtype).float()  # as stored, should the dtype round further
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

    def _kernel_reason(self, x: Tensor) -> str:
        """Why forward(x) cannot run the block kernels ("" when it can)."""
        if self.in_features % 32 or self.group_size % 32:
            return (f"in_features {self.in_features} and group_size {self.group_size} are not "
                    f"both multiples of 32 (the blocks' size)")
        if x.device != self.qweight.device:
            return f"x is on {x.device}, the weights on {self.qweight.device}"
        want = torch.bfloat16 if x.is_cuda else torch.float32
        if x.dtype != want:
            return f"x is {x.dtype}: the block kernels take {want} on {x.device.type}"
        if x.requires_grad and torch.is_grad_enabled():
            return "x requires grad: the block kernels are forward only"
        return ""

    def _packed(self) -> tuple[Optional[Tensor], str]:
        """The weights as blocks in the layout of their device (cached), or (None, reason)."""
        key = (self.qweight.data_ptr(), self.qweight._version, self.scales.data_ptr(),
               self.scales._version, self.qweight.device)
        if self._blocks is not None and self._blocks[0] == key:
            return self._blocks[1], self._blocks[2]
        K = self.in_features
        s = self.scales.detach().float().repeat_interleave(self.group_size // 32, dim=1)
        s = s[:, :K // 32].cpu().contiguous()
        blocks, reason = None, ""
        if not bool((s.half().float() == s).all()):
            reason = "scales that are not float16 values (the blocks store float16)"
        else:
            t = self._TYPES[self.bits]
            per_row = L._C.packed_row_bytes(t, K)
            blocks = torch.empty(self.out_features * per_row, dtype=torch.uint8)
            L._C.pack_symmetric(blocks, self.qweight.detach().cpu().contiguous(), s, t,
                                self.qweight.is_cuda)
            blocks = blocks.to(self.qweight.device)
        self._blocks = (key, blocks, reason)
        return blocks, reason

    def forward(self, x: Tensor) -> Tensor:
        reason = self._kernel_reason(x)
        blocks = None
        if not reason:
            blocks, reason = self._packed()
        if reason:
            L._count_python("QuantizedLinear", "reference", reason)
            w = self.dequantize().to(x.dtype)
            b = None if self.bias is None else self.bias.to(x.dtype)
            return L.linear_act(x, w, b, "none")
        t = self._TYPES[self.bits]
        L._count_python("QuantizedLinear", f"{t} blocks")
        x2 = x.reshape(-1, self.in_features).contiguous()
        out = torch.empty(x2.shape[0], self.out_features, dtype=x.dtype, device=x.device)
        if x2.shape[0] > 0:
            b = None if self.bias is None else self.bias.detach().to(x.dtype)
            L._C.quantized_linear(out, x2, blocks, t, self.out_features, self.in_features, b,
                                  L._stream(x))
        return out.view(*x.shape[:-1], self.out_features)

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
