#!/usr/bin/env python3
"""Writes the Hugging Face tokenizer.json fixtures under tests/fixtures/tokenizer/hf_json/.

Runs on a developer machine (not in CI), offline: needs transformers and tokenizers, and the
SmolLM2 GGUF (scripts/fetch-models.sh).

    python3 scripts/make-tokenizer-json-fixtures.py

Each folder holds a tokenizer.json (and a tokenizer_config.json) as Tokenizer::from_hf_json
reads them:
  llama3/   a small byte-level BPE trained here with Llama 3's pre-tokenizer
            (Sequence[Split(its regex, isolated), ByteLevel(use_regex=false)], ignore_merges),
            special tokens appended after the vocabulary as Llama 3 does, merges as [a, b] pairs,
            a TemplateProcessing post-processor that adds <|begin_of_text|>;
  qwen2/    the same with Qwen2's regex, ChatML special tokens, merges as "a b" strings (the
            older format) and the NFC normalizer real Qwen2 files declare;
  gpt2/     the same with a plain ByteLevel(use_regex=true) pre-tokenizer and one non-special
            added token (a user-defined token: matched even when special tokens are not);
  smollm2/  SmolLM2-135M-Instruct's own vocabulary and merges (from the GGUF through
            transformers), with SmolLM2's real pre-tokenizer Sequence[Digits, ByteLevel], written
            compactly with "a b" merges (about 1.6 MB: the one large fixture). Its expected ids
            are those of ../smollm2.json (scripts/make-tokenizer-fixtures.py).
cases.json holds, for each trained tokenizer, the ids tokenizers gives for every string of the
corpus: `ids` with added tokens matched, `ids_plain` (only where it differs) with special tokens
not matched (encode_special_tokens = True), and `decoded` / `decoded_plain` (only where they
differ from the text) tokenizers' decode of those ids: the text normalized (NFC), or with the
spaces a Prepend("▁") normalizer added after special tokens.
"""
import importlib.util
import json
import os
import random

from tokenizers import (Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers,
                        processors, trainers)
from transformers import AutoTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def load_base_script():
    spec = importlib.util.spec_from_file_location(
        "make_tokenizer_fixtures", os.path.join(HERE, "make-tokenizer-fixtures.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


BASE = load_base_script()

LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                   "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"]
QWEN2_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
GPT2_SPECIALS = ["<|endoftext|>"]
GPT2_USER_TOKENS = ["<custom_user>"]

LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>"
    "\n\n{{ m['content'] | trim }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}"
    "<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def training_text():
    """A few hundred KB of mixed text: the corpus strings, random fragment mixes and words."""
    rng = random.Random(7)
    words = ["the", "of", "and", "to", "in", "is", "that", "for", "it", "with", "as", "was",
             "on", "token", "model", "engine", "kernel", "memory", "tensor", "layer", "value",
             "return", "def", "class", "int", "float", "print", "self", "import", "from",
             "日本語", "中文", "데이터", "данные", "العربية", "שלום", "café", "naïve", "😀"]
    lines = BASE.handwritten_corpus() * 3 + BASE.generated_corpus(99, 6000)
    for _ in range(6000):
        n = rng.randint(3, 15)
        sep = rng.choice([" ", " ", " ", "  ", "\t", "\n", ", ", ". "])
        line = sep.join(rng.choice(words) for _ in range(n))
        if rng.random() < 0.3:
            line += " " + str(rng.randint(0, 10 ** rng.randint(1, 8)))
        lines.append(line)
    rng.shuffle(lines)
    return lines


def byte_level(use_regex):
    return pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True,
                                    use_regex=use_regex)


def train(pre_tokenizer, ignore_merges, specials, user_tokens, vocab_size, text, normalizer=None):
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(text, trainer=trainer)
    # Added after training, so that their ids follow the vocabulary (as in Llama 3 and Qwen2).
    tok.add_special_tokens(specials)
    if user_tokens:
        tok.add_tokens(user_tokens)
    return tok


