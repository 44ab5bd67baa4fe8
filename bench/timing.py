"""GPU timing shared by the bench scripts: CUDA events around each call, the L2 flushed first."""
import statistics

import torch


def timed_interleaved(fns, samples, flush, warmup=3, calls=1):
    """The median time in microseconds of each of fns, called `warmup` times each first, then
    sampled interleaved so that clock and power drift over the run weighs on all of them alike,
    the order rotated each round (f1 f2 f3, f2 f3 f1, ...): under the GPU's power cap a function
    that always followed a lighter one would start each sample at a higher clock. Each sample:
    flush.fill_(1) (a write larger than the L2), then `calls` calls back to back between two
    events, the time per call. With calls > 1 the host enqueues the next call while the GPU runs
    the last, as a training loop does, so a call's start-up on the host shows only in the
    first."""
    for fn in fns:
        for _ in range(warmup):
            fn()
    times = [[] for _ in fns]
    for r in range(samples):
        for j in range(len(fns)):
            i = (r + j) % len(fns)
            fn = fns[i]
            flush.fill_(1)
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(calls):
                fn()
            b.record()
            b.synchronize()
            times[i].append(a.elapsed_time(b) * 1e3 / calls)
    return [statistics.median(t) for t in times]


def timed_back_to_back(fn, calls=20, samples=5, warmup=3):
    """The median over `samples` of the time per call in microseconds of `calls` calls of fn
    enqueued back to back between two events: the GPU's own time when the host enqueues faster
    than the GPU runs (host overhead shows only where it is the longer). For inputs larger than
    the L2, where a flush between calls changes nothing."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(samples):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        a.record()
        for _ in range(calls):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / calls)
    return statistics.median(times)


def peak_gib(fn):
    """The peak memory in GiB that one call of fn allocates beyond what was allocated before it
    (what it returns included, released after)."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    del out
    return (torch.cuda.max_memory_allocated() - base) / 2**30


def bf16_gemm_tflops(n=8192, calls=10):
    """The rate in TFLOP/s of torch's bf16 n x n x n matmul (cuBLAS), after 3 warm-up calls: the
    GEMM floor's yardstick."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ a
    ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ev0.record()
    for _ in range(calls):
        a @ a
    ev1.record()
    ev1.synchronize()
    return calls * 2 * n**3 / ev0.elapsed_time(ev1) / 1e9
