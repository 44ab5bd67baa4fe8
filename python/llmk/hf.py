"""llmk's ops inside Hugging Face transformers models.

    import transformers, llmk.hf
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    llmk.hf.apply(model)          # attention, RMSNorm, RoPE and the gated MLP on llmk.ops
    loss = model(ids, labels=ids).loss; loss.backward()

    llmk.hf.register()            # or only: attn_implementation="llmk" in from_pretrained

apply() works in place on Llama, Qwen2, Phi-3 and Gemma 3 (text) models and returns the model;
training and inference both go through it. Padded batches run as packed sequences (flash-attn's
varlen call). What llmk cannot run falls back to transformers' own code and is counted in
llmk.ops.stats() with the reason (attention dropout; rotary tables not in the [.., seq, dim]
layout); a padded batch decoding with a cache (queries fewer than keys) raises ValueError. Patching RoPE replaces the module-level apply_rotary_pos_emb of each
family's modeling file, so it holds for every model of those families in the process.

Beyond swapping ops: q|k|v (and gate|up) run as one autograd node whose backward adds their
input gradients inside the GEMMs; and on Llama and Qwen2 the decoder layer's residual adds run
inside the norms' kernels (forward and backward) and the down projection's GEMM, so no separate
add remains in a layer's forward or backward.
"""

from __future__ import annotations

import importlib
import inspect
import types
from typing import Optional

import torch
from torch import Tensor, nn

import llmk.ops as L

__all__ = ["register", "apply", "attention_forward"]

FAMILIES = ("llama", "qwen2", "phi3", "gemma3")
# RoPE is a module-level function of each family's modeling file, not a module: apply() wraps it
# once, and the wrapper runs llmk's kernel only inside the forward of a model apply() was given
# (its forward hooks count the depth), so other models of the family keep transformers' code.
_rope_depth = 0


def attention_forward(module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
                      attention_mask: Optional[Tensor], dropout: float = 0.0,
                      scaling: Optional[float] = None, is_causal: Optional[bool] = None,
                      sliding_window: Optional[int] = None, softcap: Optional[float] = None,
                      **kwargs):
    """transformers' attention interface: query [B, Hq, Sq, D], key/value [B, Hkv, Sk, D];
    attention_mask None (causal, unpadded) or the [B, Sk] padding mask of flash-attn's mask
    function; returns ([B, Sq, Hq, D], None)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    B, _, Sq, D = query.shape
    Sk = key.shape[2]
    fallback = None
    if dropout > 0:
        fallback = "attention dropout"
    elif attention_mask is not None and (attention_mask.dim() != 2 or Sq != Sk):
        fallback = "a padding mask with queries and keys of different lengths"
    if fallback is not None:
        L._count_python("hf attention", "transformers sdpa", fallback)
        if attention_mask is not None and attention_mask.dim() == 2:
            raise ValueError(f"llmk.hf: {fallback} is not supported")
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))  # [B, S, H, D]
    opts = dict(causal=causal, window=sliding_window, softcap=softcap, scale=scaling)
    if attention_mask is None:
        return L.flash_attn(q, k, v, **opts), None
    # A padded batch: the kept tokens of each sequence, packed (flash-attn's varlen call).
    keep = attention_mask.bool()
    lens = keep.sum(1, dtype=torch.int32)
    cu = torch.zeros(B + 1, dtype=torch.int32, device=q.device)
    cu[1:] = lens.cumsum(0)
    idx = keep.flatten().nonzero().squeeze(1)
    pack = lambda t: t.reshape(B * Sq, t.shape[2], D)[idx]  # noqa: E731
    maxlen = int(lens.max()) if B > 0 else 0
    o = L.flash_attn(pack(q), pack(k), pack(v), cu_seqlens_q=cu, cu_seqlens_k=cu,
                     max_seqlen_q=maxlen, max_seqlen_k=maxlen, **opts)
    out = q.new_zeros(B * Sq, q.shape[2], D)
    out[idx] = o
    return out.view(B, Sq, q.shape[2], D), None


def register() -> None:
    """Makes attn_implementation="llmk" available to transformers (attention and its mask)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    AttentionInterface.register("llmk", attention_forward)
    AttentionMaskInterface.register("llmk", flash_attention_mask)