def finish_json(tok, ignore_merges, string_merges):
    """The tokenizer's JSON with ignore_merges set (training drops it) and merges in the
    requested format."""
    j = json.loads(tok.to_str())
    j["model"]["ignore_merges"] = ignore_merges
    merges = j["model"]["merges"]
    if string_merges:
        j["model"]["merges"] = [m if isinstance(m, str) else " ".join(m) for m in merges]
    else:
        j["model"]["merges"] = [m.split(" ", 1) if isinstance(m, str) else m for m in merges]
    return j


def write_json(path, obj, indent=None):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        if indent is None:
            json.dump(obj, f, ensure_ascii=False, separators=(",", ":"))
        else:
            json.dump(obj, f, ensure_ascii=False, indent=indent)
        f.write("\n")
    print("wrote %s (%d bytes)" % (path, os.path.getsize(path)))


def corpus():
    extra = [
        "<|begin_of_text|>Hello<|eot_id|>", "<|begin_of_text|><|begin_of_text|>",
        "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>",
        "<|begin_of_text", "begin_of_text|>", "<|eot_id|", "< |eot_id|>", "<|EOT_ID|>",
        "<|eom_id|><|python_tag|>print(1)", "<custom_user>", "a<custom_user>b",
        "<custom_user><|endoftext|>", "<custom_user", " <custom_user> ",
        "<|im_start|>x<custom_user>",
        "x = 1234567; y = 89", "12345678901", "1,234.5678", "   123   456   ",
        "\n\n\n\n    def f():\n\t\treturn 0\r\n", "naïve café — “quoted” ‘text’",
        "Ελληνικά και English 123", "👩‍🔬🧪 lab 42", "I'M HERE, YOU'RE THERE, THEY'LL GO",
    ] + not_nfc()
    texts = BASE.handwritten_corpus() + BASE.single_characters() + extra + \
        BASE.generated_corpus(4321, 120)
    seen = set()
    return [s for s in texts if not (s in seen or seen.add(s))]


def not_nfc():
    """Strings NFC changes: decomposed accents, Hangul jamo, singletons, combining marks out of
    canonical order, composition exclusions, and the same next to added tokens."""
    return [
        "e\u0301", "Cafe\u0301 cre\u0300me bru\u0302le\u0301e", "A\u030a \u212b \u2126 \u212a",
        "\u1112\u1161\u11ab\u1100\u1173\u11af", "\u1100\u1161 \u1100\u1161\u11a8 \uac00\u11a8",
        "Tie\u0302\u0301ng Vie\u0323\u0302t", "a\u0302\u0323 a\u0323\u0302 \u1ead",
        "\u03b1\u0313\u0301 \u1f04", "\u0915\u093c \u0958", "o\u0308\u0304 \u022b",
        "\u0041\u0301\u0328", "n\u0303o\u0303", "\u00c5ngstro\u0308m \u212bngstr\u00f6m",
        "e\u0301<|im_end|>e\u0301", "<|im_start|>\u0301", "x\u0301\u0301\u0301 y",
        "\ufb01 \u2460 \uff21", "\u0300 leading combining", "1\u0301 2\u20dd",
        "\u05e9\u05c1\u05b8 \ufb2e", "\u0627\u0653 \u0622", "A\u0308\u0304 \u01de",
    ]


def case_ids(tok, texts):
    plain = Tokenizer.from_str(tok.to_str())
    plain.encode_special_tokens = True
    cases = []
    for text in texts:
        ids = tok.encode(text, add_special_tokens=False).ids
        case = {"text": text, "ids": ids}
        ids_plain = plain.encode(text, add_special_tokens=False).ids
        if ids_plain != ids:
            case["ids_plain"] = ids_plain
        decoded = tok.decode(ids, skip_special_tokens=False)
        if decoded != text:
            case["decoded"] = decoded
        decoded_plain = tok.decode(ids_plain, skip_special_tokens=False)
        if decoded_plain != text:
            case["decoded_plain"] = decoded_plain
        cases.append(case)
    return cases


