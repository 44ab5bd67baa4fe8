#!/usr/bin/env python3
"""llmk.ops.pairwise_cosine_diversity on the GPU beside torch's N x N cosines: the mean and the
row means, forward and forward + backward.

    PYTHONPATH=<llmk with CUDA> python3 bench/diversity.py [--n 65536] [--d 1024] [--samples 20]
        [--json FILE]

bf16 embeddings [N, d]. Each sample: a 256 MiB write that flushes the L2, then the call between
CUDA events; the median; llmk and torch interleaved. Floor: reading x once (the mean's forward)
at the copy rate measured in the same run. torch: F.normalize, u @ u.T in bf16, then the means
over j != i (float32 sums). Memory: peak allocated beyond the input. llmk's cases and the copy
are also timed back to back (20 calls between two events, median of 5): at the default size x is
larger than the L2, and a short call after a flush can pay for idle clocks or host overhead
that a training step's stream of kernels hides.
"""
import argparse
import json
import sys

import torch
import torch.nn.functional as F

import llmk.ops as L
from timing import peak_gib, timed_back_to_back, timed_interleaved


def torch_diversity(x, rows):
    u = F.normalize(x, dim=1)
    c = (u @ u.T).float()
    n = x.shape[0]
    per_row = (n - 1) - (c.sum(1) - c.diagonal())
    return per_row / (n - 1) if rows else per_row.sum() / (n * (n - 1))


def full_matrix(n, d, samples, flush):
    """pairwise_cosine_distance's N x N matrix (bf16) against the bare GEMM u @ u.T of the same
    shape (the bf16 GEMM rate it is held to) and torch's 1 - F.normalize(x) @ F.normalize(x).T."""
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(n, d, generator=g, device="cuda").to(torch.bfloat16)
    u = F.normalize(x, dim=1)
    fns = {"llmk pairwise_cosine_distance": lambda: L.pairwise_cosine_distance(x),
           "torch GEMM u @ u.T alone": lambda: u @ u.T,
           "torch 1 - normalize(x) @ normalize(x).T":
               lambda: 1 - F.normalize(x, dim=1) @ F.normalize(x, dim=1).T}
    err = (L.pairwise_cosine_distance(x).double() - (1 - u.double() @ u.double().T)).abs().max()
    us = dict(zip(fns, timed_interleaved(list(fns.values()), samples, flush)))
    b2b = {name: timed_back_to_back(fn) for name, fn in fns.items()}
    flop = 2 * n * n * d
    gemm, gemm_b2b = us["torch GEMM u @ u.T alone"], b2b["torch GEMM u @ u.T alone"]
    print(f"# full matrix N {n} x d {d} bf16 ({flop / 1e9:.1f} GFLOP); max |llmk - float64| "
          f"{err.item():.2e}")
    print("| case | us after a flush | share of the GEMM's rate | us back to back | share |")
    print("|---|---|---|---|---|")
    out = []
    for name, t in us.items():
        bb = b2b[name]
        print(f"| {name} | {t:.1f} | {gemm / t:.2f} | {bb:.1f} | {gemm_b2b / bb:.2f} |")
        out.append({"case": name, "us": round(t, 1), "tflops": round(flop / t / 1e6),
                    "share_of_gemm_rate": round(gemm / t, 3), "us_back_to_back": round(bb, 1),
                    "share_back_to_back": round(gemm_b2b / bb, 3)})
    return {"n": n, "d": d, "max_err": err.item(), "cases": out}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=65536)
    ap.add_argument("--d", type=int, default=1024)
    ap.add_argument("--samples", type=int, default=20)
    ap.add_argument("--matrix-n", type=int, default=8192,
                    help="N of the full distance matrix's timing (0: skip it)")
    ap.add_argument("--json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("diversity: needs a GPU")
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(args.n, args.d, generator=g, device="cuda").to(torch.bfloat16)
    x.requires_grad_()
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    cases = {}
    for red in ("mean", "rows"):
        rows = red == "rows"
        w = torch.randn(args.n, generator=g, device="cuda") if rows else None

        def scalar(out, w=w):
            return (out * w).sum() if w is not None else out

        cases[f"llmk {red} fwd"] = lambda red=red: L.pairwise_cosine_diversity(x.detach(), red)
        cases[f"llmk {red} fwd+bwd"] = lambda red=red, scalar=scalar: torch.autograd.grad(
            scalar(L.pairwise_cosine_diversity(x, red)), x)
        cases[f"torch {red} fwd"] = lambda rows=rows: torch_diversity(x.detach(), rows)
        cases[f"torch {red} fwd+bwd"] = lambda rows=rows, scalar=scalar: torch.autograd.grad(
            scalar(torch_diversity(x, rows)), x)
    agree = {red: (L.pairwise_cosine_diversity(x.detach(), red).double()
                   - torch_diversity(x.detach(), red == "rows").double()).abs().max().item()
             for red in ("mean", "rows")}
    mem = {}
    for name, fn in cases.items():
        fn()
        mem[name] = peak_gib(fn)
    dst = torch.empty_like(x.detach())
    names = list(cases)
    us = timed_interleaved([cases[n] for n in names] + [lambda: dst.copy_(x.detach())],
                           args.samples, flush, warmup=1)
    times = {n: us[i] for i, n in enumerate(names)}
    # Back to back (x is larger than the L2 at the default size): llmk's cases and the copy only
    # (torch's take tens of ms each).
    b2b = {n: timed_back_to_back(cases[n]) for n in names if n.startswith("llmk")}
    b2b_copy = timed_back_to_back(lambda: dst.copy_(x.detach()))
    nbytes = x.numel() * 2
    copy_gbs = 2 * nbytes / us[-1] / 1e3
    floor_us = nbytes / copy_gbs / 1e3
    copy_b2b_gbs = 2 * nbytes / b2b_copy / 1e3
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}: N {args.n} x d {args.d} "
          f"bf16; copy rate {copy_gbs:.0f} GB/s after a flush, {copy_b2b_gbs:.0f} GB/s back to "
          f"back; floor (x read once at the flushed rate) {floor_us:.1f} us; "
          f"max |llmk - torch|: mean {agree['mean']:.2e}, rows {agree['rows']:.2e}")
    print("| case | us after a flush | us back to back | memory GiB |")
    print("|---|---|---|---|")
    rows_out = []
    for name in cases:
        us_ = times[name]
        bb = b2b.get(name)
        rows_out.append({"case": name, "us": round(us_, 1),
                         "us_back_to_back": None if bb is None else round(bb, 1),
                         "memory_gib": round(mem[name], 3)})
        print(f"| {name} | {us_:.1f} | {'-' if bb is None else f'{bb:.1f}'} | "
              f"{mem[name]:.3f} |")
    matrix = full_matrix(args.matrix_n, args.d, args.samples, flush) if args.matrix_n else None
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "n": args.n, "d": args.d,
                       "matrix": matrix,
                       "copy_gbs": round(copy_gbs), "copy_back_to_back_gbs": round(copy_b2b_gbs),
                       "floor_us": round(floor_us, 1),
                       "agreement": agree, "cases": rows_out}, f, indent=1)


if __name__ == "__main__":
    main()
