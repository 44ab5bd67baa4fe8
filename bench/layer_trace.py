"""Where a decoder layer's wall time goes besides its kernels: torch.profiler traces of the
Llama-3-8B-shape layer of bench/torch_ops.py (transformers + SDPA, and under llmk.hf.apply),
per iteration: wall time between events, GPU busy time (union of kernel/memcpy/memset spans),
idle gaps (with the kernels either side), and the host's time to enqueue the iteration.

--host-wait (no profiler): what one call loses waiting for the host. Each sample starts after
about 8 ms of GPU spin (torch.cuda._sleep, so every sample starts from the same idle GPU); the layer is
enqueued either during the spin (the GPU never waits for the host: its own time) or after it (as
one call runs). The difference is the time the GPU waited. The layers' order rotates each round.

    python3 bench/layer_trace.py [--iters 5] [--json out.json] [--host-wait [--rounds 3]]
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from torch_ops import layer_modules  # noqa: E402


def gpu_spans(trace_path):
    with open(trace_path) as f:
        ev = json.load(f)["traceEvents"]
    return sorted((e["ts"], e["ts"] + e["dur"], e["name"]) for e in ev
                  if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))


def short(name):
    for junk in ("void ", "(anonymous namespace)::", "llmk::cuda::", "at::native::"):
        name = name.replace(junk, "")
    return name[:60]


def analyse(inside):
    busy, end, gaps, prev = 0.0, None, [], None
    for a, b, n in inside:
        if end is not None and a > end:
            gaps.append((a - end, prev, n))
        if end is None or a > end:
            busy += b - a
            end = b
        elif b > end:
            busy += b - end
            end = b
        prev = n
    first = inside[0][0] if inside else 0.0
    return {"span_ms": (end - first) / 1e3 if inside else 0.0, "busy_ms": busy / 1e3,
            "kernels": len(inside), "gaps": sorted(gaps, reverse=True)}


# The spin before each --host-wait sample: 16 M SM cycles, 8 ms at an H100's 1,980 MHz (longer
# at lower clocks), more than the host's 5-6 ms to enqueue a layer's forward and backward.
SPIN_CYCLES = 16_000_000


def host_wait(fns, names, rounds, samples=20):
    """Per round: each layer's median time with the host ahead of the GPU and with the GPU
    ahead (see the module docstring), samples interleaved in rotated order."""
    cycles = SPIN_CYCLES
    rows = []
    for _ in range(rounds):
        ahead, behind = [[] for _ in fns], [[] for _ in fns]
        for s in range(samples):
            for j in range(len(fns)):
                i = (s + j) % len(fns)
                for times, wait in ((ahead[i], False), (behind[i], True)):
                    torch.cuda.synchronize()
                    torch.cuda._sleep(cycles)
                    if wait:
                        torch.cuda.synchronize()
                    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    a.record()
                    fns[i]()
                    b.record()
                    b.synchronize()
                    times.append(a.elapsed_time(b))
        row = {}
        for n, x, y in zip(names, ahead, behind):
            row[n] = {"host_ahead_ms": round(statistics.median(x), 3),
                      "gpu_ahead_ms": round(statistics.median(y), 3)}
            row[n]["waited_ms"] = round(row[n]["gpu_ahead_ms"] - row[n]["host_ahead_ms"], 3)
        rows.append(row)
        print("   " + "; ".join(f"{n}: {r['host_ahead_ms']:.2f} ms with the host ahead, "
                               f"{r['gpu_ahead_ms']:.2f} as one call runs (waited "
                               f"{r['waited_ms']:.2f})" for n, r in row.items()), flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--json")
    ap.add_argument("--host-wait", action="store_true",
                    help="only the time one call waits for the host (no profiler)")
    ap.add_argument("--rounds", type=int, default=3, help="--host-wait: rounds of 20 samples")
    args = ap.parse_args()
    base, ours, h, g = layer_modules()
    if args.host_wait:
        names = ("transformers_sdpa", "llmk")
        fns = [lambda m=m: torch.autograd.grad(m(h), [h] + list(m.parameters()), g)
               for m in (base, ours)]
        for fn in fns:
            for _ in range(3):
                fn()
        print(f"== {torch.cuda.get_device_name()}: host wait of one call, {args.rounds} rounds")
        rows = host_wait(fns, names, args.rounds)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"device": torch.cuda.get_device_name(), "host_wait": rows}, f,
                          indent=1)
        return
    out = {}
    for name, m in (("transformers_sdpa", base), ("llmk", ours)):
        fn = lambda m=m: torch.autograd.grad(m(h), [h] + list(m.parameters()), g)  # noqa: E731
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        # Host enqueue time and wall time, no profiler.
        host, wall = [], []
        for _ in range(20):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            a.record()
            t0 = time.perf_counter()
            fn()
            t1 = time.perf_counter()
            b.record()
            b.synchronize()
            host.append((t1 - t0) * 1e3)
            wall.append(a.elapsed_time(b))
        rows = []
        for _ in range(args.iters):  # one profile per iteration: its trace holds only that one
            torch.cuda.synchronize()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                    torch.profiler.ProfilerActivity.CUDA]) as prof:
                fn()
                torch.cuda.synchronize()
            path = os.path.join(tempfile.mkdtemp(), f"{name}.json")
            prof.export_chrome_trace(path)
            rows.append(analyse(gpu_spans(path)))
        r = {"host_enqueue_ms": statistics.median(host), "wall_ms": statistics.median(wall),
             "span_ms": statistics.median(x["span_ms"] for x in rows),
             "busy_ms": statistics.median(x["busy_ms"] for x in rows),
             "kernels": rows[0]["kernels"] if rows else 0}
        gaps = rows[len(rows) // 2]["gaps"] if rows else []
        r["idle_ms"] = sum(x[0] for x in gaps) / 1e3
        r["top_gaps"] = [(round(d, 1), short(p), short(n)) for d, p, n in gaps[:12]]
        out[name] = r
        print(f"== {name}: wall {r['wall_ms']:.3f} ms (no profiler), host enqueue "
              f"{r['host_enqueue_ms']:.3f} ms; profiled: GPU span {r['span_ms']:.3f}, busy "
              f"{r['busy_ms']:.3f}, idle {r['idle_ms']:.3f} in {len(gaps)} gaps, "
              f"{r['kernels']} kernels")
        for d, p, n in r["top_gaps"]:
            print(f"   {d:8.1f} us  after {p}  before {n}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