def smollm2(out):
    model = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
    tok = AutoTokenizer.from_pretrained(os.path.dirname(model), gguf_file=os.path.basename(model))
    backend = Tokenizer.from_str(tok.backend_tokenizer.to_str())
    backend.pre_tokenizer = BASE.PRE_TOKENIZERS["smollm"]
    j = json.loads(backend.to_str())
    j["model"]["merges"] = [m if isinstance(m, str) else " ".join(m) for m in j["model"]["merges"]]
    write_json(os.path.join(out, "smollm2", "tokenizer.json"), j)
    write_json(os.path.join(out, "smollm2", "tokenizer_config.json"), {
        "add_bos_token": False,
        "bos_token": tok.bos_token,
        "eos_token": tok.eos_token,
        "pad_token": tok.pad_token,
        "unk_token": tok.unk_token,
        "chat_template": tok.chat_template,
        "tokenizer_class": "GPT2Tokenizer",
    }, indent=2)
    # The file as written must give the ids of ../smollm2.json.
    written = Tokenizer.from_file(os.path.join(out, "smollm2", "tokenizer.json"))
    with open(os.path.join(ROOT, "tests", "fixtures", "tokenizer", "smollm2.json"),
              encoding="utf-8") as f:
        reference = json.load(f)
    for case in reference["cases"]:
        assert written.encode(case["text"], add_special_tokens=False).ids == case["ids"], \
            repr(case["text"])


def main():
    out = os.path.join(ROOT, "tests", "fixtures", "tokenizer", "hf_json")
    text = training_text()
    print("training text: %d bytes" % sum(len(s.encode("utf-8")) + 1 for s in text))
    texts = corpus()

    configs = {
        "llama3": dict(
            pre=pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(BASE.LLAMA3_SPLIT), behavior="isolated", invert=False),
                byte_level(False)]),
            ignore_merges=True, specials=LLAMA3_SPECIALS, user=[], string_merges=False,
            config={"add_bos_token": None,  # left out: the post-processor adds bos
                    "bos_token": {"__type": "AddedToken", "content": "<|begin_of_text|>",
                                  "lstrip": False, "normalized": False, "rstrip": False,
                                  "single_word": False},
                    "eos_token": "<|eot_id|>", "chat_template": LLAMA3_TEMPLATE}),
        "qwen2": dict(
            pre=pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(BASE.QWEN2_SPLIT), behavior="isolated", invert=False),
                byte_level(False)]),
            ignore_merges=False, specials=QWEN2_SPECIALS, user=[], string_merges=True,
            normalizer=normalizers.NFC(),
            config={"add_bos_token": False, "bos_token": None, "eos_token": "<|im_end|>",
                    "pad_token": "<|endoftext|>", "chat_template": CHATML_TEMPLATE}),
        "gpt2": dict(
            pre=byte_level(True), ignore_merges=False, specials=GPT2_SPECIALS,
            user=GPT2_USER_TOKENS, string_merges=False,
            config={"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
                    "unk_token": "<|endoftext|>"}),
    }
    all_cases = {}
    for name, c in configs.items():
        tok = train(c["pre"], c["ignore_merges"], c["specials"], c["user"], 1200, text,
                    c.get("normalizer"))
        j = finish_json(tok, c["ignore_merges"], c["string_merges"])
        if name == "llama3":
            j["post_processor"] = json.loads(processors.TemplateProcessing(
                single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                special_tokens=[("<|begin_of_text|>", tok.token_to_id("<|begin_of_text|>"))]
            ).__getstate__())
        path = os.path.join(out, name, "tokenizer.json")
        write_json(path, j, indent=1)
        config = {k: v for k, v in c["config"].items() if v is not None or k == "bos_token"}
        write_json(os.path.join(out, name, "tokenizer_config.json"), config, indent=2)
        written = Tokenizer.from_file(path)
        cases = case_ids(written, texts)
        # Only a normalizer may change the text on the way back.
        assert all(c.get("decoded", c["text"]) == c["text"] for c in cases) or \
            j["normalizer"] is not None, name
        all_cases[name] = {"vocab_size": written.get_vocab_size(with_added_tokens=True),
                           "cases": cases}
    import tokenizers
    write_json(os.path.join(out, "cases.json"),
               {"source": "tokenizers %s encode(add_special_tokens=False)" % tokenizers.__version__,
                "tokenizers": all_cases})
    smollm2(out)


if __name__ == "__main__":
    main()
