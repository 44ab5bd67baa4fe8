"""llmk.LLM (the Python package's engine) against the `llmk` program on the same models.

The family fixtures (tests/fixtures/families: tiny Llama 3, Qwen2, Phi-3 and Gemma 3 folders
with their tokenizers) run on the CPU through both; greedy text must be identical, and seeded
sampling must repeat itself. LLMK_CLI names the program (default: build/cpu/llmk, which
scripts/test.sh builds before it runs these tests).
"""

import os
import subprocess
import threading
from pathlib import Path

import pytest

import llmk

ROOT = Path(__file__).resolve().parents[2]
FAMILIES = ["llama3", "qwen2", "phi3", "gemma3"]
PROMPTS = ["Hello world", "The quick brown fox", "a"]


def cli() -> Path:
    path = Path(os.environ.get("LLMK_CLI", ROOT / "build" / "cpu" / "llmk"))
    if not path.exists():
        pytest.fail(f"{path}: no llmk program to compare with (build preset cpu, or set LLMK_CLI)")
    return path


def fixture(name: str) -> str:
    return str(ROOT / "tests" / "fixtures" / "families" / name)


def run_cli(model: str, prompt: str, n: int, *extra: str) -> str:
    out = subprocess.run(
        [str(cli()), "run", "-m", model, "-p", prompt, "-n", str(n), "--temp", "0",
         "--device", "cpu", *extra],
        capture_output=True, check=True,
    ).stdout
    assert out.endswith(b"\n")
    return out[:-1].decode("utf-8", errors="replace")


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    return request.param, llmk.LLM(fixture(request.param), device="cpu", threads=2)


def test_greedy_text_matches_the_program(family):
    name, llm = family
    texts = llm.generate(PROMPTS, max_tokens=12, temperature=0)
    assert len(texts) == len(PROMPTS)
    for prompt, text in zip(PROMPTS, texts):
        assert text == run_cli(fixture(name), prompt, 12), (name, prompt)
    assert any(texts), name  # something was generated


def test_token_ids_and_text_prompts_agree(family):
    _, llm = family
    ids = llm.tokenize("The quick brown fox")
    assert ids and all(isinstance(i, int) for i in ids)
    assert llm.generate(ids, max_tokens=6, temperature=0) == llm.generate(
        "The quick brown fox", max_tokens=6, temperature=0)


def test_seeded_sampling_repeats(family):
    _, llm = family
    a = llm.generate("Hello", max_tokens=10, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=7)
    b = llm.generate("Hello", max_tokens=10, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=7)
    assert a == b


def test_streamed_pieces_join_to_the_text(family):
    _, llm = family
    pieces = []
    text = llm.generate("Hello world", max_tokens=12, temperature=0, on_text=pieces.append)
    assert len(pieces) > 1 and "".join(pieces) == text
    # False after the third piece stops there.
    kept = []

    def three(piece):
        kept.append(piece)
        return len(kept) < 3

    short = llm.generate("Hello world", max_tokens=12, temperature=0, on_text=three)
    assert len(kept) == 3 and short.startswith("".join(kept)) and len(short) < len(text)
    assert text.startswith("".join(kept))

    def boom(piece):
        raise KeyError("from the callback")

    with pytest.raises(KeyError, match="from the callback"):
        llm.generate("Hello world", max_tokens=4, temperature=0, on_text=boom)
    assert llm.generate("Hello world", max_tokens=12, temperature=0) == text  # still usable


def test_threads_share_one_model(family):
    _, llm = family
    expect = llm.generate(PROMPTS, max_tokens=8, temperature=0)
    got = [None] * len(PROMPTS)

    def run(i):
        got[i] = llm.generate(PROMPTS[i], max_tokens=8, temperature=0, on_text=lambda s: None)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == expect


def test_bad_input_raises_one_clear_error(family):
    _, llm = family
    with pytest.raises(llmk.Error, match="temperature -1"):
        llm.generate("x", temperature=-1)
    with pytest.raises(llmk.Error, match="max_tokens -1"):
        llm.generate("x", max_tokens=-1)
    with pytest.raises(llmk.Error, match="outside the vocabulary"):
        llm.generate([10**9], max_tokens=1)
    if not llm.tokenize(""):  # tokenizers that add no BOS
        with pytest.raises(llmk.Error, match="empty"):
            llm.generate("", max_tokens=1)
    assert llm.generate([], max_tokens=1) == []  # no prompts, no texts


def test_awq_and_gptq_folders_generate_as_their_f16_twins():
    # Hugging Face AWQ / GPTQ 4-bit checkpoints (tests/fixtures/hf_quant,
    # tests/model/hf_quant_test.cpp): the AWQ one kept as exact Q5_0 blocks, the GPTQ one (act
    # order) dequantised to f16, the symmetric GPTQ one as exact Q4_0 blocks, the
    # compressed-tensors int8 one as exact Q8_0 blocks; greedy tokens equal their f16 twins'.
    # dequantize (a CUDA setting: bf16 weights instead of quantised ones) changes nothing on the
    # CPU.
    folder = ROOT / "tests" / "fixtures" / "hf_quant"
    for q in ("awq", "gptq", "gptq_sym", "ct_int8"):
        quant = llmk.LLM(folder / q, device="cpu")
        twin = llmk.LLM(folder / (q + "_twin"), device="cpu", dequantize=True)
        ids = quant.tokenize("Hello world")
        assert ids == twin.tokenize("Hello world")
        got = quant.generate(ids, max_tokens=12, temperature=0, stop_at_eos=False)
        want = twin.generate(ids, max_tokens=12, temperature=0, stop_at_eos=False)
        assert got == want, q


def test_cpu_int8_runs_as_the_program_does():
    # SmolLM2's Q4_1 file (scripts/fetch-models.sh): cpu_int8 multiplies 8-bit activations by the
    # blocks, as `llmk run --cpu-int8` does, token for token; a model without it stays on the f32
    # path although the mode is process-wide.
    model = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert model.exists(), f"{model}: run scripts/fetch-models.sh"
    int8 = llmk.LLM(model, device="cpu", threads=2, cpu_int8=True)
    f32 = llmk.LLM(model, device="cpu", threads=2, gpu_embeddings=True)  # (a CUDA setting)
    for prompt in ("The capital of France is", "Once upon a time"):
        got8 = int8.generate(prompt, max_tokens=24, temperature=0, stop_at_eos=False)
        got32 = f32.generate(prompt, max_tokens=24, temperature=0, stop_at_eos=False)
        assert got8 == run_cli(str(model), prompt, 24, "--cpu-int8", "--ignore-eos"), prompt
        assert got32 == run_cli(str(model), prompt, 24, "--ignore-eos"), prompt


def test_bad_models_and_settings_raise():
    with pytest.raises(llmk.Error, match="/nonexistent"):
        llmk.LLM("/nonexistent")
    with pytest.raises(llmk.Error, match="device 'tpu'"):
        llmk.LLM(fixture("llama3"), device="tpu")
    with pytest.raises(llmk.Error, match="context -5"):
        llmk.LLM(fixture("llama3"), context=-5)
    with pytest.raises(llmk.Error, match="dtype 'bf16': the CPU computes in f32"):
        llmk.LLM(fixture("llama3"), device="cpu", dtype="bf16")
    with pytest.raises(llmk.Error, match="dtype 'half': expected auto, bf16, f16 or f32"):
        llmk.LLM(fixture("llama3"), device="cpu", dtype="half")
    assert llmk.LLM(fixture("llama3"), device="cpu", dtype="f32").dtype == "f32"
    assert isinstance(llmk.__version__, str) and llmk.__version__
