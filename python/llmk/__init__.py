"""llmk from Python.

    import llmk
    llm = llmk.LLM("path/to/model.gguf")            # or a Hugging Face folder
    print(llm.generate("The capital of France is", max_tokens=16, temperature=0))

Runs llmk's own engine (tokenizer, model runner, sampler) through its C++ library. The package
built by `pip install .` is CPU-only for now; the CUDA engine is the `llmk` program's.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence, Union

from llmk._C import Error, __version__, _Engine

__all__ = ["LLM", "Error", "__version__"]

Prompt = Union[str, Sequence[int]]


class LLM:
    """A model and its tokenizer, loaded once; generate() runs one prompt at a time.

    path: a GGUF file or a Hugging Face folder (config.json, safetensors, tokenizer.json).
    device: "cpu", "cuda" or "auto". context: KV-cache length in tokens (0: the model's, at most
    4096). threads: CPU threads (0: one per hardware thread; the setting is process-wide).
    dtype: the activations' type, "auto" (bf16 on CUDA, f32 on the CPU), "bf16", "f16" or "f32"
    (the CPU computes in f32 only). dequantize: on CUDA, convert a GGUF's quantised matrices to
    bf16 at load instead of keeping them quantised on the GPU (the default; `llmk run
    --dequantize`). cpu_int8: on the CPU, multiply each token's activations quantised to 8 bits
    by integer dot products against block-quantised weights (`llmk run --cpu-int8`: faster decode,
    logits less exact than the f32 default's); the mode is process-wide and set at each of this
    model's calls. gpu_embeddings: on CUDA, keep the token embeddings in GPU memory rather than
    in pinned host memory (the default for a model whose output layer is its own; `llmk run
    --gpu-embeddings`). Bad arguments and unreadable models raise llmk.Error with a one-line
    message.
    """

    def __init__(
        self,
        path: str,
        device: str = "auto",
        context: int = 0,
        threads: int = 0,
        dtype: str = "auto",
        dequantize: bool = False,
        cpu_int8: bool = False,
        gpu_embeddings: bool = False,
    ):
        self._engine = _Engine(
            str(path), device, int(context), int(threads), str(dtype), bool(dequantize),
            bool(cpu_int8), bool(gpu_embeddings)
        )

    @property
    def device(self) -> str:
        return self._engine.device

    @property
    def context(self) -> int:
        return self._engine.context

    @property
    def dtype(self) -> str:
        """The activations' type: "f32" on the CPU; "bf16", "f16" or "f32" on CUDA."""
        return self._engine.dtype

    def __repr__(self) -> str:
        return f"llmk.LLM({self._engine.summary}, device={self.device}, context={self.context})"

    def tokenize(self, text: str, add_bos: bool = True, special: bool = False) -> list[int]:
        """Token ids of text; add_bos where the tokenizer asks for it; special: parse special
        tokens written in the text (such as a chat template's markers)."""
        return self._engine.tokenize(text, add_bos, special)

    def detokenize(self, ids: Sequence[int], skip_special: bool = False) -> str:
        """The text of ids; bytes that are not valid UTF-8 (a sequence cut inside a character)
        become U+FFFD."""
        return self._engine.detokenize([int(i) for i in ids], skip_special).decode(
            "utf-8", errors="replace")

    def generate(
        self,
        prompts: Union[Prompt, Sequence[Prompt]],
        max_tokens: int = 128,
        temperature: float = 0.8,
        top_k: int = 40,
        top_p: float = 0.95,
        min_p: float = 0.05,
        repeat_penalty: float = 1.0,
        seed: int = 0,
        stop_at_eos: bool = True,
        on_text: Optional[Callable[[str], Optional[bool]]] = None,
    ) -> Union[str, list[str]]:
        """The text generated after each prompt (a string, or a list of token ids); a list of
        prompts gives a list of texts. temperature 0 is greedy; the other settings are the
        `llmk run` sampler's, with its defaults. The text is what `llmk run` prints: each
        token's piece (so a leading space stays), bytes that are not valid UTF-8 as U+FFFD; an
        end-of-sequence token ends it and is not part of it. on_text, if given, is called with
        each new piece of the text as it is generated (whole characters; the pieces join to
        the returned text); returning False stops that prompt's generation there (the text
        returned then ends where it stopped, possibly in part of a character not passed on)."""
        single = isinstance(prompts, str) or (
            len(prompts) > 0 and all(isinstance(t, int) for t in prompts)
        )
        batch = [prompts] if single else list(prompts)
        if max_tokens < 0:
            raise Error(f"max_tokens {max_tokens} must be >= 0")
        texts = []
        for p in batch:
            ids = self.tokenize(p) if isinstance(p, str) else [int(t) for t in p]
            stream = None
            if on_text is not None:
                def stream(piece: bytes) -> bool:
                    return on_text(piece.decode("utf-8", errors="replace")) is not False
            text = self._engine.generate(
                ids, max_tokens, float(temperature), int(top_k), float(top_p), float(min_p),
                float(repeat_penalty), int(seed), bool(stop_at_eos), stream,
            )
            texts.append(text.decode("utf-8", errors="replace"))
        return texts[0] if single else texts

    def teacher_topk(
        self,
        sequences: Sequence[Prompt],
        path: str,
        k: int = 32,
        chunk: int = 512,
        progress: Optional[Callable[[int, int], None]] = None,
    ) -> dict:
        """Runs the model over each sequence (a string, tokenized with BOS where the tokenizer
        adds one, or a list of token ids) from position 0, and writes every position's k
        largest logits, their ids and the log-sum-exp of the whole row to the safetensors file
        `path`, as `llmk teacher-topk` does (the layout: llmk.ops.load_teacher_topk). Rows go
        to the file as they are computed. chunk: positions per forward pass. progress, if
        given, is called with (sequences done, positions done) after each sequence. A sequence
        longer than the context, an id outside the vocabulary or k outside [1, min(vocab,
        1024)] raises llmk.Error before any work. Returns {"sequences", "positions",
        "seconds"}."""
        ids = [self.tokenize(s) if isinstance(s, str) else [int(t) for t in s]
               for s in sequences]
        n, p, sec = self._engine.teacher_topk(ids, str(path), int(k), int(chunk), progress)
        return {"sequences": n, "positions": p, "seconds": sec}
