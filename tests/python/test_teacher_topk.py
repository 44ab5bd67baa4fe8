"""Teacher top-k export (`llmk teacher-topk`, llmk.LLM.teacher_topk, llmk.ops.load_teacher_topk)
on the tiny family fixtures, on the CPU, against the full logits `llmk logits` writes for each
sequence; and the file's rows as fused_linear_distill_loss's teacher."""

import json
import math
import subprocess

import pytest

torch = pytest.importorskip("torch")

import llmk  # noqa: E402
import llmk.ops as L  # noqa: E402
from test_llm import cli, fixture  # noqa: E402

SEQS = [[1, 5, 9, 200, 3], [7], list(range(20, 60)), [511, 0, 2]]


def run(*args, check=True):
    r = subprocess.run([str(cli()), *map(str, args)], capture_output=True, text=True)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def full_logits(model, ids, tmp_path):
    f = tmp_path / "ids.txt"
    f.write_text(" ".join(map(str, ids)))
    out = tmp_path / "logits.f32"
    run("logits", "-t", 1, "--device", "cpu", "-m", model, "--ids", f, "--out", out)
    return torch.from_file(str(out), size=len(ids) * 512, dtype=torch.float32).view(len(ids), 512)


@pytest.mark.parametrize("family", ["llama3", "gemma3"])
@pytest.mark.parametrize("k,chunk", [(1, 512), (7, 3), (512, 16)])
def test_cli_export_matches_full_logits(family, k, chunk, tmp_path):
    model = fixture(family)
    data = tmp_path / "data.txt"
    # Plain ids, a blank line, JSON ids, and a JSON text tokenized by the model's tokenizer.
    lines = [" ".join(map(str, SEQS[0])), "", json.dumps({"ids": SEQS[1]}),
             " ".join(map(str, SEQS[2])), json.dumps({"ids": SEQS[3]}),
             json.dumps({"text": "Hello world"})]
    data.write_text("\n".join(lines) + "\n")
    out = tmp_path / "topk.safetensors"
    r = run("teacher-topk", "-t", 1, "--device", "cpu", "-m", model, "--input", data, "-k", k,
            "--chunk", chunk, "--out", out)
    assert "wrote the top" in r.stderr
    f = L.load_teacher_topk(str(out))
    text_ids = llmk.LLM(model, device="cpu").tokenize("Hello world")
    seqs = SEQS + [text_ids]
    assert f["k"] == k and f["vocab_size"] == 512
    assert f["offsets"].tolist() == [0] + list(torch.tensor([len(s) for s in seqs]).cumsum(0))
    assert f["tokens"].tolist() == [t for s in seqs for t in s]
    for s, ids in enumerate(seqs):
        rows = slice(int(f["offsets"][s]), int(f["offsets"][s + 1]))
        want = full_logits(model, ids, tmp_path).double()
        v, i = f["values"][rows].double(), f["ids"][rows]
        # The ids' own logits, in descending order, and nothing outside above the k-th.
        assert (want.gather(1, i) - v).abs().max().item() <= 1e-5
        assert (v[:, 1:] <= v[:, :-1]).all()
        kth = torch.topk(want, k, dim=1).values[:, -1]
        assert (v[:, -1] - kth).abs().max().item() <= 1e-5
        assert (f["lse"][rows].double() - torch.logsumexp(want, 1)).abs().max().item() <= 1e-5
        assert all(len(set(r)) == k for r in i.tolist())


def test_python_export_equals_the_cli_and_feeds_the_loss(tmp_path):
    model = fixture("llama3")
    llm = llmk.LLM(model, device="cpu", threads=1)
    seen = []
    stats = llm.teacher_topk(SEQS, tmp_path / "py.safetensors", k=512, chunk=8,
                             progress=lambda s, p: seen.append((s, p)))
    assert stats["sequences"] == 4 and stats["positions"] == sum(map(len, SEQS))
    assert seen[-1] == (4, stats["positions"]) and len(seen) == 4
    data = tmp_path / "data.txt"
    data.write_text("\n".join(" ".join(map(str, s)) for s in SEQS))
    run("teacher-topk", "-t", 1, "--device", "cpu", "-m", model, "--input", data, "-k", 512,
        "--chunk", 8, "--out", tmp_path / "cli.safetensors")
    a, b = L.load_teacher_topk(tmp_path / "py.safetensors"), L.load_teacher_topk(
        tmp_path / "cli.safetensors")
    for name in ("offsets", "ids", "values", "lse", "tokens"):
        assert torch.equal(a[name], b[name]), name
    # k = V: the file holds the whole distribution, so the loss against its top k equals the
    # loss against the full logits.
    full = full_logits(model, SEQS[2], tmp_path)
    rows = slice(int(a["offsets"][2]), int(a["offsets"][3]))
    g = torch.Generator().manual_seed(0)
    h = torch.randn(len(SEQS[2]), 16, generator=g, dtype=torch.float64)
    w = torch.randn(512, 16, generator=g, dtype=torch.float64)
    got = L.fused_linear_distill_loss(h, w, teacher_topk=(a["values"][rows].double(),
                                                          a["ids"][rows]), temperature=2.0)
    want = L.fused_linear_distill_loss(h, w, teacher_logits=full.double(), temperature=2.0)
    assert math.isclose(got.item(), want.item(), rel_tol=1e-6)


def test_bad_input(tmp_path):
    model = fixture("llama3")
    llm = llmk.LLM(model, device="cpu", context=16)
    out = tmp_path / "x.safetensors"
    with pytest.raises(llmk.Error, match="sequence 2 has 20 tokens, more than the context of 16"):
        llm.teacher_topk([[1, 2], list(range(20))], out)
    with pytest.raises(llmk.Error, match="k = 0 must be from 1 to 512"):
        llm.teacher_topk([[1, 2]], out, k=0)
    with pytest.raises(llmk.Error, match=r"sequence 1: token 2 \(512\) is outside"):
        llm.teacher_topk([[1, 512]], out)
    with pytest.raises(llmk.Error, match="sequence 1 is empty"):
        llm.teacher_topk([[]], out)
    with pytest.raises(llmk.Error, match="not a teacher top-k file"):
        L.load_teacher_topk(fixture("llama3") + "/model.safetensors")
    data = tmp_path / "data.txt"
    for text, msg in [("1 2 x\n", "line 1: element 3 ('x') is not a token id"),
                      ("{\"ids\": [1, -2]}\n", "line 1: \"ids\" holds -2, not a token id"),
                      ("{\"ids\": [1], \"text\": \"a\"}\n", "exactly one of"),
                      ("{\"ids\": [1]\n", "line 1: not valid JSON"),
                      ("\n\n", "no sequences"),
                      ("1 2\n9999\n", "sequence 2: token 1 (9999) is outside")]:
        data.write_text(text)
        r = run("teacher-topk", "-m", model, "--device", "cpu", "--input", data, "--out", out,
                check=False)
        assert r.returncode == 1 and msg in r.stderr, (text, r.stderr)
        assert r.stderr.count("\n") == 1, r.stderr
    r = run("teacher-topk", "-m", model, "--input", data, "--out", out, "-k", 0, check=False)
    assert r.returncode == 1 and "-k: 0 is less than 1" in r.stderr, r.stderr
