#!/usr/bin/env python3
"""llmk.ops beside torch on the GPU: attention forward and backward against SDPA (flash backend),
linear_act (gelu_tanh, gelu, silu; forward without gradients) against F.linear alone and F.linear
then the activation, llmk.nn.QuantizedLinear (8 and 4 bits, group 128) against F.linear on the
bf16 weight it was made from, and a Llama-3-8B-shape decoder layer (forward + backward) under
llmk.hf.apply against transformers' own with SDPA.

    PYTHONPATH=<llmk with CUDA> python3 bench/torch_ops.py [--json FILE] [--png FILE] [--quick]
        [--only attention,linear,quantized,layer]

Inputs are random bf16 in flash-attn's layout [B, S, H, D] (SDPA gets [B, H, S, D] views).
Each sample is one call between CUDA events after a 256 MiB write that flushes the L2; the figure
is the median of the samples, after warm-up; llmk and torch alternate shape by shape in one
process. Forward: the op alone. Backward: torch.autograd.grad of the op's output with a fixed
random dO (the forward is outside the events). TFLOP/s counts 4 B H S^2 D for the forward and
2.5 times that for the backward, both halved when causal (FA2's convention).
"""
import argparse
import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import llmk.ops as L
from timing import timed_interleaved

ATTENTION = [  # B, Hq, Hkv, S, D, causal
    (4, 32, 32, 2048, 128, True),
    (2, 32, 32, 8192, 128, True),
    (1, 32, 32, 16384, 128, True),
    (4, 32, 8, 2048, 128, True),
    (4, 32, 32, 2048, 64, True),
    (2, 32, 32, 4096, 96, True),
]


def timed(fn, samples, flush):
    return timed_interleaved([fn], samples, flush)[0]


def attention_row(B, Hq, Hkv, S, D, causal, samples, flush):
    g = torch.Generator(device="cuda").manual_seed(0)
    mk = lambda h: torch.randn(B, S, h, D, generator=g, device="cuda",  # noqa: E731
                               dtype=torch.bfloat16).requires_grad_()
    q, k, v = mk(Hq), mk(Hkv), mk(Hkv)
    dout = torch.randn(B, S, Hq, D, generator=g, device="cuda", dtype=torch.bfloat16)
    flops = 4.0 * B * Hq * S * S * D * (0.5 if causal else 1.0)

    def sdpa(q, k, v):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                               v.transpose(1, 2), is_causal=causal,
                                               enable_gqa=Hq != Hkv)
        return o.transpose(1, 2)

    def llmk(q, k, v):
        return L.flash_attn(q, k, v, causal=causal)

    row = {"B": B, "Hq": Hq, "Hkv": Hkv, "S": S, "D": D, "causal": causal}
    for name, fn in (("llmk", llmk), ("sdpa", sdpa)):
        with torch.no_grad():
            fwd = timed(lambda: fn(q, k, v), samples, flush)
        out = fn(q, k, v)
        bwd = timed(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True),
                    samples, flush)
        row[f"{name}_fwd_us"] = round(fwd, 1)
        row[f"{name}_bwd_us"] = round(bwd, 1)
        row[f"{name}_fwd_tflops"] = round(flops / fwd / 1e6, 1)
        row[f"{name}_bwd_tflops"] = round(2.5 * flops / bwd / 1e6, 1)
    row["fwd_speedup"] = round(row["sdpa_fwd_us"] / row["llmk_fwd_us"], 3)
    row["bwd_speedup"] = round(row["sdpa_bwd_us"] / row["llmk_bwd_us"], 3)
    return row


LINEAR = [  # M, K, N: the 128 x 4096 x 16384, and a training-sized batch
    (128, 4096, 16384),
    (8192, 4096, 14336),
]


ACTS = {"gelu_tanh": lambda t: F.gelu(t, approximate="tanh"), "gelu": F.gelu, "silu": F.silu}


def linear_rows(M, K, N, samples, flush):
    """linear_act forward (no gradient wanted) for each activation, against torch's F.linear
    alone and F.linear then the activation, all interleaved sample by sample."""
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(M, K, generator=g, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, generator=g, device="cuda", dtype=torch.bfloat16) / K ** 0.5
    fns = [lambda: F.linear(x, w)]
    for act, fn in ACTS.items():
        fns.append(lambda fn=fn: fn(F.linear(x, w)))
        fns.append(lambda act=act: L.linear_act(x, w, act=act))
    with torch.no_grad():
        t = timed_interleaved(fns, samples, flush)
    lin, rows = t[0], []
    for i, act in enumerate(ACTS):
        theirs, ours = t[1 + 2 * i], t[2 + 2 * i]
        rows.append({"M": M, "K": K, "N": N, "act": act, "linear_us": round(lin, 1),
                     "torch_linear_act_us": round(theirs, 1), "llmk_linear_act_us": round(ours, 1),
                     "llmk_over_linear": round(ours / lin, 3),
                     "torch_over_linear": round(theirs / lin, 3)})
    return rows


