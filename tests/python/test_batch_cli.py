"""`llmk run --prompts FILE` (the many-sequence engine, CPU) on the tiny family fixtures: each
prompt's output equals `llmk run` on it alone; n samples draw as seeds seed + k; stop strings cut
the text; bad files give one clear line."""

import json
import subprocess

import pytest

import llmk
from test_llm import cli, fixture


def run(*args, check=True):
    r = subprocess.run([str(cli()), *map(str, args)], capture_output=True, text=True)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def batch(model, lines, tmp_path, *extra):
    f = tmp_path / "prompts.jsonl"
    f.write_text("\n".join(lines) + "\n")
    r = run("run", "-m", model, "--prompts", f, "--device", "cpu", "-t", 1, *extra)
    return [json.loads(line) for line in r.stdout.splitlines()]


@pytest.mark.parametrize("family", ["llama3", "gemma3"])
def test_greedy_batch_equals_single_runs(family, tmp_path):
    model = fixture(family)
    prompts = ["Hello world", "The quick brown fox", "a", "Once upon a time there was"]
    out = batch(model, prompts, tmp_path, "--temp", 0, "-n", 10, "--ignore-eos",
                "--max-running", 3, "--step-tokens", 5)
    assert [o["index"] for o in out] == [0, 1, 2, 3]
    llm = llmk.LLM(model, device="cpu")
    for p, o in zip(prompts, out):
        assert o["prompt"] == p and len(o["outputs"]) == 1
        # (Random weights: the bytes need not be UTF-8; compared as the same bytes decoded.)
        alone = subprocess.run([str(cli()), "run", "-m", model, "-p", p, "--temp", "0", "-n",
                                "10", "--ignore-eos", "--device", "cpu", "-t", "1"],
                               capture_output=True, check=True).stdout
        got = llm.detokenize(o["outputs"][0]["token_ids"])
        assert got == alone[:-1].decode("utf-8", errors="replace"), p  # run ends with "\n"
        assert len(o["outputs"][0]["token_ids"]) == 10
        assert o["outputs"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("family", ["qwen2", "llama3"])
def test_chat_batch_equals_single_chat_runs(family, tmp_path):
    model = fixture(family)
    prompts = ["Hello world", "Write a haiku <|im_end|> about rain"]
    out = batch(model, prompts, tmp_path, "--temp", 0, "-n", 8, "--ignore-eos", "--chat",
                "--system", "Be brief.")
    llm = llmk.LLM(model, device="cpu")
    for p, o in zip(prompts, out):
        alone = subprocess.run([str(cli()), "run", "-m", model, "-p", p, "--chat", "--system",
                                "Be brief.", "--temp", "0", "-n", "8", "--ignore-eos",
                                "--device", "cpu", "-t", "1"],
                               capture_output=True, check=True).stdout
        got = llm.detokenize(o["outputs"][0]["token_ids"])
        assert got == alone[:-1].decode("utf-8", errors="replace"), p
    plain = batch(model, prompts[:1], tmp_path, "--temp", 0, "-n", 8, "--ignore-eos")
    assert plain[0]["outputs"] != out[0]["outputs"]  # the template changed the prompt
    # The pool is sized from the templated prompts: eight of them with the system message and 8
    # tokens each take more than one 128-token context (8 pages of 16).
    f = tmp_path / "chat.txt"
    f.write_text("\n".join(prompts * 4) + "\n")
    r = run("run", "-m", model, "--prompts", f, "--chat", "--system", "Be brief.", "--temp", 0,
            "-n", 8, "--ctx", 128, "--device", "cpu", "-t", 1)
    pages = int(r.stderr.split("pool ")[1].split(" pages")[0])
    assert pages > 8, r.stderr
    f = tmp_path / "p.txt"
    f.write_text("x\n")
    r = run("run", "-m", model, "--prompts", f, "--system", "s", check=False)
    assert r.returncode == 1 and "--system needs --chat" in r.stderr


def test_samples_seeds_and_stop_strings(tmp_path):
    model = fixture("qwen2")
    line = lambda **kw: json.dumps({"prompt": "The quick brown fox", "temperature": 1.0,  # noqa
                                    "top_k": 0, "top_p": 1.0, "min_p": 0.0, "max_tokens": 8,
                                    **kw})
    out = batch(model, [line(n=3, seed=7), line(seed=7), line(seed=8), line(seed=9)], tmp_path,
                "--ignore-eos")
    samples = [s["token_ids"] for s in out[0]["outputs"]]
    assert samples == [out[k]["outputs"][0]["token_ids"] for k in (1, 2, 3)]
    assert len({tuple(s) for s in samples}) > 1
    # A stop string taken from the greedy text: the text ends right before it.
    greedy = batch(model, [json.dumps({"prompt": "Hello world", "temperature": 0,
                                       "max_tokens": 12})], tmp_path, "--ignore-eos")
    text = greedy[0]["outputs"][0]["text"]
    assert len(text) > 6
    stop = text[3:6]
    cut = batch(model, [json.dumps({"prompt": "Hello world", "temperature": 0, "max_tokens": 12,
                                    "stop": [stop, "\u00ff\u00ff"]})], tmp_path, "--ignore-eos")
    o = cut[0]["outputs"][0]
    assert o["finish_reason"] == "stop" and o["text"] == text[:text.find(stop)]
    assert len(o["token_ids"]) < 12


def test_bad_prompt_files(tmp_path):
    model = fixture("llama3")
    f = tmp_path / "p.jsonl"
    for text, msg in [('{"prompt": "x", "foo": 1}\n', 'line 1: unknown field "foo"'),
                      ('{"prompt": 3}\n', 'line 1: a JSON line needs "prompt" (a string)'),
                      ('{"prompt": "x", "n": 0}\n', 'line 1: "n" = 0 is outside [1, 1024]'),
                      ('{"prompt": "x", "stop": [1]}\n', 'line 1: "stop" holds 1'),
                      ('{"prompt": "x", "presence_penalty": 3}\n',
                       'line 1: "presence_penalty" = 3 is outside [-2, 2]'),
                      ('{"prompt": "x"\n', "line 1: not valid JSON"),
                      ("\n  \n", "no prompts")]:
        f.write_text(text)
        r = run("run", "-m", model, "--prompts", f, "--device", "cpu", check=False)
        assert r.returncode == 1 and msg in r.stderr, (text, r.stderr)
        assert r.stderr.count("\n") == 1, r.stderr
    f.write_text('{"prompt": "x", "presence_penalty": 1.5, "frequency_penalty": -0.5}\n')
    ok = run("run", "-m", model, "--prompts", f, "--device", "cpu", "-n", 4, "--ignore-eos")
    assert len(json.loads(ok.stdout)["outputs"][0]["token_ids"]) == 4
    r = run("run", "-m", model, "-p", "x", "--n", 2, check=False)
    assert r.returncode == 1 and "--n needs --prompts" in r.stderr
    f.write_text("x\n")
    r = run("run", "-m", model, "-p", "x", "--prompts", f, check=False)
    assert r.returncode == 1 and "not both" in r.stderr


def test_kv_memory_sizes_the_pool(tmp_path):
    # A pool granted in GiB: a few pages of the llama3 fixture (f32 on the CPU: 3 layers x 2 x 16
    # tokens x 64 dims x 4 bytes = 24 KiB a page), so the batch preempts; the greedy outputs stay
    # those of the default pool.
    model = fixture("llama3")
    prompts = ["Hello world", "The quick brown fox", "a", "Once upon a time there was"]
    args = ("--temp", 0, "-n", 10, "--ignore-eos", "--ctx", 64)
    want = batch(model, prompts, tmp_path, *args)
    got = batch(model, prompts, tmp_path, *args, "--kv-memory", 6 * 24 / 2**20)
    assert [o["outputs"] for o in got] == [o["outputs"] for o in want]
    f = tmp_path / "p.txt"
    f.write_text("x\n")
    for value, msg in [(0, "is not 'free' or a size in GiB above 0"),
                       ("abc", "is not 'free' or a size in GiB above 0"),
                       (-1, "is not 'free' or a size in GiB above 0"),
                       (2 * 24 / 2**20, "fewer than one context of 64 tokens needs (4)")]:
        r = run("run", "-m", model, "--prompts", f, "--device", "cpu", "--ctx", 64,
                "--kv-memory", value, check=False)
        assert r.returncode == 1 and msg in r.stderr, (value, r.stderr)
        assert r.stderr.count("\n") == 1, r.stderr
    r = run("run", "-m", model, "-p", "x", "--kv-memory", 1, check=False)
    assert r.returncode == 1 and "--kv-memory needs --prompts" in r.stderr


def test_kv_dtype(tmp_path):
    # 8-bit caches on the CPU: outputs for every prompt, and a pool of the same bytes holds more
    # pages (a grant too small for one float32 context fits one of fp8 or int8).
    model = fixture("llama3")
    prompts = ["Hello world", "The quick brown fox", "a"]
    args = ("--temp", 0, "-n", 6, "--ignore-eos", "--ctx", 64)
    small = ("--kv-memory", 2 * 24 / 2**20)
    for kv in ("fp8", "int8"):
        got = batch(model, prompts, tmp_path, *args, *small, "--kv-dtype", kv)
        assert [len(o["outputs"][0]["token_ids"]) for o in got] == [6, 6, 6]
    f = tmp_path / "p.txt"
    f.write_text("x\n")
    r = run("run", "-m", model, "--prompts", f, "--device", "cpu", *args, *small, check=False)
    assert r.returncode == 1 and "fewer than one context" in r.stderr
    for value, msg in [("bf16", "the CPU computes in f32; its cache is f32 (or fp8, int8), not bf16"),
                       ("fp4", "kv dtype 'fp4': expected auto, f32, fp8 or int8")]:
        r = run("run", "-m", model, "--prompts", f, "--device", "cpu", "--kv-dtype", value,
                check=False)
        assert r.returncode == 1 and msg in r.stderr, (value, r.stderr)
        assert r.stderr.count("\n") == 1, r.stderr
    r = run("run", "-m", model, "-p", "x", "--kv-dtype", "fp8", check=False)
    assert r.returncode == 1 and "--kv-dtype needs --prompts" in r.stderr


def test_dtype_option(tmp_path):
    # --dtype picks the activations' type on CUDA; the CPU computes in f32 and says so. Every
    # command that loads a model takes it; a bad value is one line naming what is accepted.
    model = fixture("llama3")
    f = tmp_path / "p.txt"
    f.write_text("x\n")
    ids = tmp_path / "ids.txt"
    ids.write_text("1 2 3\n")
    cases = [
        (("run", "-m", model, "-p", "x", "-n", 2), "bf16"),
        (("run", "-m", model, "--prompts", f, "-n", 2), "f16"),
        (("bench", "-m", model, "--prompt-tokens", 4, "--gen-tokens", 2, "--reps", 1), "bf16"),
        (("logits", "-m", model, "--ids", ids, "--out", tmp_path / "l.bin"), "f16"),
    ]
    for args, value in cases:
        r = run(*args, "--device", "cpu", "--dtype", value, check=False)
        msg = f"dtype '{value}': the CPU computes in f32 (auto or f32)"
        assert r.returncode == 1 and msg in r.stderr, (args, r.stderr)
        assert r.stderr.count("\n") == 1, r.stderr
    r = run("run", "-m", model, "-p", "x", "--device", "cpu", "--dtype", "float", check=False)
    assert r.returncode == 1 and "dtype 'float': expected auto, bf16, f16 or f32" in r.stderr
    for value in ("auto", "f32", "fp32"):
        got = batch(model, ["Hello"], tmp_path, "--temp", 0, "-n", 2, "--dtype", value)
        assert len(got[0]["outputs"][0]["token_ids"]) == 2
    # With f32 activations named, the CPU's cache type is accepted as --kv-dtype.
    got = batch(model, ["Hello"], tmp_path, "--temp", 0, "-n", 2, "--dtype", "f32",
                "--kv-dtype", "f32")
    assert len(got[0]["outputs"][0]["token_ids"]) == 2


def test_batch_invariant_flag(tmp_path):
    # --batch-invariant (CUDA's kernel choices; the CPU is row by row already) runs on the CPU
    # with the same outputs, and asks for a batch: --prompts (run) or --concurrency (bench).
    model = fixture("llama3")
    prompts = ["Hello world", "a"]
    args = ("--temp", 0, "-n", 4, "--ignore-eos")
    assert batch(model, prompts, tmp_path, *args, "--batch-invariant") == batch(
        model, prompts, tmp_path, *args)
    r = run("run", "-m", model, "-p", "x", "--batch-invariant", check=False)
    assert r.returncode == 1 and "--batch-invariant needs --prompts" in r.stderr
    r = run("bench", "-m", model, "--device", "cpu", "--batch-invariant", check=False)
    assert r.returncode == 1 and "--batch-invariant needs --concurrency" in r.stderr


def test_quantized_weights_flags():
    # --quantized-weights (the default) and --dequantize choose how CUDA holds a GGUF's quantised
    # matrices; every command that loads a model takes them, and the CPU (which reads the
    # quantised blocks either way) gives the same tokens with each.
    model = fixture("llama3")
    args = ("-p", "Hello world", "--temp", 0, "-n", 6, "--ignore-eos", "--device", "cpu", "-t", 1)
    base = run("run", "-m", model, *args).stdout
    assert run("run", "-m", model, *args, "--dequantize").stdout == base
    assert run("run", "-m", model, *args, "--quantized-weights").stdout == base
    for command in ("run", "chat", "bench", "logits", "serve"):
        h = run(command, "--help").stdout
        assert "--quantized-weights" in h and "--dequantize" in h, command


def test_bench_concurrency(tmp_path):
    model = fixture("gemma3")
    out = tmp_path / "b.json"
    r = run("bench", "-m", model, "--concurrency", 3, "--prompt-tokens", 5, "--gen-tokens", 4,
            "--reps", 1, "--device", "cpu", "-t", 1, "--json", out)
    assert "concurrency 3: 3 requests of 5 + 4 tokens: 12 output tokens" in r.stdout
    j = json.loads(out.read_text())
    assert j["output_tokens"] == 12 and j["concurrency"] == 3 and j["output_tokens_per_s"] > 0
    r = run("bench", "-m", model, "--concurrency", 2, "--batch", 2, check=False)
    assert r.returncode == 1 and "not both" in r.stderr
