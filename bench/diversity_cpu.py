#!/usr/bin/env python3
"""llmk.ops.pairwise_cosine_diversity (O(N d)) beside the torch formulation that materialises the
N x N cosines (F.normalize, u @ u.T), on the CPU, in one process: forward, and forward +
backward (torch.autograd.grad), float32, median wall time of 10 calls for llmk and 3 for torch
after one warm-up; the last column is |llmk - torch| of the mean in float64.

    python3 bench/diversity_cpu.py
"""
import statistics
import time

import torch

import llmk.ops as L


def timed(fn, reps):
    fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e3


def torch_mean(x):
    u = torch.nn.functional.normalize(x, dim=1)
    c = u @ u.T
    n = x.shape[0]
    return 1 - (c.sum() - c.diagonal().sum()) / (n * (n - 1))


def main():
    torch.manual_seed(0)
    print(f"# torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("| N x d | llmk fwd | llmk fwd+bwd | torch fwd | torch fwd+bwd | |difference| |")
    print("|---|---|---|---|---|---|")
    for n, d in [(10007, 256), (2048, 4096)]:
        x = torch.randn(n, d)
        xg = x.clone().requires_grad_()
        a = timed(lambda: L.pairwise_cosine_diversity(x), 10)
        b = timed(lambda: torch.autograd.grad(L.pairwise_cosine_diversity(xg), xg), 10)
        c = timed(lambda: torch_mean(x), 3)
        e = timed(lambda: torch.autograd.grad(torch_mean(xg), xg), 3)
        err = abs(L.pairwise_cosine_diversity(x.double()).item() - torch_mean(x.double()).item())
        print(f"| {n} x {d} | {a:.2f} ms | {b:.2f} ms | {c:.1f} ms | {e:.1f} ms | {err:.1e} |")


if __name__ == "__main__":
    main()
