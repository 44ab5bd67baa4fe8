#!/usr/bin/env python3
"""Writes the reference fixtures for the real-model tests, from Hugging Face transformers.

Runs on a developer machine (not in CI): needs torch, transformers, accelerate and gguf.
transformers loads the GGUF with its own loader (dequantising every tensor to float32) and
runs the model on the CPU in float32. For each prompt it records the token ids, transformers'
greedy continuation of 32 tokens, and the top-20 logits (ids and values) at every position of
prompt + continuation.

    python3 scripts/make-fixtures.py                       # SmolLM2 (ChatML, no BOS)
    python3 scripts/make-fixtures.py --family gemma3 --model models/gemma-3-270m-q4_k_m.gguf \
        --out tests/fixtures/gemma3_reference.json            # Gemma 3 (its turns, BOS)
"""
import argparse
import json
import os

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "<|im_start|>user\nWhat is the tallest mountain in the world?<|im_end|>\n<|im_start|>assistant\n",
    "Once upon a time, in a small village at the edge of a great forest, there lived an old "
    "woodcutter and his three children. Every morning",
    "La tour Eiffel se trouve à Paris. Elle mesure",
    "Q: What is 12 + 30?\nA:",
]
# Gemma's chat turns instead of ChatML; everything else as above.
GEMMA_PROMPTS = [p if not p.startswith("<|im_start|>") else
                 "<start_of_turn>user\nWhat is the tallest mountain in the world?<end_of_turn>\n"
                 "<start_of_turn>model\n" for p in PROMPTS]
CONTINUATION = 32
TOP_K = 20


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--out", default="tests/fixtures/smollm2_reference.json")
    ap.add_argument("--family", choices=["smollm2", "gemma3"], default="smollm2")
    args = ap.parse_args()
    folder, name = os.path.split(os.path.abspath(args.model))
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    model.eval()
    model_bf16 = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.bfloat16)
    model_bf16.eval()

    cases = []
    gemma = args.family == "gemma3"
    for text in (GEMMA_PROMPTS if gemma else PROMPTS):
        # Gemma expects its BOS token first (the tokenizer adds it); SmolLM2 has none.
        ids = tok(text, add_special_tokens=gemma).input_ids
        with torch.no_grad():
            # Plain argmax over transformers' logits, continuing past end-of-text tokens
            # (generate() with min_new_tokens would suppress EOS and pick the runner-up).
            seq = list(ids)
            for _ in range(CONTINUATION):
                seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
            cont = seq[len(ids):]
            # One full forward pass over prompt + continuation gives the logits at every position.
            logits = model(torch.tensor([seq])).logits[0].float()
            bf16 = model_bf16(torch.tensor([seq])).logits[0].double()
        ref = logits.double()
        bf16_err = ((bf16 - ref).norm(dim=-1) / ref.norm(dim=-1)).tolist()
        bf16_top1 = (bf16.argmax(-1) == ref.argmax(-1)).tolist()
        vals, idx = torch.topk(logits, TOP_K, dim=-1)
        cases.append({
            "text": text,
            "ids": ids,
            "continuation": cont,
            "continuation_text": tok.decode(cont),
            "top_ids": idx.tolist(),
            "top_logits": [[round(v, 5) for v in row] for row in vals.tolist()],
            "hf_bf16_rel_err": [round(e, 6) for e in bf16_err],
            "hf_bf16_top1_agrees": bf16_top1,
        })
        print(repr(text[:40]), "->", repr(tok.decode(cont)[:60]))

    with open(args.out, "w") as f:
        json.dump({
            "model": name,
            "add_bos": gemma,
            "reference": "transformers %s, torch %s, float32 on the CPU, GGUF dequantised by transformers"
                         % (__import__("transformers").__version__, torch.__version__),
            "top_k": TOP_K,
            "cases": cases,
        }, f, separators=(",", ":"))
    print("wrote", args.out, os.path.getsize(args.out), "bytes")


if __name__ == "__main__":
    main()
