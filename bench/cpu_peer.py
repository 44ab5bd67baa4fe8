"""llmk's CPU path beside llama.cpp (llama-cpp-python) on the same GGUF files, threads and prompt.

For each model and thread count, both engines in turn (runs interleaved): prompt tokens/s over a
prompt of about 128 tokens, then greedy generation of --gen tokens (end of text ignored), the
median of --runs runs. llmk: `llmk run`'s own report; llama.cpp: its perf counters
(llama_perf_context), as llama-bench reports them. Also this machine's read bandwidth (a
STREAM-like sum of a buffer larger than the caches, numpy, one thread a slice) and, for each
generation rate, the model's weight bytes a second against it (every tensor read once a token:
the tied output matrix included, the embedding rows not counted twice).

    pip install llama-cpp-python      # builds llama.cpp from source here (a few minutes)
    python3 bench/cpu_peer.py [--threads 1,2] [--runs 3] [--gen 64] [--json out.json]
                              [--models a.gguf,b.gguf] [--llmk build/cpu/llmk]
"""

import argparse
import concurrent.futures
import json
import os
import re
import statistics
import subprocess
import sys
import time

# About 128 tokens, the prompt of scripts/bench-cpu.sh too.
PROMPT = open(os.path.join(os.path.dirname(__file__), "cpu_prompt.txt")).read().rstrip("\n")
MODELS = ("models/SmolLM2-135M-Instruct.Q4_1.gguf", "models/gemma-3-270m-q4_k_m.gguf")


