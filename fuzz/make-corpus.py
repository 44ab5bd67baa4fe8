#!/usr/bin/env python3
"""Writes the seed corpus of every fuzz target (fuzz/*.cpp) from the test fixtures
(tests/fixtures/**), into <out>/<target>/. Nothing here is committed: fuzz/run.sh calls this
before each run, so the seeds follow the fixtures.

The fixtures hold no GGUF file, so the GGUF seeds are written here: a small model of each
architecture llmk reads (tensors of every ggml type, blocks taken from tests/fixtures/quant),
and tokenizer files built from the tokenizer.json fixtures (byte-level BPE with merges, and
SentencePiece-style with scores and token types).

Usage: fuzz/make-corpus.py [--out build/fuzz/seeds]
"""

import argparse
import hashlib
import json
import struct
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
MAX_SEED_BYTES = 64 << 10  # larger inputs slow every mutation; the fixtures above it are skipped

# ---- GGUF -----------------------------------------------------------------------------------

U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
SCALAR_FORMATS = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
                  BOOL: "<?", U64: "<Q", I64: "<q", F64: "<d"}
GGML_F32, GGML_F16, GGML_BF16 = 0, 1, 30


def gguf_string(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def gguf_value(vtype, v):
    if vtype == STRING:
        return gguf_string(v)
    if vtype == ARRAY:
        elem, items = v
        return struct.pack("<IQ", elem, len(items)) + b"".join(gguf_value(elem, x) for x in items)
    return struct.pack(SCALAR_FORMATS[vtype], v)


def gguf_file(metadata, tensors, version=3, alignment=32):
    """metadata: [(key, type, value)]; tensors: [(name, ne (innermost first), ggml type, bytes)]."""
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(metadata))
    for key, vtype, v in metadata:
        out += gguf_string(key) + struct.pack("<I", vtype) + gguf_value(vtype, v)
    data, offsets = b"", []
    for _, _, _, raw in tensors:
        data += b"\0" * (-len(data) % alignment)
        offsets.append(len(data))
        data += raw
    for (name, ne, ggml_type, _), offset in zip(tensors, offsets):
        out += gguf_string(name) + struct.pack("<I", len(ne))
        out += b"".join(struct.pack("<Q", n) for n in ne) + struct.pack("<IQ", ggml_type, offset)
    out += b"\0" * (-len(out) % alignment)
    return out + data


def quant_blocks():
    """(ggml type, weights, raw block bytes) of each dequantisation fixture in
    tests/fixtures/quant (make_quant.py's; make_quantize.py's quantize_*.bin hold quantiser inputs
    and outputs in another format)."""
    blocks = []
    for path in sorted((FIXTURES / "quant").glob("*.bin")):
        if path.name.startswith("quantize_"):
            continue
        raw = path.read_bytes()
        assert raw[:8] == b"LLMKQFX1", path
        ggml_type, n, nbytes = struct.unpack_from("<III", raw, 8)
        blocks.append((ggml_type, n, raw[20:20 + nbytes]))
    return blocks


def model_gguf(arch, quant):
    """A one-layer model of `arch` whose tensors are the quant fixtures' blocks."""
    p = arch + "."
    metadata = [
        ("general.architecture", STRING, arch),
        ("general.name", STRING, f"fuzz seed {arch}"),
        ("general.alignment", U32, 32),
        (p + "block_count", U32, 1),
        (p + "context_length", U32, 128),
        (p + "embedding_length", U32, 64),
        (p + "feed_forward_length", U32, 128),
        (p + "attention.head_count", U32, 4),
        (p + "attention.head_count_kv", U32, 2),
        (p + "attention.layer_norm_rms_epsilon", F32, 1e-6),
        (p + "rope.freq_base", F32, 10000.0),
        (p + "rope.dimension_count", U32, 16),
        (p + "vocab_size", U32, 32),
        ("general.tags", ARRAY, (STRING, ["a", "b"])),
        ("general.nested", ARRAY, (ARRAY, [(I32, [1, -2]), (F64, [0.5])])),
    ]
    if arch == "gemma3":
        metadata += [(p + "attention.sliding_window", U32, 16),
                     (p + "attention.key_length", U32, 16),
                     (p + "attention.value_length", U32, 16)]
    if arch == "llama":
        metadata += [(p + "rope.scaling.type", STRING, "linear"),
                     (p + "rope.scaling.factor", F32, 2.0)]
    tensors = [(f"blk.0.{ggml_type}.weight", [n], ggml_type, raw) for ggml_type, n, raw in quant]
    tensors.append(("token_embd.weight", [64, 32], GGML_F32, bytes(64 * 32 * 4)))
    tensors.append(("output_norm.weight", [64], GGML_F16, bytes(64 * 2)))
    return gguf_file(metadata, tensors)


