#!/usr/bin/env python3
"""Writes tests/fixtures/quant/<type>.bin: random ggml blocks and their dequantisation by the
`gguf` Python package (an implementation independent of llmk's), for tests/kernels/dequant_test.

Blocks are random bytes, except that the f16 scale fields (d, m, dmin) are overwritten with
finite values of modest magnitude so that no weight is inf or NaN. The f16/bf16 fixtures hold
random finite values, subnormals and signed zeros included.

File layout (little-endian):
  8 bytes  magic "LLMKQFX1"
  u32      ggml type id (GGMLQuantizationType)
  u32      number of weights n
  u32      number of raw bytes b
  b bytes  the blocks
  n f32    the expected weights

Usage: scripts/make-quant-fixtures.py [--out tests/fixtures/quant]
"""

import argparse
import struct
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

# Byte offsets of the f16 scale fields inside one block, from ggml's block structs.
F16_FIELDS = {
    T.Q4_0: [0],
    T.Q4_1: [0, 2],
    T.Q5_0: [0],
    T.Q5_1: [0, 2],
    T.Q8_0: [0],
    T.Q2_K: [80, 82],
    T.Q3_K: [108],
    T.Q4_K: [0, 2],
    T.Q5_K: [0, 2],
    T.Q6_K: [208],
}
# Weights per fixture: a few blocks each, enough to exercise every position in a block.
LEGACY_BLOCKS = 16
K_BLOCKS = 8


def modest_f16(rng: np.random.Generator, n: int) -> np.ndarray:
    """Finite halves in +-[2^-10, 2^-1], some exactly zero."""
    mag = 2.0 ** rng.uniform(-10, -1, size=n)
    sign = rng.choice([-1.0, 1.0], size=n)
    v = (mag * sign).astype(np.float16)
    v[rng.random(n) < 0.05] = 0
    return v


def block_fixture(rng: np.random.Generator, t: T) -> tuple[bytes, np.ndarray]:
    block_elems, block_bytes = GGML_QUANT_SIZES[t]
    nblocks = LEGACY_BLOCKS if block_elems == 32 else K_BLOCKS
    raw = rng.integers(0, 256, size=(nblocks, block_bytes), dtype=np.uint8)
    for off in F16_FIELDS[t]:
        raw[:, off : off + 2] = modest_f16(rng, nblocks).view(np.uint8).reshape(nblocks, 2)
    expected = dequantize(raw.reshape(-1), t).astype(np.float32).reshape(-1)
    assert expected.size == nblocks * block_elems and np.all(np.isfinite(expected))
    return raw.tobytes(), expected


def half_fixture(rng: np.random.Generator, t: T, n: int = 512) -> tuple[bytes, np.ndarray]:
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)
    if t == T.F16:
        exp = (bits >> 10) & 0x1F
        bits = np.where(exp == 0x1F, bits & 0x83FF, bits)  # no inf/NaN
        bits[:4] = [0x0000, 0x8000, 0x0001, 0x83FF]  # zeros and subnormals
        expected = dequantize(bits.view(np.uint8), t)
    else:
        exp = (bits >> 7) & 0xFF
        bits = np.where(exp == 0xFF, bits & 0x807F, bits)
        bits[:4] = [0x0000, 0x8000, 0x0001, 0x807F]
        expected = (bits.astype(np.uint32) << 16).view(np.float32)  # gguf has no bf16 entry point
        from gguf.quants import BF16

        assert np.array_equal(BF16.dequantize_blocks(bits.view(np.uint8).reshape(-1, 2)).reshape(-1),
                              expected)
    return bits.tobytes(), np.asarray(expected, dtype=np.float32).reshape(-1)


def write(path: Path, t: T, raw: bytes, expected: np.ndarray) -> None:
    header = b"LLMKQFX1" + struct.pack("<III", int(t), expected.size, len(raw))
    path.write_bytes(header + raw + expected.astype("<f4").tobytes())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "tests/fixtures/quant"))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(20240611)
    total = 0
    for t in [T.F16, T.BF16]:
        raw, expected = half_fixture(rng, t)
        write(out / f"{t.name.lower()}.bin", t, raw, expected)
    for t in F16_FIELDS:
        raw, expected = block_fixture(rng, t)
        write(out / f"{t.name.lower()}.bin", t, raw, expected)
    for p in sorted(out.glob("*.bin")):
        total += p.stat().st_size
        print(f"{p.name}: {p.stat().st_size} bytes")
    print(f"total {total} bytes")


if __name__ == "__main__":
    main()