def _rope(original):
    def apply_rotary_pos_emb(q, k, cos, sin, *args, **kwargs):
        if _rope_depth == 0:
            return original(q, k, cos, sin, *args, **kwargs)
        unsqueeze_dim = kwargs.get("unsqueeze_dim", args[-1] if args else 1)
        if (unsqueeze_dim != 1 or cos.dim() not in (2, 3) or cos.shape[-1] % 2
                or cos.shape[-2] != q.shape[2]):
            L._count_python("hf rope", "transformers", "rotary tables in another layout")
            return original(q, k, cos, sin, *args, **kwargs)
        R = cos.shape[-1] // 2  # Hugging Face's tables repeat each pair's value twice
        return L.rope(q, k, (cos[..., :R], sin[..., :R]), heads_first=True)

    apply_rotary_pos_emb.llmk = True
    return apply_rotary_pos_emb


def _patch_rope() -> None:
    for family in FAMILIES:
        mod = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
        fn = getattr(mod, "apply_rotary_pos_emb", None)
        if fn is not None and not getattr(fn, "llmk", False):
            mod.apply_rotary_pos_emb = _rope(fn)


def _enter_rope(module, args, kwargs=None):
    global _rope_depth
    _rope_depth += 1


def _leave_rope(module, args, output):
    global _rope_depth
    _rope_depth -= 1


def _norm_params(norm: nn.Module, like: Tensor) -> tuple[Tensor, float]:
    """The weight (Gemma's 1 + w) and eps of a patched RMSNorm module."""
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6))
    w = norm.weight + norm._llmk_offset if norm._llmk_offset else norm.weight
    return w.to(like.dtype), float(eps)


def _norm_forward(self, hidden_states, *args, **kwargs):
    return L.rms_norm(hidden_states, *_norm_params(self, hidden_states))


def _mlp_forward(act: str):
    gate_fn = {"silu": L.swiglu, "swish": L.swiglu,
               "gelu_pytorch_tanh": lambda g, u: L.geglu(g, u, "tanh"),
               "gelu_new": lambda g, u: L.geglu(g, u, "tanh"),
               "gelu": lambda g, u: L.geglu(g, u, "none")}[act]

    def forward(self, x, residual: Optional[Tensor] = None):
        """down(act(gate(x)) * up(x)) (+ residual, added by the down projection's GEMM)."""
        if hasattr(self, "gate_up_proj"):  # Phi-3: one projection, gate first
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        elif _plain_linear(self.gate_proj, self.up_proj):
            gate, up = L._linears(x, [self.gate_proj.weight, self.up_proj.weight],
                                  [self.gate_proj.bias, self.up_proj.bias])
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        h = gate_fn(gate, up)
        down = self.down_proj
        if residual is None:
            return down(h)
        if not _plain_linear(down) or down.bias is not None:
            return residual + down(h)
        out = torch.addmm(residual.reshape(-1, residual.shape[-1]), h.reshape(-1, h.shape[-1]),
                          down.weight.t())
        return out.view(residual.shape)
    forward.llmk = True
    return forward


def _plain_linear(*mods: nn.Module) -> bool:
    return all(type(m) is nn.Linear for m in mods)


class _SharedInput:
    """Linear layers that read the same input (an attention module's q_proj, k_proj, v_proj) as
    one autograd node: the first of them called with an input computes every output, the others
    take theirs, and the backward sums their input gradients in the GEMMs (llmk.ops._linears)."""

    def __init__(self, mods: list[nn.Module]):
        self.mods, self.x, self.pending = mods, None, {}

    def forward_of(self, i: int):
        def forward(x):
            if x is not self.x or i not in self.pending:
                ys = L._linears(x, [m.weight for m in self.mods], [m.bias for m in self.mods])
                self.x, self.pending = x, dict(enumerate(ys))
            y = self.pending.pop(i)
            if not self.pending:
                self.x = None
            return y
        return forward