def all_value_types_gguf(version):
    metadata = [(f"k.{vtype}", vtype, v) for vtype, v in
                [(U8, 255), (I8, -1), (U16, 65535), (I16, -2), (U32, 7), (I32, -3), (F32, 1.5),
                 (BOOL, True), (STRING, "s\u00e9"), (U64, 2**63), (I64, -(2**40)), (F64, -0.25)]]
    metadata.append(("k.array", ARRAY, (U8, [1, 2, 3])))
    return gguf_file(metadata, [("t", [4, 2], GGML_BF16, bytes(16))], version=version)


def vocab_by_id(tokenizer_json):
    model = tokenizer_json["model"]
    tokens = [""] * (max(model["vocab"].values()) + 1)
    for text, i in model["vocab"].items():
        tokens[i] = text
    specials = {}
    for added in tokenizer_json.get("added_tokens", []):
        if added["id"] >= len(tokens):
            tokens += [""] * (added["id"] + 1 - len(tokens))
        tokens[added["id"]] = added["content"]
        specials[added["id"]] = added.get("special", False)
    return tokens, specials


def tokenizer_gguf(tokenizer_json, model, pre, chat_template):
    """The tokenizer.ggml.* keys of a GGUF file holding this tokenizer.json's vocabulary."""
    tokens, specials = vocab_by_id(tokenizer_json)
    types = []
    for i, t in enumerate(tokens):
        if i in specials:
            types.append(3 if specials[i] else 4)  # control, user-defined
        elif len(t) == 6 and t.startswith("<0x") and t.endswith(">"):
            types.append(6)  # byte
        else:
            types.append(1)
    metadata = [
        ("general.architecture", STRING, "llama"),
        ("tokenizer.ggml.model", STRING, model),
        ("tokenizer.ggml.tokens", ARRAY, (STRING, tokens)),
        ("tokenizer.ggml.token_type", ARRAY, (I32, types)),
        ("tokenizer.ggml.bos_token_id", U32, next(iter(specials), 0)),
        ("tokenizer.ggml.eos_token_id", U32, list(specials)[-1] if specials else 0),
        ("tokenizer.ggml.add_bos_token", BOOL, True),
    ]
    if model == "gpt2":
        merges = [m if isinstance(m, str) else " ".join(m)
                  for m in tokenizer_json["model"]["merges"]]
        metadata += [("tokenizer.ggml.pre", STRING, pre),
                     ("tokenizer.ggml.merges", ARRAY, (STRING, merges))]
    else:
        metadata += [("tokenizer.ggml.scores", ARRAY, (F32, [-float(i) for i in range(len(tokens))])),
                     ("tokenizer.ggml.add_space_prefix", BOOL, False)]
    if chat_template:
        metadata.append(("tokenizer.chat_template", STRING, chat_template))
    return gguf_file(metadata, [])


# ---- safetensors ----------------------------------------------------------------------------

