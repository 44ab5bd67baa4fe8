#!/usr/bin/env python3
"""A serving benchmark for `llmk serve` (or any OpenAI-compatible server), like vLLM's: C
concurrent streaming clients send /v1/completions requests of random token ids (P prompt
tokens, O output tokens, end-of-sequence ignored) until N requests are done.

    python3 bench/serve.py --base http://127.0.0.1:8080 --model NAME --concurrency 64 \\
        --prompt-tokens 256 --output-tokens 256 --requests 256 [--json FILE] [--png FILE]
    python3 bench/serve.py --launch "llmk serve -m MODEL --device cuda" ...  # starts it first

Reports, from the clients' side: time to first token (TTFT), time per output token after the
first (TPOT), inter-token latency (ITL: the gaps between streamed tokens), each at p50 / p99 in
ms; requests/s and output tokens/s over the run's wall time. Standard library only (threads and
http.client); a chart with matplotlib where installed.
"""
import argparse
import http.client
import json
import random
import shlex
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request


def percentile(xs, q):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q / 100 * (len(xs) - 1))))]


def one_request(host, port, model, prompt, out_tokens, headers):
    """(ttft s, [token arrival times], output tokens, ok) of one streamed completion."""
    body = {"model": model, "prompt": prompt, "max_tokens": out_tokens, "temperature": 0,
            "stream": True, "ignore_eos": True}
    conn = http.client.HTTPConnection(host, port, timeout=600)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", json.dumps(body), headers)
    resp = conn.getresponse()
    if resp.status != 200:
        return None, [], 0, f"HTTP {resp.status}: {resp.read()[:200]!r}"
    arrivals, buf, done = [], b"", False
    while not done:
        chunk = resp.read1(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            if not event.startswith(b"data: "):
                continue
            data = event[6:]
            if data == b"[DONE]":
                done = True
                break
            j = json.loads(data)
            if j.get("choices") and j["choices"][0].get("text"):
                arrivals.append(time.perf_counter())
    conn.close()
    if not done:
        return None, [], 0, "the stream ended without [DONE]"
    ttft = arrivals[0] - t0 if arrivals else None
    return ttft, [t0] + arrivals, len(arrivals), None


def run(args):
    u = urllib.parse.urlparse(args.base)
    headers = {"Content-Type": "application/json"}
    if args.api_key:
        headers["Authorization"] = f"Bearer {args.api_key}"
    rng = random.Random(args.seed)
    prompts = [[rng.randrange(100, args.vocab) for _ in range(args.prompt_tokens)]
               for _ in range(args.requests)]
    lock = threading.Lock()
    next_i = [0]
    results = []

    def worker():
        while True:
            with lock:
                i = next_i[0]
                if i >= len(prompts):
                    return
                next_i[0] += 1
            r = one_request(u.hostname, u.port, args.model, prompts[i], args.output_tokens, headers)
            with lock:
                results.append(r)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(args.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    failed = [r[3] for r in results if r[3]]
    ok = [r for r in results if not r[3]]
    ttft = [r[0] * 1e3 for r in ok if r[0] is not None]
    itl = [(b - a) * 1e3 for r in ok for a, b in zip(r[1][1:], r[1][2:])]
    tpot = [(r[1][-1] - r[1][1]) * 1e3 / (r[2] - 1) for r in ok if r[2] > 1]
    out_tokens = sum(r[2] for r in ok)
    row = {
        "concurrency": args.concurrency, "requests": len(results), "failed": len(failed),
        "prompt_tokens": args.prompt_tokens, "output_tokens": args.output_tokens,
        "wall_s": round(wall, 3), "requests_per_s": round(len(ok) / wall, 2),
        "output_tokens_per_s": round(out_tokens / wall, 1),
        "ttft_ms_p50": round(percentile(ttft, 50), 1), "ttft_ms_p99": round(percentile(ttft, 99), 1),
        "tpot_ms_p50": round(percentile(tpot, 50), 2), "tpot_ms_p99": round(percentile(tpot, 99), 2),
        "itl_ms_p50": round(percentile(itl, 50), 2), "itl_ms_p99": round(percentile(itl, 99), 2),
        "ttft_ms_mean": round(statistics.fmean(ttft), 1) if ttft else None,
    }
    if failed:
        row["first_failure"] = failed[0]
    return row


def wait_healthy(base, proc=None, seconds=600):
    for _ in range(seconds * 10):
        if proc is not None and proc.poll() is not None:
            sys.exit(f"serve: the launched server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(base + "/health", timeout=1) as r:
                if r.status == 200:
                    return
        except Exception:  # noqa: BLE001 (not up yet)
            pass
        time.sleep(0.1)
    sys.exit(f"serve: {base}/health did not answer 200")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default="http://127.0.0.1:8080")
    ap.add_argument("--model", required=True, help="the served model's id (GET /v1/models)")
    ap.add_argument("--launch", help="a server command to start first (and stop at the end)")
    ap.add_argument("--api-key")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[64],
                    help="one run per value")
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--output-tokens", type=int, default=256)
    ap.add_argument("--requests", type=int, default=0,
                    help="requests per run (default: 4 x the concurrency)")
    ap.add_argument("--vocab", type=int, default=32000, help="token ids are drawn below this")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json")
    ap.add_argument("--png")
    args = ap.parse_args()
    proc = None
    if args.launch:
        proc = subprocess.Popen(shlex.split(args.launch))
    try:
        wait_healthy(args.base, proc)
        rows = []
        print("| concurrency | requests (failed) | output tokens/s | requests/s | TTFT p50 / p99 ms "
              "| TPOT p50 / p99 ms | ITL p50 / p99 ms |")
        print("|---|---|---|---|---|---|---|")
        for c in args.concurrency:
            a = argparse.Namespace(**vars(args))
            a.concurrency = c
            a.requests = args.requests or 4 * c
            r = run(a)
            rows.append(r)
            print(f"| {c} | {r['requests']} ({r['failed']}) | {r['output_tokens_per_s']} | "
                  f"{r['requests_per_s']} | {r['ttft_ms_p50']} / {r['ttft_ms_p99']} | "
                  f"{r['tpot_ms_p50']} / {r['tpot_ms_p99']} | {r['itl_ms_p50']} / "
                  f"{r['itl_ms_p99']} |", flush=True)
            if r["failed"]:
                print(f"first failure: {r['first_failure']}", file=sys.stderr)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"base": args.base, "model": args.model, "runs": rows}, f, indent=1)
        if args.png:
            sys.path.insert(0, __file__.rsplit("/", 1)[0])
            from chart import bar_chart
            bar_chart(args.png, [str(r["concurrency"]) for r in rows],
                      {"output tokens/s": [r["output_tokens_per_s"] for r in rows]},
                      f"llmk serve: {args.prompt_tokens} in / {args.output_tokens} out",
                      "output tokens/s")
        return 1 if any(r["failed"] for r in rows) else 0
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=60)


if __name__ == "__main__":
    sys.exit(main())
