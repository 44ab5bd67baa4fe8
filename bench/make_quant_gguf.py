#!/usr/bin/env python3
"""Writes a GGUF of a Llama-family shape with random quantised weights, for decode benchmarks
of quantised models (`llmk bench -m OUT --device cuda`, which keeps them quantised on the GPU),
with numpy only (the GPU machine has no network to fetch real models).

Every block is random bytes except its f16 scale fields, set to finite values of random sign
(so no weight is inf or NaN, and none is zero as a whole); the norms are f32 ones. No tokenizer:
`llmk bench` runs on random token ids.

Types: q4_k_m and q5_k_m (llama.cpp's mixes for a Llama: Q4_K or Q5_K, Q6_K for the output and
for attn_v and ffn_down of the layers llama.cpp gives more bits), q4_k, q5_k, q6_k, q8_0, q4_0,
q5_0, q5_1 (every matrix; q5_0 is what a Hugging Face AWQ checkpoint loads as).

    python3 bench/make_quant_gguf.py --shape llama-3-8b --type q4_k_m OUT.gguf
"""

import argparse
import struct
import sys
import time

import numpy as np

SHAPES = {
    # layers, d_model, ffn, heads, kv heads, vocab, rope base
    "llama-3-8b": (32, 4096, 14336, 32, 8, 128256, 500000.0),
    "qwen2.5-0.5b-llama": (24, 896, 4864, 14, 2, 151936, 1000000.0),
    "tiny": (2, 256, 512, 4, 2, 512, 10000.0),
}

# ggml type id, elements a block, bytes a block, offsets of the f16 scale fields in a block
TYPES = {
    "f32": (0, 1, 4, []),
    "q4_0": (2, 32, 18, [0]),
    "q5_0": (6, 32, 22, [0]),
    "q5_1": (7, 32, 24, [0, 2]),
    "q8_0": (8, 32, 34, [0]),
    "q4_k": (12, 256, 144, [0, 2]),
    "q5_k": (13, 256, 176, [0, 2]),
    "q6_k": (14, 256, 210, [208]),
}
SCALE = {"q4_0": 0.02, "q5_0": 0.01, "q5_1": 0.01, "q8_0": 0.001, "q4_k": 0.0005,
         "q5_k": 0.00025, "q6_k": 0.0002}


def use_more_bits(i, n):
    """llama.cpp's layers that get Q6_K for attn_v and ffn_down under Q4_K_M."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def tensors(shape, qtype):
    layers, d, ff, heads, kv_heads, vocab, _ = SHAPES[shape]
    hd = d // heads
    mix = qtype in ("q4_k_m", "q5_k_m")
    base = qtype[:4] if mix else qtype
    out = [("token_embd.weight", (vocab, d), base), ("output_norm.weight", (d,), "f32"),
           ("output.weight", (vocab, d), "q6_k" if mix else base)]
    for i in range(layers):
        b = f"blk.{i}."
        more = "q6_k" if mix and use_more_bits(i, layers) else base
        out += [(b + "attn_norm.weight", (d,), "f32"),
                (b + "attn_q.weight", (heads * hd, d), base),
                (b + "attn_k.weight", (kv_heads * hd, d), base),
                (b + "attn_v.weight", (kv_heads * hd, d), more),
                (b + "attn_output.weight", (d, heads * hd), base),
                (b + "ffn_norm.weight", (d,), "f32"),
                (b + "ffn_gate.weight", (ff, d), base),
                (b + "ffn_up.weight", (ff, d), base),
                (b + "ffn_down.weight", (d, ff), more)]
    return out


def gguf_string(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def kv(key, vtype, value):
    body = {4: lambda v: struct.pack("<I", v), 6: lambda v: struct.pack("<f", v),
            8: gguf_string}[vtype](value)
    return gguf_string(key) + struct.pack("<I", vtype) + body


def nbytes(shape, t):
    _, be, bb, _ = TYPES[t]
    n = int(np.prod(shape))
    return n // be * bb


def block_data(shape, t, rng):
    if t == "f32":
        return np.ones(int(np.prod(shape)), dtype=np.float32).tobytes()
    _, be, bb, fields = TYPES[t]
    blocks = int(np.prod(shape)) // be
    data = rng.integers(0, 256, size=(blocks, bb), dtype=np.uint8)
    for f in fields:
        mag = (0.5 + rng.random(blocks, dtype=np.float32)) * SCALE[t]
        sign = np.where(rng.random(blocks) < 0.5, -1.0, 1.0).astype(np.float32)
        data[:, f:f + 2] = (mag * sign).astype(np.float16).view(np.uint8).reshape(blocks, 2)
    return data.tobytes()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--shape", default="llama-3-8b", choices=sorted(SHAPES))
    ap.add_argument("--type", default="q4_k_m",
                    choices=["q4_k_m", "q5_k_m", "q4_k", "q5_k", "q6_k", "q8_0", "q4_0", "q5_0",
                             "q5_1"])
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    layers, d, ff, heads, kv_heads, vocab, rope = SHAPES[args.shape]
    ts = tensors(args.shape, args.type)
    meta = [kv("general.architecture", 8, "llama"), kv("general.alignment", 4, 32),
            kv("llama.block_count", 4, layers), kv("llama.embedding_length", 4, d),
            kv("llama.feed_forward_length", 4, ff), kv("llama.attention.head_count", 4, heads),
            kv("llama.attention.head_count_kv", 4, kv_heads), kv("llama.context_length", 4, 8192),
            kv("llama.vocab_size", 4, vocab), kv("llama.rope.freq_base", 6, rope),
            kv("llama.attention.layer_norm_rms_epsilon", 6, 1e-5)]
    infos, offset = [], 0
    for name, shape, t in ts:
        dims = list(reversed(shape))  # GGUF: the fastest dimension first
        infos.append(gguf_string(name) + struct.pack("<I", len(dims)) +
                     b"".join(struct.pack("<Q", x) for x in dims) +
                     struct.pack("<IQ", TYPES[t][0], offset))
        offset += (nbytes(shape, t) + 31) // 32 * 32
    head = b"GGUF" + struct.pack("<IQQ", 3, len(ts), len(meta)) + b"".join(meta) + b"".join(infos)
    rng = np.random.default_rng(args.seed)
    t0 = time.time()
    with open(args.out, "wb") as f:
        f.write(head + b"\0" * ((-len(head)) % 32))
        for i, (name, shape, t) in enumerate(ts):
            data = block_data(shape, t, rng)
            f.write(data + b"\0" * ((-len(data)) % 32))
            if sys.stderr.isatty():
                print(f"\r{i + 1}/{len(ts)} {name}", end="", file=sys.stderr)
    print(f"{args.out}: {args.shape} {args.type}, {offset / 2**30:.2f} GiB of tensors, "
          f"{time.time() - t0:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