def layer_modules(B=4, S=2048):
    """A Llama-3-8B-shape decoder layer (transformers, bf16) and the same layer under
    llmk.hf.apply, with an input h [B, S, 4096] that needs its gradient and an output gradient."""
    import copy

    import transformers
    import llmk.hf

    cfg = transformers.LlamaConfig(hidden_size=4096, intermediate_size=14336,
                                   num_attention_heads=32, num_key_value_heads=8,
                                   num_hidden_layers=1, vocab_size=128, rope_theta=5e5)
    cfg._attn_implementation = "sdpa"

    class One(torch.nn.Module):  # a layer with a config, which llmk.hf.apply takes
        def __init__(self):
            super().__init__()
            self.config = cfg
            self.layer = transformers.models.llama.modeling_llama.LlamaDecoderLayer(cfg, 0)
            self.rotary = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(cfg)

        def forward(self, h):
            pos = torch.arange(h.shape[1], device=h.device).unsqueeze(0)
            out = self.layer(h, position_embeddings=self.rotary(h, pos))
            return out[0] if isinstance(out, tuple) else out

    torch.manual_seed(0)
    base = One().to("cuda", torch.bfloat16)
    ours = llmk.hf.apply(copy.deepcopy(base))
    h = torch.randn(B, S, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(B, S, 4096, device="cuda", dtype=torch.bfloat16)
    return base, ours, h, g


def layer_row(samples, flush, B=4, S=2048):
    """A Llama-3-8B-shape decoder layer (transformers), forward + backward in bf16: transformers'
    eager layer with SDPA against the same layer under llmk.hf.apply."""
    base, ours, h, g = layer_modules(B, S)
    row = {"B": B, "S": S}
    names = ("transformers_sdpa", "llmk")
    # Samples interleaved, their order rotated: both layers see the same clocks (the GPU's power
    # cap lowers them under sustained load, which would favour whichever ran first, or after the
    # lighter one). Three measures: one call between events after the host waited (its start-up
    # on the host exposed), 4 calls back to back, as a training step runs one layer after
    # another, and 16 (sustained: the power cap's steady state, most of each sample).
    fns = [lambda m=m: torch.autograd.grad(m(h), [h] + list(m.parameters()), g)
           for m in (base, ours)]
    for suffix, calls, n in (("", 1, samples), ("_b2b", 4, samples),
                             ("_sustained", 16, max(4, samples // 3))):
        for name, us in zip(names, timed_interleaved(fns, n, flush, calls=calls)):
            row[f"{name}_fwd_bwd_ms{suffix}"] = round(us / 1e3, 2)
        row[f"speedup{suffix}"] = round(row[f"transformers_sdpa_fwd_bwd_ms{suffix}"] /
                                        row[f"llmk_fwd_bwd_ms{suffix}"], 3)
    return row


QUANTIZED = [  # M, K, N: Llama-3-8B's gate/up and down at decode (1), a small batch (16), prefill
    (1, 4096, 14336), (16, 4096, 14336), (1, 14336, 4096), (16, 14336, 4096), (512, 4096, 14336),
]


def quantized_rows(M, K, N, samples, flush):
    """QuantizedLinear (bits 8 and 4, group 128, bf16 x, no gradient) against F.linear over the
    bf16 weight (cuBLAS), interleaved sample by sample."""
    import llmk.nn
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(M, K, generator=g, device="cuda", dtype=torch.bfloat16)
    lin = torch.nn.Linear(K, N, bias=False, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(N, K, generator=g, device="cuda") / K ** 0.5)
    qs = {b: llmk.nn.QuantizedLinear.from_float(lin, bits=b, group_size=128) for b in (8, 4)}
    with torch.no_grad():
        for q in qs.values():
            q(x)  # packs the blocks
        L.reset_stats()
        t = timed_interleaved([lambda: F.linear(x, lin.weight)] +
                              [lambda q=q: q(x) for q in qs.values()], samples, flush)
    kernels = {s["kernel"] for s in L.stats() if s["op"] == "QuantizedLinear"}
    row = {"M": M, "K": K, "N": N, "bf16_linear_us": round(t[0], 2), "kernels": sorted(kernels)}
    for i, b in enumerate(qs):
        row[f"int{b}_us"] = round(t[1 + i], 2)
        row[f"int{b}_speedup"] = round(t[0] / t[1 + i], 3)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--png", help="draw the speedups here (needs matplotlib)")
    ap.add_argument("--samples", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="the first two shapes only")
    ap.add_argument("--only", default="attention,linear,quantized,layer",
                    help="comma-separated subset of: attention, linear, quantized, layer")
    ap.add_argument("--attention-kernel", choices=["auto", "wgmma", "mma-sync"], default="auto",
                    help="llmk's attention build on an H100: warpgroup MMA (auto) or mma.sync")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("torch_ops: needs a GPU")
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    from llmk._C import ops as _C
    _C.set_attention_kernel(args.attention_kernel)
    only = set(args.only.split(","))
    unknown = only - {"attention", "linear", "quantized", "layer"}
    if unknown:
        sys.exit(f"torch_ops: --only: unknown {', '.join(sorted(unknown))}")
    rows, lrows, qrows, layer = [], [], [], None
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, llmk attention "
          f"kernel: {args.attention_kernel}")
    if "attention" in only:
        print("| B | Hq | Hkv | S | D | fwd llmk us (TFLOP/s) | fwd SDPA | x | bwd llmk us "
              "(TFLOP/s) | bwd SDPA | x |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
    for shape in (ATTENTION[:2] if args.quick else ATTENTION) if "attention" in only else []:
        r = attention_row(*shape, args.samples, flush)
        rows.append(r)
        print(f"| {r['B']} | {r['Hq']} | {r['Hkv']} | {r['S']} | {r['D']} | "
              f"{r['llmk_fwd_us']} ({r['llmk_fwd_tflops']}) | {r['sdpa_fwd_us']} "
              f"({r['sdpa_fwd_tflops']}) | {r['fwd_speedup']} | {r['llmk_bwd_us']} "
              f"({r['llmk_bwd_tflops']}) | {r['sdpa_bwd_us']} ({r['sdpa_bwd_tflops']}) | "
              f"{r['bwd_speedup']} |", flush=True)
    if "linear" in only:
        print()
        print("| M | K | N | act | F.linear us | torch: F.linear + act | x | llmk linear_act | x |")
        print("|---|---|---|---|---|---|---|---|---|")
        for shape in LINEAR:
            for r in linear_rows(*shape, args.samples, flush):
                lrows.append(r)
                print(f"| {r['M']} | {r['K']} | {r['N']} | {r['act']} | {r['linear_us']} | "
                      f"{r['torch_linear_act_us']} | {r['torch_over_linear']} | "
                      f"{r['llmk_linear_act_us']} | {r['llmk_over_linear']} |", flush=True)
    if "quantized" in only:
        print()
        print("| M | K | N | F.linear bf16 us | QuantizedLinear 8-bit us | x | 4-bit us | x |")
        print("|---|---|---|---|---|---|---|---|")
        for shape in QUANTIZED:
            r = quantized_rows(*shape, args.samples, flush)
            qrows.append(r)
            print(f"| {r['M']} | {r['K']} | {r['N']} | {r['bf16_linear_us']} | {r['int8_us']} | "
                  f"{r['int8_speedup']} | {r['int4_us']} | {r['int4_speedup']} |", flush=True)
            if r["kernels"] != ["q4_0 blocks", "q8_0 blocks"]:
                sys.exit(f"torch_ops: QuantizedLinear ran {r['kernels']}, not the block kernels")
    if "layer" in only:
        layer = layer_row(max(5, args.samples // 2), flush)
        print()
        print("| Llama-3-8B layer, B x S | timed | transformers (SDPA) fwd+bwd ms | "
              "llmk.hf.apply | x |")
        print("|---|---|---|---|---|")
        for suffix, how in (("", "one call"), ("_b2b", "4 calls back to back"),
                            ("_sustained", "16 calls back to back")):
            print(f"| {layer['B']} x {layer['S']} | {how} | "
                  f"{layer['transformers_sdpa_fwd_bwd_ms' + suffix]} | "
                  f"{layer['llmk_fwd_bwd_ms' + suffix]} | {layer['speedup' + suffix]} |",
                  flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "attention": rows, "linear_act": lrows, "quantized_linear": qrows,
                       "layer": layer}, f, indent=1)
    if args.png and rows:
        from chart import bar_chart
        bar_chart(args.png, [f"S{r['S']} D{r['D']} {r['Hq']}/{r['Hkv']}" for r in rows],
                  {"forward": [r["fwd_speedup"] for r in rows],
                   "backward": [r["bwd_speedup"] for r in rows]},
                  f"llmk.ops.flash_attn, bf16, causal ({torch.cuda.get_device_name()})",
                  "speedup over SDPA (flash)", hline=1.0)

if __name__ == "__main__":
    main()
