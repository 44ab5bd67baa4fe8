#!/usr/bin/env python3
"""llmk.ops.attention_transfer_loss on the GPU: the fused tensor-core kernel beside the torch
blockwise path (llmk's fallback, keys in blocks of --block), forward + backward.

    PYTHONPATH=<llmk with CUDA> python3 bench/attention_transfer.py [--batch 4] [--seq 2048]
        [--teacher 32x128] [--student 16x64] [--relation-heads 16] [--no-causal]
        [--samples 10] [--json FILE]

bf16 q and k [B, S, H, D] for each side; the student's get gradients. Each sample: a 256 MiB
write that flushes the L2, then the call between CUDA events; the median; the variants
interleaved sample by sample. Floor: the products the fused kernel performs (the forward's two
score GEMMs; the backward's two launches each recomputing both and one gradient GEMM; the causal
half of each) at the bf16 GEMM rate measured in the same run (an 8192^3 torch matmul). Memory:
the peak allocated during one forward + backward beyond what was allocated before it (the
inputs), the student's gradients included. stats() is checked: the llmk variant must have run
the CUDA kernel, not the fallback.
"""
import argparse
import json
import math
import sys

import torch

import llmk.ops as L
from timing import bf16_gemm_tflops, peak_gib, timed_interleaved


def heads(s):
    h, d = s.lower().split("x")
    return int(h), int(d)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--teacher", type=heads, default=(32, 128), help="heads x head dim")
    ap.add_argument("--student", type=heads, default=(16, 64), help="heads x head dim")
    ap.add_argument("--relation-heads", type=int, default=16)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--no-causal", dest="causal", action="store_false")
    ap.add_argument("--block", type=int, default=256, help="the torch path's keys per block")
    ap.add_argument("--samples", type=int, default=10)
    ap.add_argument("--json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("attention_transfer: needs a GPU")
    B, S, R, T, causal = args.batch, args.seq, args.relation_heads, args.temperature, args.causal
    (Ht, Dt), (Hs, Ds) = args.teacher, args.student
    dt, ds = Ht * Dt // R, Hs * Ds // R  # relation head dims
    g = torch.Generator(device="cuda").manual_seed(0)
    mk = lambda H, D: torch.randn(B, S, H, D, generator=g, device="cuda").to(  # noqa: E731
        torch.bfloat16)
    tq, tk = mk(Ht, Dt), mk(Ht, Dt)
    sq, sk = mk(Hs, Ds).requires_grad_(), mk(Hs, Ds).requires_grad_()
    params = (sq, sk)

    def llmk_fn():
        return L.attention_transfer_loss(tq, tk, sq, sk, temperature=T, causal=causal,
                                         relation_heads=R)

    st, ss = 1 / (math.sqrt(dt) * T), 1 / (math.sqrt(ds) * T)

    def torch_fn():  # the fallback's code on the same inputs, in bf16 as it runs there
        rel = [L._relations(t, R) for t in (tq, tk, sq, sk)]
        return L._AttentionTransfer.apply(*rel, st, ss, causal, args.block).float()

    variants = {"llmk": llmk_fn, "torch blockwise": torch_fn}
    L.reset_stats()
    llmk_fn()
    ran = {(s["op"], s["kernel"]) for s in L.stats()}
    if ("attention_transfer_forward", "cuda") not in ran:
        sys.exit(f"attention_transfer: the llmk variant did not run the CUDA kernel: {L.stats()}")

    # Agreement first (and warm-up): each loss and gradient against the torch path in float32
    # on the same (bf16) values.
    f32 = [t.detach().float().requires_grad_() for t in params]
    ref = L._AttentionTransfer.apply(*(L._relations(t.float(), R) for t in (tq, tk)),
                                     *(L._relations(t, R) for t in f32), st, ss, causal,
                                     args.block)
    gref = torch.autograd.grad(ref, f32)
    agree = {}
    for name, fn in variants.items():
        out = fn()
        gs = torch.autograd.grad(out, params)
        agree[name] = {"loss": out.item(), "loss_vs_f32": abs(out.item() - ref.item()),
                       "grad_max_rel_diff_vs_f32": max(
                           ((a.float() - b).abs().max() / b.abs().max()).item()
                           for a, b in zip(gs, gref))}
        del out, gs
    del ref, gref, f32

    # Memory of one forward + backward, beyond what was allocated before it.
    mem = {name: peak_gib(lambda fn=fn: torch.autograd.grad(fn(), params))
           for name, fn in variants.items()}

    gemm_tflops = bf16_gemm_tflops()  # for the floor
    # Score pairs: B R S^2 (half with the causal mask). Forward: 2 pairs (dt + ds) flops; the
    # backward's two launches: 2 (dt + ds) + 2 ds each.
    pairs = B * R * S * S * (0.5 if causal else 1.0)
    flops = pairs * 2 * ((dt + ds) + 2 * (dt + ds) + 2 * ds)
    floor_ms = flops / gemm_tflops / 1e9

    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    names = list(variants)
    fwd = [lambda fn=variants[n]: fn() for n in names]
    both = [lambda fn=variants[n]: torch.autograd.grad(fn(), params) for n in names]
    us = timed_interleaved(fwd + both, args.samples, flush, warmup=1)
    fwd_ms = {n: us[i] / 1e3 for i, n in enumerate(names)}
    both_ms = {n: us[len(names) + i] / 1e3 for i, n in enumerate(names)}

    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}: B {B} S {S}, teacher "
          f"{Ht} x {Dt}, student {Hs} x {Ds}, {R} relation heads ({dt} / {ds}), bf16, "
          f"{'causal' if causal else 'full'}; floor {flops / 1e12:.2f} TFLOP at "
          f"{gemm_tflops:.0f} TFLOP/s: {floor_ms:.3f} ms")
    print("| variant | fwd ms | fwd+bwd ms | x floor | memory GiB | loss | |loss - f32| | "
          "max |grad - f32| / max |f32| |")
    print("|---|---|---|---|---|---|---|---|")
    rows = []
    for name in names:
        r = {"variant": name, "fwd_ms": round(fwd_ms[name], 3), "ms": round(both_ms[name], 3),
             "over_floor": round(both_ms[name] / floor_ms, 3),
             "memory_gib": round(mem[name], 3), **agree[name]}
        rows.append(r)
        print(f"| {name} | {r['fwd_ms']} | {r['ms']} | {r['over_floor']} | {r['memory_gib']} | "
              f"{r['loss']:.6g} | {r['loss_vs_f32']:.3g} | {r['grad_max_rel_diff_vs_f32']:.3g} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "batch": B, "seq": S, "teacher": [Ht, Dt], "student": [Hs, Ds],
                       "relation_heads": R, "relation_dims": [dt, ds], "causal": causal,
                       "temperature": T, "block": args.block, "gemm_tflops": round(gemm_tflops),
                       "floor_ms": round(floor_ms, 3), "variants": rows}, f, indent=1)


if __name__ == "__main__":
    main()
