#!/usr/bin/env python3
"""Distil Gemma 3 270M into a smaller, randomly initialised Gemma-3-shaped student.

The teacher is the Gemma 3 270M GGUF (scripts/fetch-models.sh gemma3), run once by llmk's engine
over the training text: llmk.LLM.teacher_topk writes each position's k largest logits (and the
log-sum-exp of its whole row) to a safetensors file, so training never runs the teacher again.
The student is a transformers Gemma 3 text model with fewer and narrower layers and the same
tokenizer (262,144 tokens, tied embeddings), its attention, norms, RoPE and MLP on llmk's kernels
(llmk.hf.apply). The loss is llmk.ops.fused_linear_distill_loss: KL(teacher || student) over
the teacher's top k at temperature T (gradients scaled by T^2), plus alpha times the hard-label
cross-entropy, computed in chunks of rows so that the [tokens, 262144] logits never exist.

    python3 examples/distill_gemma3.py                 # GPU: a few minutes
    python3 examples/distill_gemma3.py --smoke         # a few steps on the CPU (CI runs this)
    python3 examples/distill_gemma3.py --data a.txt b.txt --steps 2000 --out-dir runs/x

Writes to --out-dir: teacher_topk.safetensors, losses.json (per step: train loss; every
--eval-every steps: held-out loss and the student's cross-entropy) and loss.png (matplotlib,
where installed). The text defaults to this repository's README.md and docs/*.md, then the
Python standard library's modules, up to --max-tokens tokens; a tenth of the sequences is held
out.
"""
import argparse
import json
import math
import os
import random
import sys
import time
from pathlib import Path

import torch

import llmk
import llmk.hf
import llmk.ops as L

ROOT = Path(__file__).resolve().parents[1]


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--teacher", default=str(ROOT / "models" / "gemma-3-270m-q4_k_m.gguf"),
                    help="the teacher: a Gemma 3 GGUF file or Hugging Face folder")
    ap.add_argument("--data", nargs="*",
                    help="UTF-8 text files (default: README.md, docs/*.md, then the Python "
                         "standard library's modules)")
    ap.add_argument("--max-tokens", type=int, default=400_000, help="of text, at most")
    ap.add_argument("--out-dir", default="distill-gemma3")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16, help="sequences per step")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--k", type=int, default=64, help="teacher logits kept per position")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--alpha", type=float, default=0.1, help="weight of the hard-label loss")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--hidden", type=int, default=384)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true",
                    help="a tiny student, 16-token sequences, 6 steps on the CPU")
    a = ap.parse_args()
    if a.smoke:
        a.device, a.seq_len, a.batch, a.steps, a.k = "cpu", 16, 4, 6, 16
        a.max_tokens = 12 * 15
        a.layers, a.hidden, a.heads, a.eval_every = 2, 64, 2, 3
    return a


def default_files():
    """This repository's README and docs, then the Python standard library's own modules (text
    every machine with Python has), in a fixed order."""
    lib = Path(os.__file__).parent
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted(lib.glob("*.py"))]


def sequences(llm, files, seq_len, max_tokens):
    """The files' text as one token stream (at most max_tokens), cut into windows of
    seq_len - 1 tokens, each after the BOS token (Gemma's prompts start with it)."""
    bos = llm.tokenize("", add_bos=True)
    stream = []
    for f in files:
        if len(stream) >= max_tokens:
            break
        stream += llm.tokenize(Path(f).read_text(encoding="utf-8", errors="replace"),
                               add_bos=False)
    stream = stream[:max_tokens]
    n = seq_len - len(bos)
    return [bos + stream[i:i + n] for i in range(0, len(stream) - n + 1, n)]


def student_model(vocab, a):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig
    heads = a.heads
    cfg = Gemma3TextConfig(
        vocab_size=vocab, hidden_size=a.hidden, intermediate_size=4 * a.hidden,
        num_hidden_layers=a.layers, num_attention_heads=heads, num_key_value_heads=1,
        head_dim=a.hidden // heads, query_pre_attn_scalar=a.hidden // heads,
        max_position_embeddings=max(a.seq_len, 512),
        sliding_window=512, tie_word_embeddings=True, attn_implementation="sdpa")
    torch.manual_seed(a.seed)
    model = Gemma3ForCausalLM(cfg)
    return llmk.hf.apply(model)


def distill_loss(model, batch, top, a):
    """The mean over the batch's positions of the KL to the teacher's top k (and alpha times the
    cross-entropy of the next token; the last position of each sequence has none)."""
    ids = batch["tokens"]
    with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=ids.is_cuda):
        hidden = model.model(input_ids=ids).last_hidden_state
    labels = torch.roll(ids, -1, dims=1)
    labels[:, -1] = -100
    w = model.lm_head.weight
    return L.fused_linear_distill_loss(
        hidden.reshape(-1, hidden.shape[-1]).to(w.dtype), w,
        teacher_topk=(batch["values"].reshape(-1, a.k), batch["ids"].reshape(-1, a.k)),
        loss="kl", temperature=a.temperature, labels=labels.reshape(-1), alpha=a.alpha,
        reduction="batchmean")