def small_safetensors(path, max_data=16 << 10):
    """The tensors of `path` that fit in max_data bytes, as a file of their own."""
    raw = path.read_bytes()
    (n,) = struct.unpack_from("<Q", raw)
    header = json.loads(raw[8:8 + n])
    data_start = 8 + n
    out_header, data = {}, b""
    if "__metadata__" in header:
        out_header["__metadata__"] = header["__metadata__"]
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        if len(data) + end - begin > max_data:
            continue
        out_header[name] = dict(info, data_offsets=[len(data), len(data) + end - begin])
        data += raw[data_start + begin:data_start + end]
    text = json.dumps(out_header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


# ---- the corpora ----------------------------------------------------------------------------

def fixture_files(pattern):
    return [p for p in sorted(FIXTURES.rglob(pattern)) if p.stat().st_size <= MAX_SEED_BYTES]


def chat_templates():
    return [t["template"] for t in json.loads((FIXTURES / "tokenizer" / "chat_templates.json")
                                              .read_text())["templates"]]


def texts_and_ids(cases_file, tokenizer=None):
    """(text, ids) of a cases fixture: its "cases", or those of tokenizers[tokenizer]."""
    fixture = json.loads(cases_file.read_text())
    cases = fixture["tokenizers"][tokenizer]["cases"] if tokenizer else fixture["cases"]
    return [(case["text"], case.get("ids", [])) for case in cases]


def encode_seeds(cases, alternate):
    seeds = []
    for text, ids in cases:
        seeds.append(bytes([0]) + text.encode("utf-8", "surrogatepass"))
        if alternate:
            seeds.append(bytes([4]) + text.encode("utf-8", "surrogatepass"))
        if ids:
            seeds.append(bytes([1]) + struct.pack(f"<{len(ids)}i", *ids))
    return seeds


def corpora():
    quant = quant_blocks()
    hf_json = FIXTURES / "tokenizer" / "hf_json"
    templates = chat_templates()
    gguf_tokenizers = [
        tokenizer_gguf(json.loads((hf_json / "llama3" / "tokenizer.json").read_text()), "gpt2",
                       "llama-bpe", templates[0]),
        tokenizer_gguf(json.loads((hf_json / "qwen2" / "tokenizer.json").read_text()), "gpt2",
                       "qwen2", ""),
        tokenizer_gguf(json.loads((hf_json / "gpt2" / "tokenizer.json").read_text()), "gpt2",
                       "gpt2", ""),
        tokenizer_gguf(json.loads((FIXTURES / "families" / "gemma3" / "tokenizer.json")
                                  .read_text()), "llama", "default", templates[-1]),
    ]
    conversation = ["system", "Be brief.", "user", "Hello", "assistant", " Hi! ", "user", "Bye"]
    return {
        "gguf": [model_gguf(a, quant) for a in ("llama", "qwen2", "phi3", "gemma3")]
                + [all_value_types_gguf(v) for v in (2, 3)] + gguf_tokenizers,
        "tokenizer_gguf": gguf_tokenizers,
        "safetensors": [p.read_bytes() for p in fixture_files("*.safetensors")]
                       + [small_safetensors(p) for p in sorted(FIXTURES.rglob("*.safetensors"))],
        "safetensors_index": [p.read_bytes() for p in fixture_files("*.safetensors.index.json")],
        "hf_config": [p.read_bytes() for p in fixture_files("config.json")],
        "tokenizer_json": [p.read_bytes() for p in fixture_files("tokenizer.json")],
        "chat_template": ["\0".join([t] + conversation[2 * k:]).encode()
                          for t in templates for k in range(2)]
                         + ["\0".join(["@" + f] + conversation).encode()
                            for f in ("chatml", "gemma", "llama3", "phi3")],
        "encode_bpe": encode_seeds(texts_and_ids(FIXTURES / "tokenizer" / "smollm2.json"), False)
                      + [bytes([0]) + t.encode() for t in json.loads(
                          (FIXTURES / "tokenizer" / "pretokenize.json").read_text())["texts"]],
        "encode_spm": encode_seeds(texts_and_ids(FIXTURES / "tokenizer" / "families.json",
                                                 "gemma3"), True),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "fuzz" / "seeds")
    args = ap.parse_args()
    for target, seeds in corpora().items():
        d = args.out / target
        d.mkdir(parents=True, exist_ok=True)
        for old in d.iterdir():
            old.unlink()
        for seed in seeds:  # named by content, as libFuzzer names its corpus files
            (d / hashlib.sha1(seed).hexdigest()).write_bytes(seed)
        print(f"{target}: {len(set(seeds))} seeds")


if __name__ == "__main__":
    main()
