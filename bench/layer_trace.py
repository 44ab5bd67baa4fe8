"""Where a decoder layer's wall time goes besides its kernels: torch.profiler traces of the
Llama-3-8B-shape layer of bench/torch_ops.py (transformers + SDPA, and under llmk.hf.apply),
per iteration: wall time between events, GPU busy time (union of kernel/memcpy/memset spans),
idle gaps (with the kernels either side), and the host's time to enqueue the iteration.

    python3 bench/layer_trace.py [--iters 5] [--json out.json]
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args()
    base, ours, h, g = layer_modules()
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
