#!/usr/bin/env python3
"""Writes tests/fixtures/families/<family>/: tiny random-weight models of each family llmk runs,
built with transformers' own config and model classes, and transformers' float32 CPU logits.

  llama3/  LlamaConfig with rope scaling "llama3" (original_max_position_embeddings 64 so that
           high, medium and low frequencies all occur at head dim 64), untied head
  qwen2/   Qwen2Config (q/k/v biases), tied embeddings, saved as two shards with
           model.safetensors.index.json
  phi3/    Phi3Config (fused qkv_proj and gate_up_proj), partial_rotary_factor 0.75,
           sliding_window 16 (transformers applies it to every layer)
  gemma3/  Gemma3TextConfig, 7 layers (5 local, 1 global, 1 local), sliding_window 8,
           query_pre_attn_scalar 24 (not the head dim), linear rope scaling 4 on the global layer

Each folder gets config.json, the safetensors, and:
  reference.json  the prompt's token ids (PROMPT_LEN random ids, longer than every window),
                  the logits' shape, and transformers' own bf16 run measured against its float32
                  run for the GPU tolerance: per row max_v |bf16 - f32| / max_v |f32| and
                  whether the top-1 agrees, with the worst row and the agreement rate
  logits.f32      transformers' float32 logits [PROMPT_LEN, vocab], row-major little-endian
  (llama3 only) reference.json's "llama_cpp_rope_freqs": the rope_freqs.weight tensor that
                  llama.cpp's convert_hf_to_gguf.py writes for this config, computed here the
                  converter's way, for the test that runs the model from a GGUF file

Weights are float32 and random at informative scales: matrices N(0, 1/fan_in), biases
N(0, 0.1^2), norm weights 1 + N(0, 0.1^2) (Gemma: N(0, 0.1^2), as it scales by 1 + w).
tokenizer.json / tokenizer_config.json in these folders come from another script; this one never
writes or deletes them.

Usage: scripts/make-family-fixtures.py [--out tests/fixtures/families]
"""

import argparse
import json
from pathlib import Path

import torch
from transformers import (Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM,
                          Phi3Config, Phi3ForCausalLM, Qwen2Config, Qwen2ForCausalLM)

VOCAB = 512
PROMPT_LEN = 48
# Head dim 64 (hidden 128, 2 query heads sharing 1 KV head): the smallest the CUDA attention
# kernels take, so the same fixtures serve the GPU tests.
COMMON = dict(vocab_size=VOCAB, hidden_size=128, intermediate_size=192, num_attention_heads=2,
              num_key_value_heads=1, max_position_embeddings=256, bos_token_id=1,
              eos_token_id=2, pad_token_id=0)


def families():
    return {
        "llama3": (LlamaForCausalLM, LlamaConfig(
            **COMMON, num_hidden_layers=3, rms_norm_eps=1e-5, tie_word_embeddings=False,
            rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                             "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 64})),
        "qwen2": (Qwen2ForCausalLM, Qwen2Config(
            **COMMON, num_hidden_layers=3, rms_norm_eps=1e-6, tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
        "phi3": (Phi3ForCausalLM, Phi3Config(
            **COMMON, num_hidden_layers=3, rms_norm_eps=1e-5, tie_word_embeddings=False,
            partial_rotary_factor=0.75, sliding_window=16)),
        "gemma3": (Gemma3ForCausalLM, Gemma3TextConfig(
            **COMMON, num_hidden_layers=7, head_dim=64, rms_norm_eps=1e-6, sliding_window=8,
            query_pre_attn_scalar=24, tie_word_embeddings=True,
            rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 4.0,
                                   "rope_theta": 1000000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})),
    }


def randomise(model: torch.nn.Module, gemma: bool) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 2:
                p.copy_(torch.randn_like(p) / p.shape[1] ** 0.5)
            elif name.endswith("bias"):
                p.copy_(torch.randn_like(p) * 0.1)
            else:  # norm weights
                p.copy_(torch.randn_like(p) * 0.1 + (0.0 if gemma else 1.0))


OWN_FILES = ["config.json", "generation_config.json", "model.safetensors",
             "model.safetensors.index.json", "reference.json", "logits.f32"]


def clear_own_files(folder: Path) -> None:
    for p in folder.glob("model-*.safetensors"):
        p.unlink()
    for name in OWN_FILES:
        (folder / name).unlink(missing_ok=True)


def llama_cpp_rope_freqs(rope: dict, head_dim: int) -> list:
    """The converter's LlamaModel.generate_extra_tensors (llama3 rope scaling), float32."""
    import math
    base, dim = rope["rope_theta"], head_dim
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old = rope["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old / low, old / high
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    out = []
    for freq in freqs.tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return out


def write_family(out: Path, name: str, cls, config, seed: int) -> None:
    torch.manual_seed(seed)
    config._attn_implementation = "eager"
    model = cls(config).float().eval()
    randomise(model, gemma=name == "gemma3")
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    clear_own_files(folder)
    # qwen2 goes into two shards with an index; the others are one model.safetensors.
    model.save_pretrained(str(folder), max_shard_size="1MB" if name == "qwen2" else "50MB")
    if name == "qwen2":
        assert (folder / "model.safetensors.index.json").exists(), "qwen2 should be sharded"

    g = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(0, VOCAB, (PROMPT_LEN,), generator=g)
    with torch.no_grad():
        ref = model(ids[None]).logits[0].float()
        bf16 = model.to(torch.bfloat16)(ids[None]).logits[0].double()
    refd = ref.double()
    rel = ((bf16 - refd).abs().amax(-1) / refd.abs().amax(-1))
    top1 = (bf16.argmax(-1) == refd.argmax(-1))
    (folder / "logits.f32").write_bytes(ref.contiguous().numpy().astype("<f4").tobytes())
    meta = {
        "family": name,
        "generator": "scripts/make-family-fixtures.py",
        "ids": ids.tolist(),
        "logits_file": "logits.f32",
        "logits_shape": list(ref.shape),
        "hf_bf16_max_rel_err": round(rel.max().item(), 6),
        "hf_bf16_top1_agreement": round(top1.double().mean().item(), 4),
        "hf_bf16_rel_err": [round(e, 6) for e in rel.tolist()],
        "hf_bf16_top1_agrees": top1.tolist(),
    }
    if name == "llama3":
        meta["llama_cpp_rope_freqs"] = llama_cpp_rope_freqs(
            config.rope_parameters, config.hidden_size // config.num_attention_heads)
    (folder / "reference.json").write_text(json.dumps(meta, indent=1) + "\n")
    size = sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
    print(f"{name}: {folder} ({size} bytes), bf16 max rel err {meta['hf_bf16_max_rel_err']}, "
          f"top-1 agreement {meta['hf_bf16_top1_agreement']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent.parent /
                                         "tests/fixtures/families"))
    args = ap.parse_args()
    out = Path(args.out)
    for seed, (name, (cls, config)) in enumerate(families().items()):
        write_family(out, name, cls, config, seed=100 + 10 * seed)


if __name__ == "__main__":
    main()
