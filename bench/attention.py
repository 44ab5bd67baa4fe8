#!/usr/bin/env python3
"""Attention benchmark: llmk beside torch SDPA (flash backend), one markdown table.

Runs on the device machine (torch is there):
    python3 bench/attention.py --bin .devbin-pre [--compare DIR,...] [--json FILE]

SDPA side, same shapes and the same timing method as the llmk binaries: random bf16 inputs,
CUDA events, warm-up, median of samples.
  prefill: q, k, v laid out [B, S, H, D] (llmk's packed layout), handed to SDPA as [B, H, S, D]
    views; flash backend only; each sample is one call between events after a 256 MiB write that
    flushes the L2. TFLOP/s counts 4 * B * Hq * S^2 * D, halved when causal (FA2's convention).
  decode: q [B, Hq, 1, D] over k, v [B, Hkv, L, D] (enable_gqa where Hq > Hkv), flash backend; calls are short,
    so a CUDA graph of N calls rotating over enough K/V sets to span > 2x the L2 is replayed and
    timed (events around the replay, median over samples). GB/s = K and V bytes read / time.
llmk side: the bench binaries found in --bin (attention_prefill_bench, attention_decode_bench),
each printing one JSON line per shape; rows without a binary show "-".
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

PREFILL = [  # B, Hq, Hkv, S, D, causal
    (16, 32, 32, 512, 64, False),
    (16, 32, 32, 512, 64, True),
    (4, 32, 32, 2048, 128, False),
    (4, 32, 32, 2048, 128, True),
    (2, 32, 32, 8192, 128, True),
    (1, 32, 32, 16384, 128, True),
    (2, 8, 8, 8192, 256, True),
    (1, 32, 8, 4096, 128, True),
    (2, 32, 32, 4096, 96, True),  # Phi-3-mini's heads
    (1, 32, 32, 8192, 96, True),
    (1, 32, 32, 4096, 80, True),  # the other head dims the fast kernels take
    (1, 32, 32, 4096, 112, True),
]
MMA_SYNC = "mma.sync"  # the column of the portable prefill kernel (--kernel mma-sync)
DECODE = [  # B, L, Hq, Hkv, D: Llama-3-8B's heads, then Phi-3-mini's
    (1, 4096, 32, 8, 128),
    (1, 32768, 32, 8, 128),
    (8, 4096, 32, 8, 128),
    (32, 4096, 32, 8, 128),
    (1, 4096, 32, 32, 96),
    (1, 32768, 32, 32, 96),
    (8, 4096, 32, 32, 96),
    (32, 4096, 32, 32, 96),
]


def prefill_flops(B, Hq, S, D, causal):
    return 4.0 * B * Hq * S * S * D * (0.5 if causal else 1.0)


def sdpa_prefill(B, Hq, Hkv, S, D, causal, samples, flush):
    g = torch.Generator(device="cuda").manual_seed(1)
    mk = lambda h: (torch.rand(B, S, h, D, device="cuda", generator=g, dtype=torch.float32) * 2 - 1).to(torch.bfloat16)
    q, k, v = mk(Hq), mk(Hkv), mk(Hkv)
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    gqa = Hq != Hkv

    def call():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=gqa)

    for _ in range(3):
        call()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ms = []
    for i in range(samples):
        flush.fill_(i & 0xFF)
        e0.record()
        call()
        e1.record()
        e1.synchronize()
        ms.append(e0.elapsed_time(e1))
    med = statistics.median(ms)
    return med, prefill_flops(B, Hq, S, D, causal) / (med * 1e-3) / 1e12


def sdpa_decode(B, L, Hq, Hkv, D, samples, l2_bytes):
    kv_bytes = 2 * B * Hkv * L * D * 2
    sets = max(1, -(-2 * l2_bytes // kv_bytes) + 1)
    calls = max(16, sets)
    g = torch.Generator(device="cuda").manual_seed(2)
    q = torch.rand(B, Hq, 1, D, device="cuda", generator=g).to(torch.bfloat16)
    ks = [torch.rand(B, Hkv, L, D, device="cuda", generator=g).to(torch.bfloat16) for _ in range(sets)]
    vs = [torch.rand(B, Hkv, L, D, device="cuda", generator=g).to(torch.bfloat16) for _ in range(sets)]

    def call(i):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, ks[i % sets], vs[i % sets], enable_gqa=Hq != Hkv)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(3):
            call(i)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            call(i)
    graph.replay()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    us = []
    for _ in range(samples):
        e0.record()
        graph.replay()
        e1.record()
        e1.synchronize()
        us.append(e0.elapsed_time(e1) * 1e3 / calls)
    med = statistics.median(us)
    return med, kv_bytes / (med * 1e-6) / 1e9


def run_bin(path, env_extra=None, extra_args=()):
    if not os.path.exists(path):
        return [], f"{os.path.basename(path)}: not found"
    env = dict(os.environ)
    env.update(env_extra or {})
    p = subprocess.run([path, *extra_args], capture_output=True, text=True, env=env)
    rows = []
    for line in p.stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    note = "" if p.returncode == 0 else f"{os.path.basename(path)} exited {p.returncode}: {p.stderr.strip()[-300:]}"
    return rows, note


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=".devbin")
    ap.add_argument("--samples", type=int, default=30)
    ap.add_argument("--json", default=None, help="also write every measurement here")
    ap.add_argument("--compare", default="", help="more bench folders (comma-separated): one prefill column each")
    args = ap.parse_args()

    props = torch.cuda.get_device_properties(0)
    print(f"device: {props.name}, {props.multi_processor_count} SMs; torch {torch.__version__}", flush=True)
    l2 = getattr(props, "L2_cache_size", 50 << 20)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")

    notes = []
    # Columns: the default kernel choice (wgmma on Hopper), the portable mma.sync kernel of the
    # same binary, then any --compare folders.
    variants = [args.bin, MMA_SYNC] + [v for v in args.compare.split(",") if v != ""]
    llmk_pre = {}
    for var in variants:
        if var == MMA_SYNC:
            rows, note = run_bin(os.path.join(args.bin, "attention_prefill_bench"),
                                 extra_args=["--kernel", "mma-sync"])
        else:
            rows, note = run_bin(os.path.join(var, "attention_prefill_bench"))
        if note:
            notes.append(note)
        for r in rows:
            llmk_pre[(var, r["B"], r["Hq"], r["Hkv"], r["S"], r["D"], r["causal"])] = r
    dec_rows, note = run_bin(os.path.join(args.bin, "attention_decode_bench"))
    if note:
        notes.append(note)
    llmk_dec = {}
    for r in dec_rows:  # the 16-key-page lines (the bench's first of each shape)
        if r.get("kind") == "decode" and r.get("page_size") == 16:
            llmk_dec.setdefault((r["B"], r["L"], r["Hq"], r["Hkv"], r["D"]), r)

    all_rows = []
    lines = []
    head = "| kind | shape | llmk | " + " | ".join(f"llmk {v}" for v in variants[1:]) + (" | " if len(variants) > 1 else "") + "SDPA flash | llmk / SDPA |"
    lines.append(head)
    lines.append("|" + "---|" * (head.count("|") - 1))
    for (B, Hq, Hkv, S, D, causal) in PREFILL:
        try:
            ms, tf = sdpa_prefill(B, Hq, Hkv, S, D, causal, args.samples, flush)
        except Exception as e:  # noqa: BLE001
            ms, tf = None, None
            notes.append(f"SDPA prefill B{B} H{Hq}/{Hkv} S{S} D{D}: {type(e).__name__}: {str(e)[:200]}")
        cells = []
        base = None
        for i, var in enumerate(variants):
            r = llmk_pre.get((var, B, Hq, Hkv, S, D, causal))
            if i == 0:
                base = r
            cells.append(f"{r['tflops']:.1f} TFLOP/s ({r['ms']:.3f} ms)" if r else "-")
        ratio = f"{base['tflops'] / tf:.2f}x" if base and tf else "-"
        sd = f"{tf:.1f} TFLOP/s ({ms:.3f} ms)" if tf else "-"
        shape = f"B{B} H{Hq}" + (f"/{Hkv}" if Hkv != Hq else "") + f" S{S} D{D} {'causal' if causal else 'full'}"
        lines.append(f"| prefill bf16 | {shape} | " + " | ".join(cells) + f" | {sd} | {ratio} |")
        all_rows.append({"kind": "prefill", "B": B, "Hq": Hq, "Hkv": Hkv, "S": S, "D": D, "causal": causal,
                         "sdpa_ms": ms, "sdpa_tflops": tf,
                         "llmk": {v: llmk_pre.get((v, B, Hq, Hkv, S, D, causal)) for v in variants}})
        print(lines[-1], flush=True)
    pad = " | -" * (len(variants) - 1)
    for (B, L, Hq, Hkv, D) in DECODE:
        try:
            us, gbps = sdpa_decode(B, L, Hq, Hkv, D, args.samples, l2)
        except Exception as e:  # noqa: BLE001
            us, gbps = None, None
            notes.append(f"SDPA decode B{B} L{L} H{Hq}/{Hkv} D{D}: {type(e).__name__}: {str(e)[:200]}")
        r = llmk_dec.get((B, L, Hq, Hkv, D))
        cell = f"{r['gbps']:.0f} GB/s ({r['us']:.1f} us)" if r else "-"
        sd = f"{gbps:.0f} GB/s ({us:.1f} us)" if gbps else "-"
        ratio = f"{r['gbps'] / gbps:.2f}x" if r and gbps else "-"
        lines.append(f"| decode bf16 | B{B} H{Hq}/{Hkv} L{L} D{D} | {cell}{pad} | {sd} | {ratio} |")
        all_rows.append({"kind": "decode", "B": B, "L": L, "Hq": Hq, "Hkv": Hkv, "D": D,
                         "sdpa_us": us, "sdpa_gbps": gbps, "llmk": r})
        print(lines[-1], flush=True)

    print()
    print(f"## Attention: llmk vs torch SDPA (flash backend), {props.name}")
    print()
    print("Prefill TFLOP/s count 4·B·H·S²·D, halved for causal (FA2's convention); decode GB/s = K+V bytes read / time.")
    print("Medians of CUDA-event timings after warm-up; prefill samples follow an L2 flush, decode rotates K/V sets (> 2x L2) in graph replays.")
    print(f"llmk = {variants[0]} (prefill: the wgmma kernel on Hopper); llmk mma.sync = the same binary's portable "
          "prefill kernel (--kernel mma-sync)" + ("; other llmk columns: the bench binaries in those folders" if len(variants) > 2 else "")
          + "; the ratio is llmk's.")
    print()
    for line in lines:
        print(line)
    for n in notes:
        print(f"\nnote: {n}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(all_rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