def read_bandwidth(threads, gib=1.0, reps=5):
    """GB/s of summing a float32 buffer of `gib` GiB, split over `threads` threads (numpy releases
    the GIL in its reductions); the best of `reps`."""
    import numpy as np
    a = np.ones(int(gib * 2**30) // 4, dtype=np.float32)
    parts = np.array_split(a, threads)
    best = float("inf")
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        for _ in range(reps):
            t0 = time.perf_counter()
            list(pool.map(np.sum, parts))
            best = min(best, time.perf_counter() - t0)
    return a.nbytes / best / 1e9


def weight_bytes(path):
    """Bytes of every tensor of the GGUF file (gguf package), less the token embeddings when the
    output matrix is a tensor of its own (then the embeddings are read one row a token)."""
    import gguf
    r = gguf.GGUFReader(path)
    sizes = {t.name: int(t.n_bytes) for t in r.tensors}
    total = sum(sizes.values())
    if "output.weight" in sizes:
        total -= sizes.get("token_embd.weight", 0)
    return total


LLMK_LINE = re.compile(r"prompt (\d+) tokens, ([\d.]+) tokens/s \| generation (\d+) tokens, "
                       r"([\d.]+) tokens/s")


def run_llmk(binary, model, threads, gen, extra=()):
    cmd = [binary, "run", "-m", model, "-p", PROMPT, "--temp", "0", "-n", str(gen),
           "--ignore-eos", "-t", str(threads), *extra]
    p = subprocess.run(cmd, capture_output=True, text=True)
    m = LLMK_LINE.search(p.stderr)
    if p.returncode != 0 or not m:
        sys.exit(f"cpu_peer: {' '.join(cmd[:4])} ... failed: {p.stderr.strip()[-300:]}")
    return int(m[1]), float(m[2]), int(m[3]), float(m[4])


class LlamaCpp:
    def __init__(self, model, threads):
        import llama_cpp
        self.lc = llama_cpp
        self.llm = llama_cpp.Llama(model_path=model, n_ctx=1024, n_batch=512, n_threads=threads,
                                   n_threads_batch=threads, verbose=False, seed=0)
        self.eos = self.llm.token_eos()

    def run(self, gen):
        self.llm.reset()  # no prompt prefix reused from the last run
        self.lc.llama_perf_context_reset(self.llm.ctx)
        self.llm.create_completion(PROMPT, max_tokens=gen, temperature=0.0, top_k=1,
                                   logit_bias={self.eos: -1e9})
        p = self.lc.llama_perf_context(self.llm.ctx)
        return (p.n_p_eval, 1e3 * p.n_p_eval / p.t_p_eval_ms, p.n_eval,
                1e3 * p.n_eval / p.t_eval_ms)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--llmk", default="build/cpu/llmk")
    ap.add_argument("--int8", action="store_true",
                    help="also run llmk with --cpu-int8 (8-bit activations against Q8_0 weights)")
    ap.add_argument("--json")
    args = ap.parse_args()
    try:
        import llama_cpp
    except ImportError:
        sys.exit("cpu_peer: needs llama-cpp-python (pip install llama-cpp-python)")
    if not os.access(args.llmk, os.X_OK):
        sys.exit(f"cpu_peer: {args.llmk} is not an executable (build the cpu preset first)")
    threads = [int(t) for t in args.threads.split(",")]
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                if line.startswith("model name")), "?")
    bw = {t: read_bandwidth(t) for t in threads}
    print(f"# {cpu}, {os.cpu_count()} logical CPUs; llama-cpp-python {llama_cpp.__version__}; "
          f"read bandwidth (numpy sum, 1 GiB): "
          + ", ".join(f"{t} threads {bw[t]:.1f} GB/s" for t in threads))
    print("| model | threads | llama.cpp prompt / gen tokens/s | llmk prompt / gen | llmk / peer "
          "prompt, gen | gen weight GB/s llmk, peer (share of read bw) |"
          + (" llmk --cpu-int8 gen, / peer |" if args.int8 else ""))
    print("|---|---|---|---|---|---|" + ("---|" if args.int8 else ""))
    rows = []
    for model in args.models.split(","):
        wb = weight_bytes(model)
        for t in threads:
            peer = LlamaCpp(model, t)
            ours, theirs, int8 = [], [], []
            for _ in range(args.runs):  # interleaved: all see the same machine state
                theirs.append(peer.run(args.gen))
                ours.append(run_llmk(args.llmk, model, t, args.gen))
                if args.int8:
                    int8.append(run_llmk(args.llmk, model, t, args.gen, ["--cpu-int8"]))
            del peer
            med = lambda xs, i: statistics.median(x[i] for x in xs)  # noqa: E731
            r = {"model": os.path.basename(model), "threads": t, "weight_bytes": wb,
                 "read_gbs": bw[t],
                 "peer_prompt_tokens": theirs[0][0], "peer_prompt_tps": med(theirs, 1),
                 "peer_gen_tps": med(theirs, 3),
                 "llmk_prompt_tokens": ours[0][0], "llmk_prompt_tps": med(ours, 1),
                 "llmk_gen_tps": med(ours, 3)}
            if args.int8:
                r["llmk_int8_gen_tps"] = med(int8, 3)
            rows.append(r)
            gbs = lambda tps: wb * tps / 1e9  # noqa: E731
            print(f"| {r['model']} | {t} | {r['peer_prompt_tps']:.1f} / {r['peer_gen_tps']:.1f} | "
                  f"{r['llmk_prompt_tps']:.1f} / {r['llmk_gen_tps']:.1f} | "
                  f"{r['llmk_prompt_tps'] / r['peer_prompt_tps']:.2f}x, "
                  f"{r['llmk_gen_tps'] / r['peer_gen_tps']:.2f}x | "
                  f"{gbs(r['llmk_gen_tps']):.1f} ({100 * gbs(r['llmk_gen_tps']) / bw[t]:.0f}%), "
                  f"{gbs(r['peer_gen_tps']):.1f} ({100 * gbs(r['peer_gen_tps']) / bw[t]:.0f}%) |"
                  + (f" {r['llmk_int8_gen_tps']:.1f}, "
                     f"{r['llmk_int8_gen_tps'] / r['peer_gen_tps']:.2f}x |" if args.int8 else ""),
                  flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": cpu, "read_gbs": bw, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
