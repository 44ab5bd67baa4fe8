#!/usr/bin/env python3
"""llmk.ops.distill_loss beside torch (and Liger Kernel where it imports) on the GPU: a
distillation loss from logits, forward + backward, BT x V bf16 logits.

    PYTHONPATH=<llmk with CUDA> python3 bench/distill.py [--rows 8192] [--vocab 128256]
        [--loss kl|reverse_kl|jsd] [--temperature 2] [--samples 10] [--json FILE] [--png FILE]
        [--fused H]

--fused H: the fused linear form (llmk.ops.fused_linear_distill_loss) from student and teacher
hidden states [rows, H] and lm_heads [vocab, H]; its floor is the four GEMMs (both logits, the
gradients for the hidden states and the lm_head) at the bf16 GEMM rate measured in the run.

Each sample: a 256 MiB write that flushes the L2, then loss and gradient between CUDA events;
the figure is the median, the variants interleaved sample by sample. The floor is reading both
logit tensors and writing the gradient once at the copy rate measured in the same run. Memory:
the peak allocated during one forward + backward beyond what was allocated before it (the
logits), the student's gradient included. torch: log_softmax in float32 (as models compute the
loss), then F.kl_div; Liger: LigerKLDIVLoss / LigerJSD over bf16 log_softmax (they take
log-probabilities, not logits).
"""
import argparse
import json
import sys

import torch
import torch.nn.functional as F

import llmk.ops as L
from timing import bf16_gemm_tflops, peak_gib, timed_interleaved


def torch_loss(s, t, loss, T, beta):
    lq, lp = F.log_softmax(s.float() / T, -1), F.log_softmax(t.float() / T, -1)
    if loss == "kl":
        d = F.kl_div(lq, lp, log_target=True, reduction="batchmean")
    elif loss == "reverse_kl":
        d = F.kl_div(lp, lq, log_target=True, reduction="batchmean")
    else:
        m = (beta * lp.exp() + (1 - beta) * lq.exp()).log()
        d = (beta * F.kl_div(m, lp, log_target=True, reduction="batchmean")
             + (1 - beta) * F.kl_div(m, lq, log_target=True, reduction="batchmean"))
    return d * T * T


def liger_fn(loss, T, beta):
    try:
        from liger_kernel.transformers.jsd import LigerJSD
        from liger_kernel.transformers.kl_div import LigerKLDIVLoss
    except Exception as e:  # noqa: BLE001 (any import failure: no peer)
        print(f"distill: no Liger Kernel ({type(e).__name__}: {e})", file=sys.stderr)
        return None
    if loss == "kl":
        kl = LigerKLDIVLoss(reduction="batchmean", log_target=True)
        return lambda s, t: kl(F.log_softmax(s / T, -1), F.log_softmax(t / T, -1)) * T * T
    if loss == "jsd":
        jsd = LigerJSD(beta=beta)  # its beta weighs the teacher as llmk's does
        return lambda s, t: jsd(F.log_softmax(s / T, -1), F.log_softmax(t / T, -1)) * T * T
    return None


