#!/usr/bin/env python3
"""llmk against Hugging Face transformers on the GPU, on the same random-weight models.

For each configuration (Qwen2.5-0.5B, Llama-3-8B, Gemma-3-270M, Phi-3-mini shapes) this builds a model with random
weights in bf16 with transformers' config classes, saves it as safetensors, and then:
  1. logits over prompt (prefill) and decode positions: transformers in float32 on the same
     bf16-rounded weights is the reference; llmk's relative error (||x - ref|| / ||ref|| per
     position) must be at most 1.5x that of transformers in bf16 at every position;
  2. batch-1 greedy decode of --gen tokens after a --prompt-token prompt: tokens/s of both.
Runs on the device machine (torch, transformers, a CUDA build of llmk):

    python3 bench/e2e_vs_hf.py --llmk build/cuda/llmk --out $OUT
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np
import torch
from transformers import AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig, Phi3Config, Qwen2Config

CONFIGS = {
    "qwen2.5-0.5b": lambda: Qwen2Config(
        hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
        intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True,
        max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6),
    "llama-3-8b": lambda: LlamaConfig(
        hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
        intermediate_size=14336, vocab_size=128256, tie_word_embeddings=False,
        max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5),
    # Gemma 3 270M's shapes: head dim 256, one KV head, 5 sliding-window layers : 1 global.
    # The window is shrunk to 64 so that the compared positions cross it.
    "gemma-3-270m": lambda: Gemma3TextConfig(
        hidden_size=640, num_hidden_layers=18, num_attention_heads=4, num_key_value_heads=1,
        head_dim=256, intermediate_size=2048, vocab_size=262144, max_position_embeddings=32768,
        sliding_window=64, query_pre_attn_scalar=256, rope_theta=1000000.0,
        rope_local_base_freq=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=True),
    # Phi-3-mini-4k's shapes: fused qkv and gate/up projections, head dim 96.
    "phi-3-mini": lambda: Phi3Config(
        hidden_size=3072, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
        intermediate_size=8192, vocab_size=32064, max_position_embeddings=4096,
        original_max_position_embeddings=4096, sliding_window=2047, rope_theta=10000.0,
        rms_norm_eps=1e-5, tie_word_embeddings=False, pad_token_id=32000),
}


def log(*a):
    print(*a, flush=True)


def rel_err(x, ref):
    return (np.linalg.norm(x - ref, axis=-1) / np.linalg.norm(ref, axis=-1))


def timed_generate(model, ids, new_tokens):
    torch.cuda.synchronize()
    t = time.perf_counter()
    out = model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                         pad_token_id=0)
    torch.cuda.synchronize()
    return time.perf_counter() - t, out


def build_model(name, args):
    folder = os.path.join(args.work, name)
    torch.manual_seed(0)
    cfg = CONFIGS[name]()
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.eval()
    model.save_pretrained(folder, safe_serialization=True)
    write_placeholder_tokenizer(folder, cfg.vocab_size)
    log(f"saved {folder} ({sum(p.numel() for p in model.parameters()) / 1e9:.2f} B parameters)")
    return cfg, model, folder


def write_placeholder_tokenizer(folder, vocab_size):
    """A byte-level BPE tokenizer.json covering every id of the random model, so that programs
    that need text (llmk serve) load the folder: the 256 byte tokens, then "tok<i>" pieces (no
    merges: text encodes to bytes, any id decodes)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    byte_chars = pre_tokenizers.ByteLevel.alphabet()
    vocab = {c: i for i, c in enumerate(sorted(byte_chars))}
    for i in range(len(vocab), vocab_size):
        vocab[f"tok{i}"] = i
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(os.path.join(folder, "tokenizer.json"))


