#!/usr/bin/env python3
"""llmk.ops.distill_loss beside torch (and Liger Kernel where it imports) on the GPU: a
distillation loss from logits, forward + backward, BT x V bf16 logits.

    PYTHONPATH=<llmk with CUDA> python3 bench/distill.py [--rows 8192] [--vocab 128256]
        [--loss kl|reverse_kl|jsd] [--temperature 2] [--samples 10] [--json FILE] [--png FILE]

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
import statistics
import sys

import torch
import torch.nn.functional as F

import llmk.ops as L


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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--loss", choices=["kl", "reverse_kl", "jsd"], default="kl")
    ap.add_argument("--temperature", type=float, default=2.0)
    ap.add_argument("--beta", type=float, default=0.5)
    ap.add_argument("--samples", type=int, default=10)
    ap.add_argument("--json")
    ap.add_argument("--png")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("distill: needs a GPU")
    BT, V, T = args.rows, args.vocab, args.temperature
    g = torch.Generator(device="cuda").manual_seed(0)
    s = (torch.randn(BT, V, generator=g, device="cuda") * 2).to(torch.bfloat16).requires_grad_()
    t = (torch.randn(BT, V, generator=g, device="cuda") * 2).to(torch.bfloat16)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")

    variants = {"llmk": lambda: L.distill_loss(s, t, loss=args.loss, beta=args.beta,
                                               temperature=T),
                "torch": lambda: torch_loss(s, t, args.loss, T, args.beta)}
    lf = liger_fn(args.loss, T, args.beta)
    if lf is not None:
        variants["liger"] = lambda: lf(s, t)

    # Agreement first (and warm-up): each loss and gradient against torch's.
    ref = variants["torch"]()
    (gref,) = torch.autograd.grad(ref, s)
    agree = {}
    for name, fn in variants.items():
        out = fn()
        (gs,) = torch.autograd.grad(out, s)
        agree[name] = {"loss": out.item(), "grad_max_abs_diff_vs_torch":
                       (gs.float() - gref.float()).abs().max().item()}
        del out, gs

    # Memory of one forward + backward, beyond what was allocated before it.
    mem = {}
    for name, fn in variants.items():
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = fn()
        (gs,) = torch.autograd.grad(out, s)
        torch.cuda.synchronize()
        mem[name] = (torch.cuda.max_memory_allocated() - base) / 2**30
        del out, gs

    # Copy rate: one tensor of the logits' size copied (read + write).
    dst = torch.empty_like(t)
    copy_t = []
    times = {n: [] for n in variants}
    for _ in range(args.samples):
        for name, fn in list(variants.items()) + [("copy", None)]:
            flush.fill_(1)
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            if fn is None:
                dst.copy_(t)
            else:
                torch.autograd.grad(fn(), s)
            b.record()
            b.synchronize()
            (copy_t if fn is None else times[name]).append(a.elapsed_time(b))
    copy_ms = statistics.median(copy_t)
    nbytes = BT * V * 2
    copy_gbs = 2 * nbytes / copy_ms / 1e6
    floor_ms = 3 * nbytes / copy_gbs / 1e6
    rows = []
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}: {args.loss}, "
          f"BT {BT} x V {V} bf16, T {T}; copy rate {copy_gbs:.0f} GB/s, floor (read both, write "
          f"the gradient) {floor_ms:.2f} ms")
    print("| variant | fwd+bwd ms | x floor | memory GiB | loss | max |grad - torch's| |")
    print("|---|---|---|---|---|---|")
    for name in variants:
        ms = statistics.median(times[name])
        r = {"variant": name, "ms": round(ms, 3), "over_floor": round(ms / floor_ms, 3),
             "memory_gib": round(mem[name], 3), **agree[name]}
        rows.append(r)
        print(f"| {name} | {r['ms']} | {r['over_floor']} | {r['memory_gib']} | "
              f"{r['loss']:.6g} | {r['grad_max_abs_diff_vs_torch']:.3g} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "loss": args.loss, "rows": BT, "vocab": V, "temperature": T,
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