def _group_qkv(attn: nn.Module) -> None:
    mods = [getattr(attn, n, None) for n in ("q_proj", "k_proj", "v_proj")]
    if not all(m is not None for m in mods) or not _plain_linear(*mods) or \
            getattr(attn, "_llmk_qkv", False):
        return
    group = _SharedInput(mods)
    for i, m in enumerate(mods):
        m.forward = group.forward_of(i)
    attn._llmk_qkv = True


# Decoder layers whose forward is x + attn(norm1(x)) then s + mlp(norm2(s)), and which pass all
# their arguments to the attention: their residual adds go into the norms' kernels and the down
# projection's GEMM.
_PRE_NORM_LAYERS = ("LlamaDecoderLayer", "Qwen2DecoderLayer")


def _layer_forward(sig: inspect.Signature):
    def forward(self, *args, **kwargs):
        bound = sig.bind(self, *args, **kwargs)
        kw = dict(bound.arguments)
        kw.pop("self")
        x = kw.pop("hidden_states")
        for name, p in sig.parameters.items():
            if p.kind is inspect.Parameter.VAR_KEYWORD:
                kw.update(kw.pop(name, {}))
        h, x = L._rms_norm_tee(x, *_norm_params(self.input_layernorm, x))
        a = self.self_attn(hidden_states=h, **kw)[0]
        h, s = L.rms_norm(a, *_norm_params(self.post_attention_layernorm, a), residual=x)
        return self.mlp(h, residual=s)
    forward.llmk = True
    return forward


def _fuse_layer(layer: nn.Module) -> None:
    forward = type(layer).forward
    sig = inspect.signature(forward)
    if (type(layer).__name__ not in _PRE_NORM_LAYERS or sig.return_annotation is not Tensor
            or "hidden_states" not in sig.parameters
            or not getattr(getattr(layer, "input_layernorm", None), "_llmk_offset", None) == 0.0
            or not getattr(getattr(layer, "post_attention_layernorm", None), "_llmk_offset",
                           None) == 0.0
            or not getattr(getattr(layer, "mlp", None).forward, "llmk", False)):
        return
    layer.forward = types.MethodType(_layer_forward(sig), layer)


def apply(model: nn.Module, attention: bool = True, norm: bool = True, rope: bool = True,
          mlp: bool = True) -> nn.Module:
    """Swaps attention, RMSNorm, RoPE and the gated MLP of a loaded Llama, Qwen2, Phi-3 or
    Gemma 3 model for llmk.ops, in place; returns the model. Raises ValueError for another
    model type or an MLP activation llmk has no kernel for."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", "")
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    family = next((f for f in FAMILIES if model_type.startswith(f)), None)
    if family is None:
        raise ValueError(f"llmk.hf.apply: model type {model_type!r} is not one of "
                         f"{', '.join(FAMILIES)}")
    act = getattr(text, "hidden_activation", None) or getattr(text, "hidden_act", "silu")
    if mlp and act not in ("silu", "swish", "gelu_pytorch_tanh", "gelu_new", "gelu"):
        raise ValueError(f"llmk.hf.apply: MLP activation {act!r} has no llmk kernel")
    if attention:
        register()
        if hasattr(model, "set_attn_implementation"):
            model.set_attn_implementation("llmk")
        else:
            config._attn_implementation = "llmk"
    if rope and not getattr(model, "_llmk_rope", False):
        _patch_rope()
        model.register_forward_pre_hook(_enter_rope)
        model.register_forward_hook(_leave_rope, always_call=True)
        model._llmk_rope = True
    offset = 1.0 if family == "gemma3" else 0.0
    for m in model.modules():
        name = type(m).__name__
        if norm and name.endswith("RMSNorm") and hasattr(m, "weight"):
            m._llmk_offset = offset
            m.forward = types.MethodType(_norm_forward, m)
        elif mlp and name.endswith("MLP") and hasattr(m, "down_proj"):
            m.forward = types.MethodType(_mlp_forward(act), m)
        elif attention and name.endswith("Attention"):
            _group_qkv(m)
    if norm and mlp:
        for m in model.modules():
            _fuse_layer(m)
    return model