def take(top, rows, device):
    """The file's rows of the sequences `rows` (all of one length) as [B, S, ...] tensors."""
    idx = torch.cat([torch.arange(int(top["offsets"][r]), int(top["offsets"][r + 1]))
                     for r in rows])
    B = len(rows)
    return {"tokens": top["tokens"][idx].long().view(B, -1).to(device),
            "ids": top["ids"][idx].view(B, -1, top["k"]).to(device),
            "values": top["values"][idx].view(B, -1, top["k"]).to(device)}


def chart(path, log):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"no matplotlib: no chart at {path} (losses.json has the numbers)", file=sys.stderr)
        return
    plt.figure(figsize=(7, 4))
    plt.plot([r["step"] for r in log["train"]], [r["loss"] for r in log["train"]], lw=0.8,
             label="train: KL to the teacher's top k + alpha CE")
    if log["eval"]:
        plt.plot([r["step"] for r in log["eval"]], [r["loss"] for r in log["eval"]], "o-",
                 label="held out: the same loss")
        plt.plot([r["step"] for r in log["eval"]], [r["ce"] for r in log["eval"]], "s--",
                 label="held out: student cross-entropy")
    plt.xlabel("step")
    plt.ylabel("nats per token")
    plt.title(log["title"], fontsize=9)
    plt.legend()
    plt.tight_layout()
    plt.savefig(path)
    print(f"wrote {path}")


def main():
    a = parse_args()
    if not Path(a.teacher).exists():
        sys.exit(f"distill_gemma3: {a.teacher} not found (scripts/fetch-models.sh gemma3, or "
                 "--teacher)")
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = a.data or default_files()
    teacher = llmk.LLM(a.teacher, context=a.seq_len)
    seqs = sequences(teacher, files, a.seq_len, a.max_tokens)
    if len(seqs) < 4:
        sys.exit(f"distill_gemma3: {len(seqs)} sequences of {a.seq_len} tokens in the text: "
                 "too few (more --data, or a shorter --seq-len)")
    path = out / "teacher_topk.safetensors"
    print(f"teacher {teacher} on {teacher.device}: top {a.k} logits of {len(seqs)} sequences of "
          f"{a.seq_len} tokens ...", flush=True)
    st = teacher.teacher_topk(seqs, path, k=a.k)
    print(f"  {st['positions']} positions in {st['seconds']:.1f} s -> {path}")
    top = L.load_teacher_topk(path)
    vocab = top["vocab_size"]
    del teacher

    random.seed(a.seed)
    order = list(range(len(seqs)))
    random.shuffle(order)
    n_eval = max(1, len(seqs) // 10) if not a.smoke else 2
    held, train = order[:n_eval], order[n_eval:]
    if a.smoke:
        train = train[:a.batch]  # a few steps must visibly lower the loss: one batch, repeated
    dev = torch.device(a.device)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    model = student_model(vocab, a).to(dev)
    params = sum(p.numel() for p in model.parameters())
    print(f"student: {a.layers} layers, hidden {a.hidden}, {params / 1e6:.1f} M parameters "
          f"({vocab * a.hidden / 1e6:.1f} M of them the tied embedding), on {dev}")
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / max(1, a.steps // 20))
        * 0.5 * (1 + math.cos(math.pi * min(s, a.steps) / a.steps)))
    held_batch = take(top, held, dev)

    def evaluate():
        model.eval()
        with torch.no_grad():
            loss = distill_loss(model, held_batch, top, a).item()
            ids = held_batch["tokens"]
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
                hidden = model.model(input_ids=ids).last_hidden_state
            labels = torch.roll(ids, -1, dims=1)
            labels[:, -1] = -100
            w = model.lm_head.weight
            ce = L.fused_linear_cross_entropy(hidden.reshape(-1, hidden.shape[-1]).to(w.dtype),
                                              w, labels.reshape(-1)).item()
        model.train()
        return loss, ce

    log = {"args": {k: v for k, v in vars(a).items() if k != "data"}, "train": [], "eval": [],
           "title": f"Gemma 3 270M -> {a.layers} x {a.hidden} student ({params / 1e6:.0f} M), "
                    f"top-{a.k} KL, T {a.temperature}, alpha {a.alpha}"}
    t0 = time.time()
    for step in range(1, a.steps + 1):
        rows = random.sample(train, min(a.batch, len(train)))
        loss = distill_loss(model, take(top, rows, dev), top, a)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        log["train"].append({"step": step, "loss": loss.item()})
        if step % a.eval_every == 0 or step == a.steps:
            ev, ce = evaluate()
            log["eval"].append({"step": step, "loss": ev, "ce": ce})
            print(f"step {step:5d}  train {loss.item():.3f}  held out {ev:.3f}  student CE "
                  f"{ce:.3f}  ({time.time() - t0:.0f} s)", flush=True)
    log["seconds"] = time.time() - t0
    (out / "losses.json").write_text(json.dumps(log, indent=1))
    chart(out / "loss.png", log)


if __name__ == "__main__":
    main()