def run_config(name, args):
    log(f"== {name}")
    cfg, model, folder = build_model(name, args)

    gen = torch.Generator().manual_seed(1)
    n = args.prompt + args.decode
    ids = torch.randint(0, cfg.vocab_size, (1, n), generator=gen)
    ids_path = os.path.join(args.work, f"{name}.ids")
    np.savetxt(ids_path, ids.numpy()[0], fmt="%d")
    ids = ids.cuda()

    with torch.no_grad():
        hf_bf16 = model(ids).logits[0].float().cpu().numpy()
        # Speed of transformers: greedy decode of --gen tokens after --prompt tokens.
        prompt = ids[:, : args.prompt]
        timed_generate(model, prompt, 2)  # warm-up
        t1, _ = timed_generate(model, prompt, 1)
        tn, _ = timed_generate(model, prompt, args.gen)
        hf_decode_tps = (args.gen - 1) / (tn - t1)
        model.float()
        ref = model(ids).logits[0].float().cpu().numpy()
    del model
    torch.cuda.empty_cache()

    out_path = os.path.join(args.work, f"{name}.logits")
    subprocess.run([args.llmk, "logits", "-m", folder, "--ids", ids_path, "--prefill",
                    str(args.prompt), "--out", out_path, "--device", "cuda"], check=True)
    llmk = np.fromfile(out_path, dtype=np.float32).reshape(n, -1)

    e_llmk, e_hf = rel_err(llmk, ref), rel_err(hf_bf16, ref)
    ratio = e_llmk / e_hf
    top1_llmk = float(np.mean(llmk.argmax(-1) == ref.argmax(-1)))
    top1_hf = float(np.mean(hf_bf16.argmax(-1) == ref.argmax(-1)))
    ok = bool(np.all(e_llmk <= 1.5 * e_hf)) and bool(np.all(np.isfinite(llmk)))

    bench_json = os.path.join(args.work, f"{name}.bench.json")
    subprocess.run([args.llmk, "bench", "-m", folder, "--prompt-tokens", str(args.prompt),
                    "--gen-tokens", str(args.gen), "--reps", "3", "--json", bench_json,
                    "--device", "cuda"], check=True)
    bench = json.load(open(bench_json))
    subprocess.run([args.llmk, "bench", "-m", folder, "--prompt-tokens", "512",
                    "--gen-tokens", "8", "--reps", "3", "--json", bench_json + ".512",
                    "--device", "cuda"], check=True)
    bench512 = json.load(open(bench_json + ".512"))
    res = {
        "config": name,
        "positions": n,
        "prefill_positions": args.prompt,
        "llmk_rel_err": {"max": float(e_llmk.max()), "median": float(np.median(e_llmk))},
        "hf_bf16_rel_err": {"max": float(e_hf.max()), "median": float(np.median(e_hf))},
        "max_ratio_llmk_over_hf_bf16": float(ratio.max()),
        "positions_over_1.5x": int(np.sum(e_llmk > 1.5 * e_hf)),
        "top1_agreement_llmk": top1_llmk,
        "top1_agreement_hf_bf16": top1_hf,
        "accuracy_ok": ok,
        "hf_eager_decode_tokens_per_s": hf_decode_tps,
        "llmk_decode_tokens_per_s": bench["decode_tokens_per_s"],
        "llmk_decode_ms_per_step": bench["decode_ms_per_step_median"],
        "llmk_prefill512_tokens_per_s": bench512["prefill_tokens_per_s"],
        "llmk_peak_gpu_mib": bench.get("peak_gpu_memory_mib"),
    }
    log(json.dumps(res, indent=1))
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llmk", default="build/cuda/llmk")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--decode", type=int, default=128, help="decode positions compared")
    ap.add_argument("--gen", type=int, default=256, help="tokens generated for the speed test")
    ap.add_argument("--work", default="/tmp/llmk-e2e")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--save-only", action="store_true", help="only write the models to --work")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    if args.save_only:
        for c in args.configs.split(","):
            build_model(c, args)
        return
    results = [run_config(c, args) for c in args.configs.split(",")]
    with open(os.path.join(args.out, "e2e_vs_hf.json"), "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "transformers": __import__("transformers").__version__, "results": results}, f,
                  indent=1)
    log("\n| config | llmk rel err max (median) | HF bf16 rel err max (median) | worst ratio | "
        "top-1 llmk / HF bf16 | decode tok/s llmk | HF eager | prefill 512 tok/s llmk |")
    log("|---|---|---|---|---|---|---|---|")
    for r in results:
        log(f"| {r['config']} | {r['llmk_rel_err']['max']:.2e} ({r['llmk_rel_err']['median']:.2e}) "
            f"| {r['hf_bf16_rel_err']['max']:.2e} ({r['hf_bf16_rel_err']['median']:.2e}) "
            f"| {r['max_ratio_llmk_over_hf_bf16']:.2f} | {r['top1_agreement_llmk']:.3f} / "
            f"{r['top1_agreement_hf_bf16']:.3f} | {r['llmk_decode_tokens_per_s']:.1f} | "
            f"{r['hf_eager_decode_tokens_per_s']:.1f} | {r['llmk_prefill512_tokens_per_s']:.0f} |")
    sys.exit(0 if all(r["accuracy_ok"] for r in results) else 1)


if __name__ == "__main__":
    main()
