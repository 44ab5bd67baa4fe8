#!/usr/bin/env python3
"""Writes tests/fixtures/safetensors/: files made by the `safetensors` and `transformers`
packages (implementations independent of llmk's), for tests/formats/safetensors_test and
hf_config_test.

  single.safetensors   f32, f16, bf16, i32, i8, 0-d and empty tensors with random values, and
                       __metadata__, written by safetensors.torch.save_file
  tiny-llama/          a random LlamaForCausalLM (hidden 16, 2 layers, vocab 64, bf16) saved by
                       save_pretrained(max_shard_size=...) as two shards with
                       model.safetensors.index.json, config.json and generation_config.json
  expected.json        for every tensor: dtype, shape, the float64 sum of its values, its first
                       four values and its last one (and its shard); the config values

Usage: scripts/make-safetensors-fixtures.py [--out tests/fixtures/safetensors]
"""

import argparse
import json
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM

DTYPE_NAMES = {
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int32: "I32",
    torch.int8: "I8",
}


def describe(t: torch.Tensor) -> dict:
    flat = t.reshape(-1).to(torch.float64)  # exact for every dtype used here
    return {
        "dtype": DTYPE_NAMES[t.dtype],
        "shape": list(t.shape),
        "sum": flat.sum().item(),
        "first": flat[:4].tolist(),
        "last": flat[-1].item() if flat.numel() > 0 else None,
    }


def single_file(out: Path) -> dict:
    g = torch.Generator().manual_seed(1234)
    tensors = {
        "a.f32": torch.randn(3, 5, generator=g),
        "b.f16": torch.randn(4, 7, generator=g).to(torch.float16),
        "c.bf16": torch.randn(2, 3, 4, generator=g).to(torch.bfloat16),
        "d.i32": torch.randint(-100000, 100000, (6,), generator=g, dtype=torch.int32),
        "e.i8": torch.randint(-128, 128, (2, 5), generator=g, dtype=torch.int8),
        "scalar.f32": torch.tensor(-3.25),
        "empty.bf16": torch.zeros(0, 4, dtype=torch.bfloat16),
    }
    metadata = {"format": "pt", "producer": "make-safetensors-fixtures.py"}
    save_file(tensors, str(out / "single.safetensors"), metadata=metadata)
    return {
        "file": "single.safetensors",
        "metadata": metadata,
        "tensors": {name: describe(t) for name, t in tensors.items()},
    }


def tiny_llama(out: Path) -> dict:
    torch.manual_seed(5678)
    config = LlamaConfig(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=64,
        max_position_embeddings=128,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():  # norms start at ones: make every value informative
            p.copy_(torch.randn_like(p) * 0.5)
    model = model.to(torch.bfloat16)
    folder = out / "tiny-llama"
    shutil.rmtree(folder, ignore_errors=True)
    model.save_pretrained(str(folder), max_shard_size="10KB")

    index = json.loads((folder / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) == 2, f"expected two shards, got {shards}"
    tensors = {}
    for shard in shards:  # read back what was written, through the safetensors package
        with safe_open(str(folder / shard), framework="pt") as f:
            for name in f.keys():
                tensors[name] = dict(describe(f.get_tensor(name)), shard=shard)
    config_json = json.loads((folder / "config.json").read_text())
    return {"folder": "tiny-llama", "shards": shards, "tensors": tensors, "config": config_json}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent.parent /
                                         "tests/fixtures/safetensors"))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    expected = {"single": single_file(out), "tiny_llama": tiny_llama(out)}
    (out / "expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")
    total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"wrote {out} ({total} bytes)")


if __name__ == "__main__":
    main()