def fused_variants(args, BT, V, H):
    """The fused linear form: student and teacher hidden states [BT, H] and lm_heads [V, H]."""
    g = torch.Generator(device="cuda").manual_seed(0)
    mk = lambda *shape, scale: (torch.randn(*shape, generator=g, device="cuda") * scale).to(  # noqa
        torch.bfloat16)
    sh, th = mk(BT, H, scale=1.0).requires_grad_(), mk(BT, H, scale=1.0)
    sw, tw = mk(V, H, scale=H ** -0.5 * 2).requires_grad_(), mk(V, H, scale=H ** -0.5 * 2)
    T, beta = args.temperature, args.beta
    params = (sh, sw)

    def llmk_fn():
        return L.fused_linear_distill_loss(sh, sw, teacher_hidden=th, teacher_weight=tw,
                                           loss=args.loss, beta=beta, temperature=T)

    def torch_fn():
        return torch_loss(sh @ sw.t(), th @ tw.t(), args.loss, T, beta)

    variants = {"llmk": llmk_fn, "torch": torch_fn}
    if args.loss == "jsd":
        try:
            from liger_kernel.transformers.fused_linear_jsd import LigerFusedLinearJSD
            lj = LigerFusedLinearJSD(jsd_beta=beta, temperature=T)
            variants["liger"] = lambda: lj(sh, sw, th, tw, None) * T * T
        except Exception as e:  # noqa: BLE001
            print(f"distill: no Liger fused linear JSD ({type(e).__name__}: {e})",
                  file=sys.stderr)
    grad_bytes = sum(p.numel() * p.element_size() for p in params)
    return variants, params, grad_bytes


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--loss", choices=["kl", "reverse_kl", "jsd"], default="kl")
    ap.add_argument("--temperature", type=float, default=2.0)
    ap.add_argument("--beta", type=float, default=0.5)
    ap.add_argument("--samples", type=int, default=10)
    ap.add_argument("--fused", type=int, metavar="H", default=0,
                    help="the fused linear form instead: hidden size H, logits from lm_heads")
    ap.add_argument("--json")
    ap.add_argument("--png")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("distill: needs a GPU")
    BT, V, T = args.rows, args.vocab, args.temperature
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    if args.fused:
        variants, params, grad_bytes = fused_variants(args, BT, V, args.fused)
        t = torch.empty(BT, V, dtype=torch.bfloat16, device="cuda")  # for the copy rate only
    else:
        g = torch.Generator(device="cuda").manual_seed(0)
        s = (torch.randn(BT, V, generator=g, device="cuda") * 2).to(torch.bfloat16)
        s.requires_grad_()
        t = (torch.randn(BT, V, generator=g, device="cuda") * 2).to(torch.bfloat16)
        params, grad_bytes = (s,), BT * V * 2
        variants = {"llmk": lambda: L.distill_loss(s, t, loss=args.loss, beta=args.beta,
                                                   temperature=T),
                    "torch": lambda: torch_loss(s, t, args.loss, T, args.beta)}
        lf = liger_fn(args.loss, T, args.beta)
        if lf is not None:
            variants["liger"] = lambda: lf(s, t)

    # Agreement first (and warm-up): each loss and gradient against torch's.
    ref = variants["torch"]()
    gref = torch.autograd.grad(ref, params)
    agree = {}
    for name, fn in variants.items():
        out = fn()
        gs = torch.autograd.grad(out, params)
        agree[name] = {"loss": out.item(), "grad_max_abs_diff_vs_torch": max(
            (a.float() - b.float()).abs().max().item() for a, b in zip(gs, gref))}
        del out, gs
    del ref, gref

    # Memory of one forward + backward, beyond what was allocated before it.
    mem = {name: peak_gib(lambda fn=fn: torch.autograd.grad(fn(), params))
           for name, fn in variants.items()}

    # Copy rate: one tensor of the logits' size copied (read + write).
    dst = torch.empty_like(t)
    names = list(variants)
    grads = [lambda fn=variants[n]: torch.autograd.grad(fn(), params) for n in names]
    us = timed_interleaved(grads + [lambda: dst.copy_(t)], args.samples, flush, warmup=1)
    times = {n: us[i] / 1e3 for i, n in enumerate(names)}  # ms
    copy_ms = us[-1] / 1e3
    nbytes = BT * V * 2
    copy_gbs = 2 * nbytes / copy_ms / 1e6
    floor_ms = 3 * nbytes / copy_gbs / 1e6
    if args.fused:  # four GEMMs of 2 BT V H flops at the bf16 GEMM rate measured here
        H = args.fused
        gemm_tflops = bf16_gemm_tflops()
        floor_ms = 4 * 2 * BT * V * H / gemm_tflops / 1e9
    rows = []
    what = (f"fused linear, H {args.fused}, floor: four GEMMs at {gemm_tflops:.0f} TFLOP/s"
            if args.fused else f"floor: read both, write the gradient at {copy_gbs:.0f} GB/s")
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}: {args.loss}, "
          f"BT {BT} x V {V} bf16, T {T}; {what}: {floor_ms:.2f} ms; gradients "
          f"{grad_bytes / 2**30:.3f} GiB")
    print("| variant | fwd+bwd ms | x floor | memory GiB (gradients included) | loss | "
          "max |grad - torch's| |")
    print("|---|---|---|---|---|---|")
    for name in variants:
        ms = times[name]
        r = {"variant": name, "ms": round(ms, 3), "over_floor": round(ms / floor_ms, 3),
             "memory_gib": round(mem[name], 3), **agree[name]}
        rows.append(r)
        print(f"| {name} | {r['ms']} | {r['over_floor']} | {r['memory_gib']} | "
              f"{r['loss']:.6g} | {r['grad_max_abs_diff_vs_torch']:.3g} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "loss": args.loss, "rows": BT, "vocab": V, "temperature": T,
                       "fused_hidden": args.fused, "gradient_gib": round(grad_bytes / 2**30, 3),
                       "copy_gbs": round(copy_gbs), "floor_ms": round(floor_ms, 3),
                       "variants": rows}, f, indent=1)
    if args.png:
        from chart import bar_chart
        bar_chart(args.png, [r["variant"] for r in rows],
                  {"forward + backward": [r["ms"] for r in rows]},
                  f"{args.loss} from logits, {BT} x {V} bf16 ({torch.cuda.get_device_name()})",
                  "ms", hline=floor_ms, hline_label="floor", figsize=(6, 3.5))

if __name__ == "__main__":
    main()
