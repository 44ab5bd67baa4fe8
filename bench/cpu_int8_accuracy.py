#!/usr/bin/env python3
"""How far `llmk --cpu-int8` and llama.cpp move a model's logits from llmk's f32 CPU path.

For each model: bench/cpu_prompt.txt tokenised by llmk, its logits through `llmk logits --prefill 1`
(one prefill token, then a decode step per token: the rows --cpu-int8 changes) with and without
--cpu-int8, and llama.cpp's (llama-cpp-python, one token per batch, logits_all) for the same ids.
Prints, for each against llmk's f32 rows: the largest |difference|, the median over rows of the
row's largest, and the share of rows whose argmax agrees.

    python3 bench/cpu_int8_accuracy.py [--models a.gguf,b.gguf] [--llmk build/cpu/llmk] [-t N]
"""

import argparse
import os
import subprocess
import tempfile

import numpy as np

MODELS = ["models/SmolLM2-135M-Instruct.Q4_1.gguf", "models/gemma-3-270m-q4_k_m.gguf"]


def llmk_logits(binary, model, ids_file, threads, extra, out):
    subprocess.run([binary, "logits", "-m", model, "--device", "cpu", "--ids", ids_file,
                    "--prefill", "1", "--out", out, "-t", str(threads), *extra],
                   check=True, capture_output=True)
    return np.fromfile(out, dtype=np.float32)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--llmk", default="build/cpu/llmk")
    ap.add_argument("-t", "--threads", type=int, default=2)
    args = ap.parse_args()
    import llama_cpp
    prompt = open(os.path.join(os.path.dirname(__file__), "cpu_prompt.txt")).read()
    print("| model | rows | against llmk f32 | largest difference | median row's largest | "
          "argmax agrees |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models.split(","):
            ids = subprocess.run([args.llmk, "tokenize", "-m", model, "--ids-only", prompt],
                                 check=True, capture_output=True, text=True).stdout.split()
            ids_file = os.path.join(tmp, "ids.txt")
            open(ids_file, "w").write(" ".join(ids))
            n = len(ids)
            f32 = llmk_logits(args.llmk, model, ids_file, args.threads, [], tmp + "/a.bin")
            int8 = llmk_logits(args.llmk, model, ids_file, args.threads, ["--cpu-int8"],
                               tmp + "/b.bin")
            f32, int8 = f32.reshape(n, -1), int8.reshape(n, -1)
            llm = llama_cpp.Llama(model_path=model, n_ctx=max(512, 2 * n), n_batch=1, n_ubatch=1,
                                  n_threads=args.threads, logits_all=True, verbose=False)
            llm.eval([int(t) for t in ids])
            peer = np.array(llm.scores[:n], dtype=np.float32)
            del llm
            vocab = min(f32.shape[1], peer.shape[1])
            ref = f32[1:, :vocab]  # row 0 is the prefill's: the f32 path either way
            for name, x in (("llmk --cpu-int8", int8[1:, :vocab]), ("llama.cpp", peer[1:, :vocab])):
                d = np.abs(x - ref)
                print(f"| {os.path.basename(model)} | {n - 1} | {name} | {d.max():.3f} | "
                      f"{np.median(d.max(axis=1)):.3f} | "
                      f"{100 * (x.argmax(1) == ref.argmax(1)).mean():.1f}% |", flush=True)


if __name__ == "__main__":
    main()
