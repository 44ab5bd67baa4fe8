"""examples/distill_gemma3.py --smoke: the teacher (Gemma 3 270M, fetched by
scripts/fetch-models.sh) exports its top-k logits, and a tiny student trains a few steps on one
batch on the CPU; its loss must fall."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TEACHER = Path(os.environ.get("LLMK_MODELS_DIR", ROOT / "models")) / "gemma-3-270m-q4_k_m.gguf"


@pytest.mark.skipif(not TEACHER.exists(), reason=f"{TEACHER} not fetched")
def test_distill_gemma3_smoke(tmp_path):
    pytest.importorskip("transformers")
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "distill_gemma3.py"), "--smoke",
                        "--teacher", str(TEACHER), "--out-dir", str(tmp_path)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    log = json.loads((tmp_path / "losses.json").read_text())
    train = [s["loss"] for s in log["train"]]
    assert len(train) == 6 and all(v == v and v > 0 for v in train)
    assert train[-1] < train[0], train
    assert (tmp_path / "teacher_topk.safetensors").stat().st_size > 0
